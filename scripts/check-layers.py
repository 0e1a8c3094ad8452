#!/usr/bin/env python3
"""Checks the layering of src/ (docs/architecture.md): no dependency cycle among the
top-level modules, clap only in cli and app, the declared layers respected, the store
seam (only claim, app and error name consul or etcd), and no dependency cycle among the
files of one folder (src/hold/, src/claim/, ...).

A dependency is any `crate::<module>` path (`crate::{a, b::c}` included) outside
comments and `#[cfg(test)]` blocks (unit tests may reach anywhere). Inside a folder, a file depends on a sibling it names
as `super::<file>` or `crate::<folder>::<file>`, and on the folder's mod.rs when it
uses anything else of `super::` (mod.rs declares the files, so that is a cycle); mod.rs
depends on the files whose `<file>::` paths it uses. Prints the graphs with -v. Exit 1
with one line per violation."""

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
    "etcd": 1,  # the second store client, beside consul (neither uses the other)
    "devserver": 1,
    "error": 1.5,  # wraps consul's error type; everything above consul may use it
    "events": 0.2,
    "ui": 0,
    "clock": 0,
    "duration": 0.1,
    "gostd": 0,
    "readfile": 0,
    "resolve": 0,
}
# Same-rank edges that are allowed (operator commands may use supervision helpers).
ALLOWED_SIDEWAYS = {("ops", "hold")}
# cli is the top of the tree but app uses its types: the one upward edge by design.
ALLOWED_UPWARD = {("app", "cli")}
CLAP_USERS = {"cli", "app"}
# The store seam: above the store clients only the claims (which implement the store
# handle, `claim::Store`), app (which builds it from the flags) and error (which wraps
# their errors) may name a store client or its wire types; hold and ops (the guardian
# included) see only `claim::Store` and neutral data.
BACKENDS = {"consul", "etcd"}
BACKEND_USERS = {"claim", "app", "error"}


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


def code_of(f: Path) -> str:
    # Comments (docs included) name modules without using them.
    return re.sub(r"//.*", "", strip_tests(f.read_text()))


def without_inline_mods(text: str) -> str:
    # Inside `mod name { ... }`, `super::` is the file itself: drop those bodies.
    out, i = [], 0
    for m in re.finditer(r"\bmod\s+[a-z_][a-z0-9_]*\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth = 0
        for k in range(m.end() - 1, len(text)):
            if text[k] == "{":
                depth += 1
            elif text[k] == "}":
                depth -= 1
                if depth == 0:
                    i = k + 1
                    break
        else:
            return "".join(out)
    out.append(text[i:])
    return "".join(out)


def super_names(text: str) -> set[str]:
    """The first name of each path that starts with `super::`, braces included:
    `super::{a, b::c}` gives a and b."""
    names = set()
    for m in re.finditer(r"\bsuper::", text):
        rest = text[m.end():]
        if rest.startswith("{"):
            depth, item, items = 0, "", []
            for ch in rest:
                if ch == "{":
                    depth += 1
                    if depth == 1:
                        continue
                elif ch == "}":
                    depth -= 1
                    if depth == 0:
                        items.append(item)
                        break
                if depth == 1 and ch == ",":
                    items.append(item)
                    item = ""
                else:
                    item += ch
            for it in items:
                n = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*|\*)", it)
                if n:
                    names.add(n.group(1))
        else:
            n = re.match(r"([A-Za-z_][A-Za-z0-9_]*|\*)", rest)
            if n:
                names.add(n.group(1))
    return names


def folder_graphs() -> dict[str, dict[str, set[str]]]:
    """For each folder of src/ with a mod.rs: file -> the files of that folder it uses."""
    graphs = {}
    for mod_rs in sorted(SRC.rglob("mod.rs")):
        folder = mod_rs.parent
        crate_path = "::".join(folder.relative_to(SRC).parts)
        files = {f.stem: f for f in sorted(folder.glob("*.rs"))}
        graph: dict[str, set[str]] = {name: set() for name in files}
        for name, f in files.items():
            text = code_of(f)
            deps = set(re.findall(rf"\bcrate::{crate_path}::([a-z_]+)", text))
            if name == "mod":
                # Its `pub use` lines only name what the folder offers: not a use.
                own = re.sub(r"\bpub use [^;]*;", "", text)
                deps |= {m for m in files if re.search(rf"(?<![\w:]){m}::", own)}
            else:
                for n in super_names(without_inline_mods(text)):
                    deps.add(n if n in files else "mod")
            graph[name] = {d for d in deps if d in files and d != name}
        graphs[str(folder.relative_to(SRC.parent))] = graph
    return graphs


