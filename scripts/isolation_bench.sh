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
# shellcheck source=scripts/lib/bench.sh
source "$(dirname "$0")/lib/bench.sh" isolation-bench

prepare_services
build_sandbox_prerequisites "$root"
need_python_packages e2b 'the pause and fork rows' e2b==2.45.1
if ! command -v runsc >/dev/null 2>&1; then
  say "installing gVisor (Debian's runsc)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc >&2 || die "cannot install runsc"
fi

bench_example build isolation_bench "the benchmark"

start_gvisor_engine
"$CARGO_TARGET_DIR/release/examples/isolation_bench" --engine "$engine" "$@"
