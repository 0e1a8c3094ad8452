# conlock: `make demo` shows it working, `make test` runs every check.
CARGO ?= cargo
# Where cargo puts its output (it honours CARGO_TARGET_DIR, so do we).
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
DEBUG_BIN := $(TARGET_DIR)/debug/conlock
# The host's musl twin (x86_64-unknown-linux-gnu -> x86_64-unknown-linux-musl).
HOST_TRIPLE := $(shell rustc -vV 2>/dev/null | sed -n 's/^host: //p')
MUSL_TARGET := $(patsubst %-gnu,%-musl,$(or $(HOST_TRIPLE),x86_64-unknown-linux-gnu))
RUSTUP_TARGETS := $(shell rustup target list --installed 2>/dev/null)
# The release build (what `make install`, `make deb` and `make bench` use) is a static musl
# binary where that Rust target is installed: it starts about 0.5 ms sooner per run (no
# dynamic loader, no glibc start-up probing the CPU, which is slow on a VM) and runs on any
# Linux of its architecture. Elsewhere it is the glibc build. `make RELEASE_TARGET=` forces
# glibc. Without rustup (`sudo make install` resets PATH and HOME) the last build's choice,
# kept in RELEASE_STAMP, stands, so that install takes the binary `make` built.
RELEASE_STAMP := $(TARGET_DIR)/release-target
RELEASE_TARGET_ORIGIN := $(origin RELEASE_TARGET)
ifeq ($(RELEASE_TARGET_ORIGIN),undefined)
  ifneq ($(RUSTUP_TARGETS),)
    RELEASE_TARGET := $(filter $(MUSL_TARGET),$(RUSTUP_TARGETS))
  else
    RELEASE_TARGET := $(shell cat $(RELEASE_STAMP) 2>/dev/null)
  endif
endif
RELEASE_BIN := $(TARGET_DIR)/$(if $(RELEASE_TARGET),$(RELEASE_TARGET)/)release/conlock
# ring's few C files need a C compiler for the target; the host's cc builds them for musl
# too (they need only a few standard prototypes), so Debian's musl-tools are not needed.
# A CC_<target> of the caller's wins.
MUSL_CC = CC_$(subst -,_,$(1))="$${CC_$(subst -,_,$(1)):-cc}"
CARGO_RELEASE := $(if $(filter %-musl,$(RELEASE_TARGET)),$(call MUSL_CC,$(RELEASE_TARGET))) \
	$(CARGO) build --release $(if $(RELEASE_TARGET),--target $(RELEASE_TARGET))
RELEASE_KIND := $(if $(filter %-musl,$(RELEASE_TARGET)),static musl,glibc)
BIN := $(RELEASE_BIN)
# Where `make test` collects the tests that skipped at run time (harness::skip).
SKIP_LOG := $(abspath $(TARGET_DIR))/test-skips.log
SOURCES := Cargo.toml Cargo.lock build.rs $(shell find src -name '*.rs')

