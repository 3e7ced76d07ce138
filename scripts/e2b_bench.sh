#!/usr/bin/env bash
# The E2B path benchmark: makes its dependencies available (like scripts/bench.sh: PostgreSQL,
# the runtime images, the static executor, E2B's Python SDK), then runs
# orchestrator/examples/e2b_bench.rs in release mode and prints its table of ratios.
# Usage: scripts/e2b_bench.sh [--iterations N] [--transfers M]
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

say "building and running the E2B benchmark (release)"
export RUST_LOG=${RUST_LOG:-warn}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/bench}
cargo run --release --locked -p orchestrator --example e2b_bench -- "$@"
