#!/usr/bin/env python3
"""The import graph inside a crate's src/, between its files, and its circles.

    scripts/module_graph.py [SRC_DIR...] [--edges] [--check] [--top]

Each .rs file is one module (`a/b.rs` and `a/b/mod.rs` are `a::b`; `lib.rs`/`main.rs` the root).
An arrow A -> B is a path in A's code that names B or an item of B: `crate::...`, `super::...`,
`self::...`, or a child module's name, in `use` lines (groups included) and inline. A path is
followed through re-exports (`pub use x::Y` in a module hands Y on; the arrow goes to the file
that defines Y, and a re-export itself is no arrow), so a facade module does not tie its parts
together. An arrow from a file to one of its own ancestors (a child using what its parent module
defines, `super::Step`) is not counted: the parent is the folder the child belongs to. Comments,
string and char literals and the `#[cfg(test)] mod` of unit tests are not read.

Prints each circle (a strongly connected set of more than one file: each reaches every other);
`--edges` lists the arrows inside it with the names they carry, which is where to cut; `--top`
measures the same between top-level modules only (a file-level graph without circles can still
have two top-level modules that use each other through different files). `--check` exits 1 on
any circle. scripts/check_layers.sh runs it with `--check` (both levels) over the service's crates.
"""
import re
import sys
from collections import defaultdict
from pathlib import Path

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
PATH = re.compile(rf"(?<![:\w])((?:{IDENT}::)+{IDENT})")
USE = re.compile(r"(\bpub(?:\([a-z ]+\))?\s+)?\buse\s+([^;]*);")
TEST_MODULE = re.compile(r"#\[cfg\(test\)\]\s*(?:pub\s+)?mod\s")
OUTSIDE = ("<another crate>",)
CHAR = re.compile(r"'(\\.[^']*|[^'\\])'")
RAW = re.compile(r'r(#*)"')


def module_of(src: Path, file: Path) -> tuple:
    parts = list(file.relative_to(src).parts)
    last = parts.pop()[:-3]
    if last == "mod" or (not parts and last in ("lib", "main")):
        return tuple(parts)
    return tuple(parts + [last])


def code_of(text: str) -> str:
    """The code without comments, string and char literals, and the unit-test module."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and RAW.match(text, i) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = RAW.match(text, i).group(1)
            j = text.find('"' + hashes, i + len(hashes) + 2)
            out.append('""')
            i = n if j < 0 else j + 1 + len(hashes)
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""')
            i = j + 1
        elif c == "'" and CHAR.match(text, i):
            out.append("' '")
            i = CHAR.match(text, i).end()
        else:
            out.append(c)
            i += 1
    code = "".join(out)
    m = TEST_MODULE.search(code)
    return code[: m.start()] if m else code


def use_paths(tree: str) -> list:
    """`a::{b, c::{d, e as f}}` as [[a, b], [a, c, d], [a, c, e]]."""
    paths = []

    def split(s):
        depth, cur, items = 0, "", []
        for ch in s:
            depth += (ch == "{") - (ch == "}")
            if ch == "," and depth == 0:
                items.append(cur)
                cur = ""
            else:
                cur += ch
        return items + ([cur] if cur else [])

    def walk(prefix, s):
        for item in split(s):
            m = re.match(r"^(.*?)::\{(.*)\}$", item)
            if m:
                walk(prefix + m.group(1).split("::"), m.group(2))
            elif item.startswith("{") and item.endswith("}"):
                walk(prefix, item[1:-1])
            else:
                item = item.split("@as@")[0]
                paths.append(prefix + [p for p in item.split("::") if p])

    walk([], re.sub(r"\s+", "", re.sub(r"\s+as\s+", "@as@", tree)))
    return paths


def anchor(me: tuple, path: list, modules: set):
    """Where a path starts (a module) and the rest of it, or None for a path outside the crate."""
    if path[0] == "crate":
        return (), path[1:]
    if path[0] in ("super", "self"):
        base, rest = me, path
        while rest and rest[0] in ("super", "self"):
            base = base[:-1] if rest[0] == "super" else base
            rest = rest[1:]
        return base, rest
    if me + (path[0],) in modules:
        return me, path
    return None


def resolve(base: tuple, rest: list, modules: set, reexports: dict, hops=0) -> tuple:
    """The file module a path ends in, through modules and re-exports (None: another crate)."""
    at = base
    for i, seg in enumerate(rest):
        if at + (seg,) in modules:
            at = at + (seg,)
        elif (at, seg) in reexports and hops < 20:
            if reexports[(at, seg)] is OUTSIDE:
                return None
            b, r = reexports[(at, seg)]
            return resolve(b, list(r) + list(rest[i + 1 :]), modules, reexports, hops + 1)
        else:
            break
    return at


def graph(src: Path):
    files = {module_of(src, f): f for f in sorted(src.rglob("*.rs"))}
    modules = set(files)
    code = {m: code_of(f.read_text(encoding="utf-8")) for m, f in files.items()}
    reexports = {}
    for me, text in code.items():
        for m in USE.finditer(text):
            if not m.group(1):
                continue
            for path in use_paths(m.group(2)):
                if path and path[-1] != "*":
                    # A name handed on from another crate leads out of this one.
                    reexports[(me, path[-1])] = anchor(me, path, modules) or OUTSIDE
    edges = defaultdict(lambda: defaultdict(set))
    for me, text in code.items():
        paths = []
        for m in USE.finditer(text):
            if not m.group(1):
                paths += use_paths(m.group(2))
        for m in PATH.finditer(USE.sub("", text)):
            paths.append(m.group(1).split("::"))
        for path in paths:
            start = anchor(me, path, modules) if path else None
            if not start:
                continue
            target = resolve(*start, modules, reexports)
            if target is not None and target != me and me[: len(target)] != target:
                edges[me][target].add(path[-1])
    return files, edges


def circles(nodes, edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
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

    sys.setrecursionlimit(100000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def top_level(files, edges):
    """The same graph between top-level modules (the root file is none of them)."""
    tops = {m[0] for m in files if m}
    top_edges = defaultdict(lambda: defaultdict(set))
    for a, targets in edges.items():
        for b, names in targets.items():
            if a and b and a[0] != b[0]:
                top_edges[(a[0],)][(b[0],)] |= names
    return {(t,): None for t in tops}, top_edges


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    found = 0
    for src in map(Path, args or ["orchestrator/src"]):
        files, edges = graph(src)
        levels = [("file", files, edges)]
        if "--top" in sys.argv:
            levels.append(("top-level module", *top_level(files, edges)))
        for level, nodes, arrows in levels:
            name = (lambda m: str(files[m].relative_to(src))) if level == "file" else (lambda m: m[0])
            comps = circles(nodes, arrows)
            print(f"{src}: {len(nodes)} {level}s, {sum(len(t) for t in arrows.values())} arrows, "
                  f"{len(comps)} circle(s)")
            for comp in comps:
                found += 1
                print(f"  circle of {len(comp)} {level}s: {', '.join(map(name, comp))}")
                if "--edges" in sys.argv:
                    for a in comp:
                        for b in sorted(arrows[a]):
                            if b in comp:
                                names = ", ".join(sorted(arrows[a][b]))
                                print(f"    {name(a)} -> {name(b)}: {names}")
    if found and "--check" in sys.argv:
        sys.exit(1)


if __name__ == "__main__":
    main()
