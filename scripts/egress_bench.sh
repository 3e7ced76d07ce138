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
# shellcheck source=scripts/lib/bench.sh
source "$(dirname "$0")/lib/bench.sh" egress-bench

prepare_services
bench_example run egress_bench "the egress proxy benchmark" "$@"
