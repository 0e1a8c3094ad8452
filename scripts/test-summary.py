#!/usr/bin/env python3
"""The end of `make test`: which tests did not run, and why.

Lists the tests that skipped at run time (the lines `name<TAB>why` that the tests'
harness::skip appended to SKIP_LOG, the file `make test` named in CONLOCK_SKIP_LOG) and
the #[ignore]d ones (from `cargo test --all-targets -- --list --ignored`, each with the
reason its `#[ignore = "..."]` gives). Only root-only tests and the etcd tests (where
etcd is not installed) skip at run time, and CI (CI=true) runs as root with etcd
installed (.ci/run): there any such skip fails the run.

Usage: CARGO=cargo test-summary.py SKIP_LOG
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_time_skips(log):
    """{name: [why, ...]} in the order first seen (a test may skip in several runs)."""
    skips = {}
    try:
        text = Path(log).read_text(errors="replace")
    except FileNotFoundError:
        return skips
    for line in text.splitlines():
        name, _, why = line.partition("\t")
        if not name:
            continue
        reasons = skips.setdefault(name, [])
        if why not in reasons:
            reasons.append(why)
    return skips


def ignored_tests():
    """The names of the #[ignore]d tests of every target, as cargo lists them."""
    cargo = shlex.split(os.environ.get("CARGO") or "cargo")
    cmd = cargo + ["test", "--all-targets", "--", "--list", "--ignored"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(
            f"test-summary: `{' '.join(cmd)}` failed ({out.returncode}); "
            f"it must build the tests to list the ignored ones:\n{out.stderr}"
        )
    names = []
    for line in out.stdout.splitlines():
        if line.endswith(": test"):
            name = line[: -len(": test")]
            if name not in names:
                names.append(name)
    return names


IGNORE = re.compile(r'#\[ignore(?:\s*=\s*"((?:[^"\\]|\\.)*)")?\s*\]')
FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


def ignore_reasons():
    """{function name: reason} from every #[ignore] in src/ and tests/."""
    reasons = {}
    for path in sorted(list(ROOT.glob("src/**/*.rs")) + list(ROOT.glob("tests/**/*.rs"))):
        text = path.read_text(errors="replace")
        for m in IGNORE.finditer(text):
            f = FN.search(text, m.end())
            if f:
                why = m.group(1)
                reasons[f.group(1)] = (
                    re.sub(r"\\(.)", r"\1", why) if why else "#[ignore] without a reason"
                )
    return reasons


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: CARGO=cargo test-summary.py SKIP_LOG")
    skips = run_time_skips(sys.argv[1])
    ignored = ignored_tests()
    reasons = ignore_reasons()
    total = len(skips) + len(ignored)
    print(f"skipped: {total} test{'' if total == 1 else 's'}")
    if skips:
        print(f"  at run time ({len(skips)}):")
        for name in sorted(skips):
            print(f"    {name}: {'; '.join(skips[name])}")
    if ignored:
        print(f"  #[ignore]d ({len(ignored)}; cargo test -- --ignored NAME runs one):")
        for name in sorted(ignored):
            why = reasons.get(name.rsplit("::", 1)[-1], "#[ignore]")
            print(f"    {name}: {why}")
    if skips and os.environ.get("CI", "").lower() in ("true", "1"):
        print(
            f"test-summary: CI is set and {len(skips)} "
            f"test{'' if len(skips) == 1 else 's'} skipped at run time: CI runs as root "
            "with etcd installed (.ci/run) and must run every one (see the reasons above)"
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
