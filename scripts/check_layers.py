#!/usr/bin/env python3
"""Holds the workspace to its layers (see scripts/check_layers.sh, which runs this with the
output of `cargo metadata` on standard input)."""

import json, re, sys

table = {}
io_crates = set()
in_table = False
for line in open("ARCHITECTURE.md", encoding="utf-8"):
    if line.startswith("## "):
        in_table = line.strip() == "## Crates and their layers"
        continue
    if not in_table:
        continue
    m = re.match(r"^I/O crates: (.*)$", line.strip())
    if m:
        io_crates = set(re.findall(r"`([^`]+)`", m.group(1)))
    cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
    if len(cells) >= 3 and cells[0].startswith("`"):
        name = cells[0].strip("`")
        allowed = set(re.findall(r"`([^`]+)`", cells[2]))
        table[name] = (cells[1], allowed)
if not table:
    sys.exit("ARCHITECTURE.md has no table under \"## Crates and their layers\"")

meta = json.load(sys.stdin)
members = set(meta["workspace_members"])
packages = {p["id"]: p for p in meta["packages"]}
workspace = {packages[i]["name"] for i in members}
problems = []
for name in sorted(workspace - set(table)):
    problems.append(f"crate {name} has no row in ARCHITECTURE.md (Crates and their layers)")
for name in sorted(set(table) - workspace):
    problems.append(f"ARCHITECTURE.md lists {name}, which is not a workspace crate")

nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
by_name = {packages[i]["name"]: i for i in members}
for name, (layer, allowed) in sorted(table.items()):
    if name not in by_name:
        continue
    pkg = packages[by_name[name]]
    for dep in pkg["dependencies"]:
        if dep.get("path") and dep["kind"] != "dev" and dep["name"] not in allowed:
            problems.append(f"{name} ({layer.split(':')[0]}) depends on {dep['name']}, which its row does not allow")
    if layer.startswith("0 pure"):
        # Everything it links, transitively (normal dependencies only).
        seen, todo = set(), [by_name[name]]
        while todo:
            node = nodes[todo.pop()]
            for d in node["deps"]:
                if any(k["kind"] in (None, "normal") for k in d["dep_kinds"]) and d["pkg"] not in seen:
                    seen.add(d["pkg"])
                    todo.append(d["pkg"])
        reached = sorted({packages[i]["name"] for i in seen} & io_crates)
        if reached:
            problems.append(f"{name} ({layer.split(':')[0]}) reaches I/O crates: " + ", ".join(reached))
if problems:
    print("layer check failed:", *problems, sep="\n  ")
    sys.exit(1)
print(f"layers hold: {len(table)} crates checked against ARCHITECTURE.md")
