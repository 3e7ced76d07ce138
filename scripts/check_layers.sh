#!/usr/bin/env bash
# Holds the workspace to its layers: every crate may depend only on the workspace crates its row
# of the table "Crates and their layers" in ARCHITECTURE.md allows, and a crate of a pure layer
# never reaches (even transitively) a crate listed there as I/O. Cargo already refuses a cycle
# between crates; this refuses an edge the architecture does not have. Run by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo metadata --format-version 1 --locked | python3 scripts/check_layers.py
# Inside each crate of the service, no circle between its files (`crate::`, `super::`, `self::`
# and child paths, through re-exports) nor between its top-level modules: the order the crate
# table cannot see (scripts/module_graph.py).
# The checker itself first: a planted circle (two sibling files naming each other through
# `super::`, one through a re-export of the parent) must fail it.
planted=$(mktemp -d)
trap 'rm -rf "$planted"' EXIT
mkdir -p "$planted/src/door"
printf 'mod door;\n' >"$planted/src/lib.rs"
printf 'mod a;\nmod b;\npub use b::Answer;\n' >"$planted/src/door/mod.rs"
printf 'pub fn ask() -> super::Answer { super::b::answer() }\n' >"$planted/src/door/a.rs"
printf 'pub struct Answer;\npub fn answer() -> Answer { super::a::ask(); Answer }\n' >"$planted/src/door/b.rs"
if python3 scripts/module_graph.py --check "$planted/src" >/dev/null; then
  echo "scripts/module_graph.py did not see a planted circle (door/a.rs <-> door/b.rs)" >&2
  exit 1
fi
srcs=(orchestrator/src orchestrator/crates/*/src dispatcher/src dispatcher/executor/src)
python3 scripts/module_graph.py --check --top "${srcs[@]}" >/dev/null \
  || { python3 scripts/module_graph.py --edges --top "${srcs[@]}" | grep -v ' 0 circle'; exit 1; }
echo "no circle between files or modules inside the service's crates"
