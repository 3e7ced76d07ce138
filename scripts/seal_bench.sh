#!/usr/bin/env bash
# The SEAL overhead benchmark: makes PostgreSQL available (like scripts/load_bench.sh), then runs
# orchestrator/examples/seal_bench.rs in release mode: p50/p95 of aegis.runtime.list through the
# in-process router, SEAL over HTTP and SEAL over gRPC, in one run against one real service.
# Usage: scripts/seal_bench.sh [CALLS]   (default 300 sequential calls per path)
#
# - PostgreSQL: $DATABASE_URL when given (a role that may CREATE DATABASE; the benchmark creates
#   bench_<uuid> and drops it), else a throwaway cluster (scripts/lib). No Docker object is made,
#   but the orchestrator checks that Docker answers at start.
# - The release build goes to target/bench (override with CARGO_TARGET_DIR).
#
# Exits 0 whatever the figures, non-zero only on failure.
set -euo pipefail
# shellcheck source=scripts/lib/bench.sh
source "$(dirname "$0")/lib/bench.sh" seal-bench

prepare_services
bench_example run seal_bench "the SEAL benchmark" "$@"
