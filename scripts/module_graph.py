#!/usr/bin/env python3
"""The import graph between the top-level modules of a crate's src/, and its cycles.

    scripts/module_graph.py [SRC_DIR...] [--edges] [--check]

Counts every `crate::<module>` path (in `use` lines and inline) from a file of one top-level
module to another, and prints the strongly connected components with more than one module (a
cycle: each of those modules reaches every other). `--edges` also lists each arrow inside a
cycle with its reference count, which is where to cut. Issue 21 tracks this number going down;
the crates' layers themselves are checked by scripts/check_layers.sh, which also runs this with
`--check` (exit status 1 when any given src/ has a cycle) over the service's crates.
"""
import re
import sys
from collections import defaultdict
from pathlib import Path

REF = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
# `use crate::{a, b::c}` groups.
GROUP = re.compile(r"\buse\s+crate::\{([^;]*)\};", re.S)


def top_module(src: Path, file: Path) -> str:
    rel = file.relative_to(src).parts
    name = rel[0]
    return name[:-3] if name.endswith(".rs") else name


def graph(src: Path):
    modules = {top_module(src, f) for f in src.rglob("*.rs")} - {"lib", "main"}
    edges = defaultdict(int)
    for f in src.rglob("*.rs"):
        me = top_module(src, f)
        text = f.read_text()
        # Unit tests may reach anywhere; the architecture is about the code they test.
        cut = text.find("#[cfg(test)]")
        if cut >= 0:
            text = text[:cut]
        # Comments (doc links included) are not imports.
        text = re.sub(r"//[^\n]*", "", text)
        targets = REF.findall(text)
        for group in GROUP.findall(text):
            targets += re.findall(r"(?:^|,)\s*([a-z_][a-z0-9_]*)", group)
        for t in targets:
            if t in modules and t != me:
                edges[(me, t)] += 1
    return modules, edges


def sccs(nodes, edges):
    adj = defaultdict(list)
    for (a, b) in edges:
        adj[a].append(b)
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    failed = False
    for src in map(Path, args or ["orchestrator/src"]):
        modules, edges = graph(src)
        cycles = sccs(modules, edges)
        print(f"{src}: {len(modules)} top-level modules, {len(edges)} arrows between them")
        if not cycles:
            print("  no cycle")
        for comp in cycles:
            failed = True
            inside = {(a, b): n for (a, b), n in edges.items() if a in comp and b in comp}
            print(f"  cycle of {len(comp)} modules ({len(inside)} arrows): {', '.join(comp)}")
            if "--edges" in sys.argv:
                for (a, b), n in sorted(inside.items()):
                    print(f"    {a} -> {b}  ({n})")
    if failed and "--check" in sys.argv:
        sys.exit(1)


if __name__ == "__main__":
    main()