# Install locations, GNU style: `make install PREFIX=/usr DESTDIR=/tmp/stage`.
PREFIX ?= /usr/local
prefix ?= $(PREFIX)
exec_prefix ?= $(prefix)
bindir ?= $(exec_prefix)/bin
datarootdir ?= $(prefix)/share
mandir ?= $(datarootdir)/man
man1dir ?= $(mandir)/man1
bashcompdir ?= $(datarootdir)/bash-completion/completions
zshcompdir ?= $(datarootdir)/zsh/site-functions
fishcompdir ?= $(datarootdir)/fish/vendor_completions.d
docdir ?= $(datarootdir)/doc/conlock
INSTALL ?= install
INSTALL_PROGRAM ?= $(INSTALL) -m 755
INSTALL_DATA ?= $(INSTALL) -m 644
MANPAGES := $(sort $(wildcard docs/*.1))
# README.md and every file its links reach, installed in the same layout (as the .deb does)
# so that the links work and the paths the man pages name exist.
DOCS = $(shell bash scripts/doc-files.sh)

# cargo-deb is installed from crates.io at this version if `cargo deb` is missing.
CARGO_DEB_VERSION := 3.8.0
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
DEB_ARCH := $(shell dpkg --print-architecture 2>/dev/null || echo amd64)
DEB := $(TARGET_DIR)/debian/conlock_$(VERSION)-1_$(DEB_ARCH).deb

.PHONY: all build release demo test test-release test-real fmt-check lint musl-check unit completions completions-check \
	selfcontained-check layers-check install uninstall install-check deb deb-check units-check \
	bench bench-run soak clean

## `make && sudo make install`: the default target builds what `make install` installs.
all: $(RELEASE_BIN)

## The debug build (what `make demo` and the tests use).
build:
	$(CARGO) build

release:
	$(CARGO_RELEASE)
	@echo '$(RELEASE_TARGET)' > $(RELEASE_STAMP)
	@echo "release build: $(RELEASE_BIN) ($(RELEASE_KIND))"

# Only rebuilt when a source is newer, so `sudo make install` after `make` does not run
# cargo as root; touched because cargo leaves an up-to-date binary alone.
$(RELEASE_BIN): $(SOURCES)
	$(CARGO_RELEASE)
	@echo '$(RELEASE_TARGET)' > $(RELEASE_STAMP)
	@touch $@
	@echo "release build: $@ ($(RELEASE_KIND))"

## Two jobs contend for one lock, then four for a 2-slot semaphore, on an embedded dev server.
## Uses the debug build (no LTO) that `make test` reuses, so a fresh clone gets there fast.
demo: build
	bash scripts/demo.sh $(DEBUG_BIN)

## Every check CI runs: formatting, lints, the musl build, completions/man drift, unit and
## integration tests (also against the release build), install layout, the Debian
## package's contents and the systemd units. The full test run comes last, then the list
## of the tests that did not run, with why (scripts/test-summary.py): those that skipped
## at run time (root-only tests as another user, etcd tests without etcd; each adds a
## line to SKIP_LOG) and the #[ignore]d ones. With CI=true (CI runs as root and .ci/run
## installs etcd) a run-time skip fails the run.
test: fmt-check lint layers-check completions-check selfcontained-check musl-check
	@mkdir -p $(TARGET_DIR) && : > $(SKIP_LOG)
	CONLOCK_SKIP_LOG=$(SKIP_LOG) $(MAKE) --no-print-directory units-check install-check \
		deb-check test-release
	CONLOCK_SKIP_LOG=$(SKIP_LOG) $(CARGO) test --all-targets; status=$$?; \
		CARGO='$(CARGO)' python3 scripts/test-summary.py $(SKIP_LOG) || status=1; \
		exit $$status

## The integration tests that run the binary, against the release build that `make install`
## and `make deb` ship (with panic=abort, and where it is the static musl build, another libc
## and allocator than the debug build the full run below uses). Skipped: the modules that
## only test the client and the dev server in-process.
test-release: $(RELEASE_BIN)
	@echo "test-release: the binary-facing tests against $(RELEASE_BIN) ($(RELEASE_KIND))"
	CONLOCK_TEST_BIN=$(abspath $(RELEASE_BIN)) $(CARGO) test --test it -- \
		--skip client:: --skip devserver:: --skip devserver_faults:: --skip prop:: --skip schema::

## The tests against a real Consul agent (not in `make test`: CI has no consul binary):
## `make test-real CONSUL_BIN=/path/to/consul` (scripts/build-consul.sh builds one from a
## source tree). The tests start their own agents on loopback, with explicit ports, and
## use the same binary's `consul lock`.
test-real:
	@bin=$$(command -v -- '$(CONSUL_BIN)' 2>/dev/null || true); \
	if [ -z '$(CONSUL_BIN)' ]; then \
		echo "test-real: no Consul agent given: make test-real CONSUL_BIN=/path/to/consul"; exit 2; \
	elif [ -z "$$bin" ] || [ ! -f "$$bin" ] || [ ! -x "$$bin" ]; then \
		echo "test-real: CONSUL_BIN=$(CONSUL_BIN) is not an executable file"; exit 2; \
	fi; \
	case "$$bin" in /*) ;; *) bin="$$PWD/$$bin" ;; esac; \
	echo "test-real: $$("$$bin" version | head -n1) ($$bin)"; \
	CONLOCK_REAL_CONSUL="$$bin" $(CARGO) test --test it -- --ignored real:: real_cluster::

fmt-check:
	$(CARGO) fmt --all -- --check

lint:
	$(CARGO) clippy --all-targets -- -D warnings

## The musl build (libc's types differ, and only it uses dlmalloc) compiles without
## warnings. Skipped, with a line saying so, where that target is not installed.
musl-check:
	@if [ -n "$(filter $(MUSL_TARGET),$(RUSTUP_TARGETS))" ]; then \
		$(call MUSL_CC,$(MUSL_TARGET)) RUSTFLAGS="-D warnings" \
			$(CARGO) check --target $(MUSL_TARGET) --lib --bins && \
		echo "musl-check: $(MUSL_TARGET) compiles without warnings"; \
	else echo "musl-check: the $(MUSL_TARGET) target is not installed; skipped"; fi

## Regenerate completions/ and docs/*.1 from the clap definitions.
completions: build
	bash scripts/completions.sh $(DEBUG_BIN) write

completions-check: build
	bash scripts/completions.sh $(DEBUG_BIN) check

## Dependencies between top-level modules point one way (docs/architecture.md).
layers-check:
	python3 scripts/check-layers.py

## A clone has nothing beside it: no file may point outside the repository.
selfcontained-check:
	bash scripts/check-selfcontained.sh

## Binary, man pages, bash/zsh/fish completions and the documentation (share/doc/conlock)
## under $(DESTDIR)$(PREFIX), as the .deb lays them out under /usr.
install: $(RELEASE_BIN)
	@[ -n '$(DOCS)' ] || { echo "install: scripts/doc-files.sh listed no documentation"; exit 1; }
	$(INSTALL) -d $(DESTDIR)$(bindir) $(DESTDIR)$(man1dir) $(DESTDIR)$(bashcompdir) \
		$(DESTDIR)$(zshcompdir) $(DESTDIR)$(fishcompdir) \
		$(addprefix $(DESTDIR)$(docdir)/,$(sort $(dir $(DOCS))))
	$(INSTALL_PROGRAM) $(RELEASE_BIN) $(DESTDIR)$(bindir)/conlock
	$(INSTALL_DATA) $(MANPAGES) $(DESTDIR)$(man1dir)/
	$(INSTALL_DATA) completions/conlock.bash $(DESTDIR)$(bashcompdir)/conlock
	$(INSTALL_DATA) completions/_conlock $(DESTDIR)$(zshcompdir)/_conlock
	$(INSTALL_DATA) completions/conlock.fish $(DESTDIR)$(fishcompdir)/conlock.fish
	$(foreach f,$(DOCS),$(INSTALL_DATA) $(f) $(DESTDIR)$(docdir)/$(f) &&) true

## Removes exactly what `make install` put there (same PREFIX and DESTDIR).
uninstall:
	rm -f $(DESTDIR)$(bindir)/conlock \
		$(addprefix $(DESTDIR)$(man1dir)/,$(notdir $(MANPAGES))) \
		$(DESTDIR)$(bashcompdir)/conlock \
		$(DESTDIR)$(zshcompdir)/_conlock \
		$(DESTDIR)$(fishcompdir)/conlock.fish \
		$(addprefix $(DESTDIR)$(docdir)/,$(DOCS))

install-check: $(RELEASE_BIN)
	bash scripts/check-install.sh

## A .deb (cargo-deb, metadata in Cargo.toml) with the binary, man pages, completions,
## the documentation (as `make install`), the license and Debian's changelog.
deb: $(RELEASE_BIN)
	@$(CARGO) deb --version >/dev/null 2>&1 || { \
		echo "cargo-deb not found: installing cargo-deb $(CARGO_DEB_VERSION) from crates.io"; \
		$(CARGO) install --locked --version $(CARGO_DEB_VERSION) cargo-deb; }
	$(CARGO) deb --no-build --output $(DEB) $(if $(RELEASE_TARGET),--target $(RELEASE_TARGET)) \
		$(if $(filter %-musl,$(RELEASE_TARGET)),--variant static)

deb-check: deb
	bash scripts/check-deb.sh $(DEB) $(RELEASE_BIN) $(if $(filter %-musl,$(RELEASE_TARGET)),static,dynamic)

## systemd-analyze verify on contrib/systemd/ (when it runs here) plus a parse of the keys.
units-check: build
	python3 scripts/check-units.py $(DEBUG_BIN)

## Performance targets (not part of `make test`): a PASS or MISS per target, exit 1 on a
## miss; writes bench/results.json. They were set for the static musl build: where rustup
## lacks that target, this adds it (as `make deb` installs cargo-deb) and measures glibc
## only if it cannot (3.85 ms in row 1, against 2.8-3.6 ms for the static build).
## `make bench CONSUL_BIN=/path/to/consul` measures against a real `consul agent -dev` it
## starts on loopback, beside that binary's `consul lock` (bench/results-consul.json).
## `make bench ETCD_BIN=/usr/bin/etcd` adds rows 12-14: a single-member etcd it starts on
## loopback (data on /dev/shm), conlock --backend etcd beside `etcdctl lock`.
bench:
	@if [ '$(RELEASE_TARGET_ORIGIN)' = undefined ] && [ -n '$(RUSTUP_TARGETS)' ] \
		&& [ -z '$(RELEASE_TARGET)' ]; then \
		echo "bench: adding the $(MUSL_TARGET) Rust target for the static release build"; \
		rustup target add $(MUSL_TARGET) \
			|| echo "bench: could not add $(MUSL_TARGET); measuring the glibc build"; \
	fi
	@$(MAKE) --no-print-directory bench-run

bench-run: release
	python3 bench/bench.py --bin $(BIN) $(if $(CONSUL_BIN),--consul-bin $(CONSUL_BIN)) $(if $(ETCD_BIN),--etcd-bin $(ETCD_BIN)) $(BENCH_ARGS)

## About 5 minutes of contention with random kills; reports leaks and overlaps.
soak: release
	python3 bench/soak.py --bin $(BIN) $(SOAK_ARGS)

clean:
	$(CARGO) clean
