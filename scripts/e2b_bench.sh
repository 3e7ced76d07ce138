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
# shellcheck source=scripts/lib/bench.sh
source "$(dirname "$0")/lib/bench.sh" e2b-bench

prepare_services
build_sandbox_prerequisites "$root"
need_python_packages 'e2b, requests' '' e2b requests

args=()
gvisor=0
for a in "$@"; do
  if [ "$a" = --gvisor ]; then gvisor=1; else args+=("$a"); fi
done

bench_example build e2b_bench "the E2B benchmark"
if [ "$gvisor" = 1 ]; then
  start_gvisor_engine
  args+=(--engine "$engine")
fi
"$CARGO_TARGET_DIR/release/examples/e2b_bench" "${args[@]}"
