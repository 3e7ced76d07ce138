#!/usr/bin/env bash
# The isolation-class benchmark (issue 44): makes its dependencies available (PostgreSQL, the
# runtime images, the static executor, runsc), starts the runsc-enabled engine of
# scripts/lib/gvisor_engine.sh beside the host's (never touching the host's dockerd), runs
# orchestrator/examples/isolation_bench.rs in release mode against it, and stops the engine.
# Prints container vs gVisor per row, with the ratio. Needs root (the engine).
# Usage: scripts/isolation_bench.sh [--iterations N] [--uploads M] [--pauses P]
#
# The release build goes to target/bench (override with CARGO_TARGET_DIR). Exits 0 whatever
# the figures, non-zero only when something failed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

LOG_TAG=isolation-bench
# shellcheck source=scripts/lib/prepare.sh
source "$root/scripts/lib/prepare.sh"

prepare_services
build_sandbox_prerequisites "$root"
if ! python3 -c 'import e2b' 2>/dev/null; then
  say "installing E2B's Python SDK from PyPI (the pause and fork rows)"
  python3 -m pip install -q e2b==2.45.1 >&2 || die "cannot install e2b==2.45.1 (pip)"
fi
if ! command -v runsc >/dev/null 2>&1; then
  say "installing gVisor (Debian's runsc)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc >&2 || die "cannot install runsc"
fi

say "building the benchmark (release)"
export RUST_LOG=${RUST_LOG:-warn}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/bench}
cargo build --release --locked -p orchestrator --example isolation_bench >&2

say "starting the runsc-enabled engine"
engine=$(bash "$root/scripts/lib/gvisor_engine.sh" start aegis-runtime/busybox:1 aegis-runtime/base:bookworm)
trap 'bash "$root/scripts/lib/gvisor_engine.sh" stop >&2 || true' EXIT
"$CARGO_TARGET_DIR/release/examples/isolation_bench" --engine "$engine" "$@"
