#!/usr/bin/env bash
# The E2B path benchmark: makes its dependencies available (like scripts/bench.sh: PostgreSQL,
# the runtime images, the static executor, E2B's Python SDK), then runs
# orchestrator/examples/e2b_bench.rs in release mode and prints its table of ratios.
# Usage: scripts/e2b_bench.sh [--gvisor] [--iterations N] [--transfers M]
#
# --gvisor: the sandboxes (and the baselines' containers) run under gVisor, on the runsc-enabled
# engine of scripts/lib/gvisor_engine.sh, started here and stopped at the end (needs root).
#
# The release build goes to target/bench (override with CARGO_TARGET_DIR). Exits 0 whether or
# not the targets are met, non-zero only when something failed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

LOG_TAG=e2b-bench
# shellcheck source=scripts/lib/prepare.sh
source "$root/scripts/lib/prepare.sh"

prepare_services
build_sandbox_prerequisites "$root"
if ! python3 -c 'import e2b, requests' 2>/dev/null; then
  say "installing E2B's Python SDK and requests from PyPI"
  python3 -m pip install -q e2b requests >&2 || die "cannot install e2b/requests (pip)"
fi

args=()
gvisor=0
for a in "$@"; do
  if [ "$a" = --gvisor ]; then gvisor=1; else args+=("$a"); fi
done

say "building the E2B benchmark (release)"
export RUST_LOG=${RUST_LOG:-warn}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/bench}
cargo build --release --locked -p orchestrator --example e2b_bench
if [ "$gvisor" = 1 ]; then
  say "starting the runsc-enabled engine"
  engine=$(bash "$root/scripts/lib/gvisor_engine.sh" start aegis-runtime/busybox:1 aegis-runtime/base:bookworm)
  trap 'bash "$root/scripts/lib/gvisor_engine.sh" stop >&2 || true' EXIT
  args+=(--engine "$engine")
fi
"$CARGO_TARGET_DIR/release/examples/e2b_bench" "${args[@]}"
