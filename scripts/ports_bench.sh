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
# shellcheck source=scripts/lib/bench.sh
source "$(dirname "$0")/lib/bench.sh" ports-bench

prepare_services
build_sandbox_prerequisites "$root"
need_python_packages e2b '' e2b
bench_example run ports_bench "the sandbox ports benchmark" "$@"
