#!/usr/bin/env bash
# Holds the workspace to its layers: every crate may depend only on the workspace crates its row
# of the table "Crates and their layers" in ARCHITECTURE.md allows, and a crate of a pure layer
# never reaches (even transitively) a crate listed there as I/O. Cargo already refuses a cycle
# between crates; this refuses an edge the architecture does not have. Run by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo metadata --format-version 1 --locked | python3 scripts/check_layers.py
# Inside each crate of the service, no cycle between its top-level modules (the order the crate
# table cannot see).
srcs=(orchestrator/src orchestrator/crates/*/src dispatcher/src dispatcher/executor/src)
python3 scripts/module_graph.py --check "${srcs[@]}" >/dev/null \
  || { python3 scripts/module_graph.py --edges "${srcs[@]}"; exit 1; }
echo "no module cycle inside the service's crates"