def cycles(graph: dict[str, set[str]]) -> list[str]:
    found = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                found.append(" -> ".join(stack[stack.index(m):] + [m]))
            elif m in graph and state.get(m) is None:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if state.get(n) is None:
            visit(n)
    return found


def crate_names(text: str) -> set[str]:
    """The top-level modules named by `crate::` paths, braces included:
    `crate::{consul::Client, ui}` gives consul and ui."""
    names = set()
    for m in re.finditer(r"\bcrate::", text):
        rest = text[m.end():]
        if rest.startswith("{"):
            depth, item = 0, ""
            for ch in rest:
                if ch == "{":
                    depth += 1
                    if depth == 1:
                        continue
                elif ch == "}":
                    depth -= 1
                    if depth == 0:
                        names.update(re.findall(r"^\s*([a-z_][a-z0-9_]*)", item))
                        break
                if depth == 1 and ch == ",":
                    names.update(re.findall(r"^\s*([a-z_][a-z0-9_]*)", item))
                    item = ""
                else:
                    item += ch
        else:
            n = re.match(r"([a-z_][a-z0-9_]*)", rest)
            if n:
                names.add(n.group(1))
    return names


def top_module(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".rs")


def main() -> int:
    verbose = "-v" in sys.argv
    graph: dict[str, set[str]] = {}
    clap: dict[str, list[str]] = {}
    backend_users: dict[tuple[str, str], list[str]] = {}
    for f in sorted(SRC.rglob("*.rs")):
        top = top_module(f)
        if top in ("lib", "main"):
            continue
        text = code_of(f)
        deps = crate_names(text) - {top}
        graph.setdefault(top, set()).update(deps)
        for b in sorted(deps & BACKENDS):
            backend_users.setdefault((top, b), []).append(str(f.relative_to(SRC.parent)))
        if re.search(r"\bclap(_complete|_mangen)?::", text) or "crate::cli" in text:
            clap.setdefault(top, []).append(str(f.relative_to(SRC.parent)))
    problems = []
    for top in graph:
        if top not in RANK:
            problems.append(f"src/{top}: not placed in a layer (add it to RANK in {Path(__file__).name})")
    for top, files in clap.items():
        if top not in CLAP_USERS:
            problems.append(f"{top} uses clap or cli types ({', '.join(files)}): only cli and app may")
    for (a, b), files in sorted(backend_users.items()):
        if a not in BACKEND_USERS and a not in BACKENDS:
            problems.append(
                f"{a} uses {b} ({', '.join(files)}): above the store seam only"
                f" {', '.join(sorted(BACKEND_USERS))} may name a store client or its wire"
                " types; go through claim::Store and the claim layer's neutral data"
            )
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
    problems += ["cycle: " + c for c in cycles(graph)]
    folders = folder_graphs()
    for folder, fgraph in folders.items():
        problems += [f"cycle in {folder}/: {c}" for c in cycles(fgraph)]
    if verbose:
        for a in sorted(graph):
            print(f"{a} -> {', '.join(sorted(graph[a])) or '-'}")
        for folder, fgraph in folders.items():
            for a in sorted(fgraph):
                print(f"{folder}/{a}.rs -> {', '.join(sorted(fgraph[a])) or '-'}")
    for p in problems:
        print(f"layers: {p}")
    if problems:
        return 1
    print(
        f"layers: {len(graph)} top-level modules, dependencies point one way, no cycle,"
        f" store clients named only by {', '.join(sorted(BACKEND_USERS))};"
        f" no cycle among the files of {len(folders)} folders"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
