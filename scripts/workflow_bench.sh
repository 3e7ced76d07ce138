#!/usr/bin/env bash
# The workflow benchmark: makes its dependencies available (like scripts/bench.sh), then runs
# orchestrator/examples/workflow_bench.rs in release mode and prints its table.
# Usage: scripts/workflow_bench.sh [--executions N] [--states M]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

LOG_TAG=workflow-bench
# shellcheck source=scripts/lib/prepare.sh
source "$root/scripts/lib/prepare.sh"

prepare_services
build_sandbox_prerequisites "$root"

say "building and running the workflow benchmark (release)"
export RUST_LOG=${RUST_LOG:-warn}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/bench}
cargo run --release --locked -p orchestrator --example workflow_bench -- "$@"
