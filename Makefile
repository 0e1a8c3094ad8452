# conlock: `make demo` shows it working, `make test` runs every check.
CARGO ?= cargo
BIN := target/release/conlock

.PHONY: all build release demo test fmt-check lint unit completions completions-check bench soak clean

all: build

build:
	$(CARGO) build

release:
	$(CARGO) build --release

## Two jobs contend for one lock, then four for a 2-slot semaphore, on an embedded dev server.
demo: release
	bash scripts/demo.sh $(BIN)

## Every check CI runs: formatting, lints, completions/man drift, unit and integration tests.
test: fmt-check lint completions-check
	$(CARGO) test --all-targets

fmt-check:
	$(CARGO) fmt --all -- --check

lint:
	$(CARGO) clippy --all-targets -- -D warnings

## Regenerate completions/ and docs/conlock.1 from the clap definitions.
completions: build
	bash scripts/completions.sh target/debug/conlock write

completions-check: build
	bash scripts/completions.sh target/debug/conlock check

## Performance targets (not part of `make test`); writes bench/results.json.
bench: release
	python3 bench/bench.py --bin $(BIN) $(BENCH_ARGS)

## About 5 minutes of contention with random kills; reports leaks and overlaps.
soak: release
	python3 bench/soak.py --bin $(BIN) $(SOAK_ARGS)

clean:
	$(CARGO) clean
