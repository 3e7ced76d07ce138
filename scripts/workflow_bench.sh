#!/usr/bin/env bash
# The workflow benchmark: makes its dependencies available (like scripts/bench.sh), then runs
# orchestrator/examples/workflow_bench.rs in release mode and prints its table.
# Usage: scripts/workflow_bench.sh [--executions N] [--states M]
set -euo pipefail
# shellcheck source=scripts/lib/bench.sh
source "$(dirname "$0")/lib/bench.sh" workflow-bench

prepare_services
build_sandbox_prerequisites "$root"
bench_example run workflow_bench "the workflow benchmark" "$@"
