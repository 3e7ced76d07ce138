#!/usr/bin/env bash
# The sandbox ports benchmark (issue 45): makes its dependencies available (like
# scripts/e2b_bench.sh: PostgreSQL, the runtime images, the static executor, E2B's Python SDK),
# then runs orchestrator/examples/ports_bench.rs in release mode and prints requests/s, p50 and
# p99 through a sandbox port and directly, with their ratios.
# Usage: scripts/ports_bench.sh [--requests N]
#
# The release build goes to target/bench (override with CARGO_TARGET_DIR). Exits 0 whatever
# the figures, non-zero only when something failed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

LOG_TAG=ports-bench
# shellcheck source=scripts/lib/prepare.sh
source "$root/scripts/lib/prepare.sh"

prepare_services
build_sandbox_prerequisites "$root"
if ! python3 -c 'import e2b' 2>/dev/null; then
  say "installing E2B's Python SDK from PyPI"
  python3 -m pip install -q e2b >&2 || die "cannot install e2b (pip)"
fi

say "building and running the sandbox ports benchmark (release)"
export RUST_LOG=${RUST_LOG:-warn}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/bench}
cargo run --release --locked -p orchestrator --example ports_bench -- "$@"
