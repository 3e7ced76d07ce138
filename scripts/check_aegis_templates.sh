#!/usr/bin/env bash
# Validates the agent and workflow templates AEGIS ships (cli/templates/agents, cli/templates/workflows)
# with this build's `orchestrator validate`, one PASS/FAIL line per file and a total.
#
# Not part of the test suite: it needs a checkout of github.com/100monkeys-ai/aegis-orchestrator,
# which CI does not have (and which we do not copy into this repository). The suite checks our own
# manifests exercising the same constructs (orchestrator/tests/suite/aegis_compat.rs).
#
# usage: scripts/check_aegis_templates.sh AEGIS_CHECKOUT_OR_GIT_DIR [ORCHESTRATOR_BIN]
#   AEGIS_CHECKOUT_OR_GIT_DIR  a work tree, or a bare git directory (its HEAD is read with git show)
#   ORCHESTRATOR_BIN           default: target/debug/orchestrator (built if missing)
# The node config is config/compose.yaml (its sandbox.default_command_allowlists give cmd.run to
# the executor templates, which carry no allowlist); ORCHESTRATOR_CONFIG overrides it.
set -euo pipefail

src=${1:?usage: $0 AEGIS_CHECKOUT_OR_GIT_DIR [ORCHESTRATOR_BIN]}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${2:-$root/target/debug/orchestrator}
if [[ ! -x $bin ]]; then
    (cd "$root" && cargo build -p orchestrator --bin orchestrator)
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
dirs=(cli/templates/agents cli/templates/workflows)

if [[ -d $src/cli/templates ]]; then
    for d in "${dirs[@]}"; do
        mkdir -p "$scratch/$d"
        cp "$src/$d"/*.yaml "$scratch/$d/" 2>/dev/null || true
    done
else
    # A git directory without a work tree (e.g. a mirror): read the files at HEAD.
    for d in "${dirs[@]}"; do
        mkdir -p "$scratch/$d"
        git --git-dir="$src" ls-tree --name-only HEAD "$d/" | while read -r f; do
            git --git-dir="$src" show "HEAD:$f" >"$scratch/$f"
        done
    done
fi

mapfile -t files < <(cd "$scratch" && find cli/templates -name '*.y*ml' | sort)
if [[ ${#files[@]} -eq 0 ]]; then
    echo "no templates found under $src/cli/templates" >&2
    exit 2
fi
# Relative names keep the report readable; the exit status is the validator's.
cd "$scratch"
"$bin" --config "${ORCHESTRATOR_CONFIG:-$root/config/compose.yaml}" validate "${files[@]}"
