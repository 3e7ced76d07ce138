#!/usr/bin/env bash
# The sandbox benchmark: makes its dependencies available (like scripts/test.sh), then runs
# orchestrator/examples/bench.rs in release mode and prints its table.
# Usage: [BENCH_CHANNEL=attach] scripts/bench.sh [--iterations N] [--warmup N] [--pool-iterations M]
#
# Calls reach the executors over their socket (the direct channel; run as root), or over
# Docker's attach stream with BENCH_CHANNEL=attach, to compare the two.
#
# - Docker: must answer (fails loudly otherwise).
# - PostgreSQL: uses $DATABASE_URL when given (a role that may CREATE DATABASE; the benchmark
#   creates bench_<uuid> and drops it); otherwise installs Debian's postgresql if missing and
#   starts a throwaway cluster on a free loopback port, removed on exit.
# - The busybox runtime image and the static sandbox executor: built (idempotently) first.
# - The release build goes to target/bench (override with CARGO_TARGET_DIR) so it does not
#   fight over the lock or the cache of the debug build the test suite uses.
#
# The benchmark prints ratios against a raw Docker baseline measured in the same run; it exits 0
# whether or not the targets are met, non-zero only when something failed.
set -euo pipefail
# shellcheck source=scripts/lib/bench.sh
source "$(dirname "$0")/lib/bench.sh" bench

prepare_services
build_sandbox_prerequisites "$root"
bench_example run bench "the benchmark" "$@"
