#!/usr/bin/env python3
"""Checks the layering of src/ (docs/architecture.md): no dependency cycle among the
top-level modules, clap only in cli and app, and the declared layers respected.

A dependency is any `crate::<module>` path outside comments and `#[cfg(test)]` blocks
(unit tests may reach anywhere). Prints the graph with -v. Exit 1 with one line per violation."""

import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

# Each module may use only modules of a lower rank (leaves have rank 0). devserver may
# use leaves only.
RANK = {
    "cli": 5,
    "app": 4,
    "ops": 3,
    "hold": 3,
    "claim": 2,
    "consul": 1,
    "devserver": 1,
    "error": 1.5,  # wraps consul's error type; everything above consul may use it
    "events": 0.2,
    "ui": 0,
    "clock": 0,
    "duration": 0.1,
    "gostd": 0,
    "readfile": 0,
}
# Same-rank edges that are allowed (operator commands may use supervision helpers).
ALLOWED_SIDEWAYS = {("ops", "hold")}
# cli is the top of the tree but app uses its types: the one upward edge by design.
ALLOWED_UPWARD = {("app", "cli")}
CLAP_USERS = {"cli", "app"}


def strip_tests(text: str) -> str:
    # Drop `#[cfg(test)]` items: from the attribute to the end of the brace block after it.
    out, i = [], 0
    while True:
        j = text.find("#[cfg(test)]", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        k = text.find("{", j)
        if k < 0:
            return "".join(out)
        depth = 0
        for m in range(k, len(text)):
            if text[m] == "{":
                depth += 1
            elif text[m] == "}":
                depth -= 1
                if depth == 0:
                    i = m + 1
                    break
        else:
            return "".join(out)


def top_module(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".rs")


def main() -> int:
    verbose = "-v" in sys.argv
    graph: dict[str, set[str]] = {}
    clap: dict[str, list[str]] = {}
    for f in sorted(SRC.rglob("*.rs")):
        top = top_module(f)
        if top in ("lib", "main"):
            continue
        # Comments (docs included) name modules without using them.
        text = re.sub(r"//.*", "", strip_tests(f.read_text()))
        deps = set(re.findall(r"\bcrate::([a-z_]+)", text)) - {top}
        graph.setdefault(top, set()).update(deps)
        if re.search(r"\bclap(_complete|_mangen)?::", text) or "crate::cli" in text:
            clap.setdefault(top, []).append(str(f.relative_to(SRC.parent)))
    problems = []
    for top in graph:
        if top not in RANK:
            problems.append(f"src/{top}: not placed in a layer (add it to RANK in {Path(__file__).name})")
    for top, files in clap.items():
        if top not in CLAP_USERS:
            problems.append(f"{top} uses clap or cli types ({', '.join(files)}): only cli and app may")
    for a, deps in graph.items():
        for b in deps:
            if a not in RANK or b not in RANK:
                continue
            if (a, b) in ALLOWED_SIDEWAYS or (a, b) in ALLOWED_UPWARD:
                continue
            if a == "devserver" and RANK[b] > 0.2:
                problems.append(f"devserver uses {b}: it must stand apart (leaves only)")
            elif RANK[b] >= RANK[a]:
                problems.append(f"{a} (layer {RANK[a]}) uses {b} (layer {RANK[b]}): dependencies must point down")
    # Cycles, whatever the ranks say.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                cyc = stack[stack.index(m):] + [m]
                problems.append("cycle: " + " -> ".join(cyc))
            elif m in graph and state.get(m) is None:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if state.get(n) is None:
            visit(n)
    if verbose:
        for a in sorted(graph):
            print(f"{a} -> {', '.join(sorted(graph[a])) or '-'}")
    for p in problems:
        print(f"layers: {p}")
    if problems:
        return 1
    print(f"layers: {len(graph)} top-level modules, dependencies point one way, no cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
