#!/usr/bin/env bash
# The egress proxy benchmark: makes PostgreSQL available (like scripts/bench.sh), then runs
# orchestrator/examples/egress_bench.rs in release mode: N small GETs (a new connection each) and
# bulk downloads from a local test host, directly and through the sandboxes' egress proxy (domain
# rules, resolve-once address checks, one audit row per connection), in one run.
# Usage: scripts/egress_bench.sh [N]     (default 500 small requests per path)
#
# - PostgreSQL: $DATABASE_URL when given (a role that may CREATE DATABASE; the benchmark creates
#   bench_<uuid> and drops it), else a throwaway cluster (scripts/lib).
# - Nothing leaves the machine: the test host listens on 127.0.0.2.
# - The release build goes to target/bench (override with CARGO_TARGET_DIR).
#
# Prints the added latency (p50, p95, ratio) and the throughput ratio against the direct path
# measured in the same run; exits non-zero only when something failed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

LOG_TAG=egress-bench
# shellcheck source=scripts/lib/prepare.sh
source "$root/scripts/lib/prepare.sh"

prepare_services

say "building and running the egress proxy benchmark (release)"
export RUST_LOG=${RUST_LOG:-warn}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/bench}
cargo run --release --locked -p orchestrator --example egress_bench -- "$@"
