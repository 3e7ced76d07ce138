#!/usr/bin/env bash
# The load benchmark: makes its dependencies available (like scripts/bench.sh), then runs
# orchestrator/examples/load_bench.rs in release mode and prints its table.
# Usage: scripts/load_bench.sh [--clients 50] [--seconds 5] [--warmup 1] [--sandboxes 10]
#                              [--transports rest,seal-http,seal-grpc,mcp] [--workloads runtime,cmd,read] [--cpu]
#                              [--channels socket,attach] [--layout compose|host]
#
# `--layout`: `compose` (the default) runs this process and the PostgreSQL server each in a CPU
# group of its own beside the sandboxes', as `docker compose up` does (root and Docker's cgroupfs
# layout needed, else the host's layout stays and the header says why); `host` leaves them where
# they started. Under saturation the two differ in the tail: see ARCHITECTURE.md, "CPU groups".
#
# `--channels`: how calls reach the executors, each measured in turn in the same run: `socket`
# (the direct channel, a Unix socket per sandbox under /run/aegis-bench: run as root)
# and `attach` (Docker's attach stream, the fallback). With `--cpu`, each row shows the CPU per
# call by process, so the two channels compare within minutes on the same machine.
#
# - Docker: must answer. PostgreSQL: $DATABASE_URL when given (a role that may CREATE DATABASE;
#   the benchmark creates load_<uuid> and drops it), else a throwaway cluster (scripts/lib).
# - The busybox runtime image and the static sandbox executor: built (idempotently) first.
# - The release build goes to target/bench (override with CARGO_TARGET_DIR).
#
# Exits 0 whether or not the targets are met (the TARGET lines say), non-zero only on failure.
set -euo pipefail
# shellcheck source=scripts/lib/bench.sh
source "$(dirname "$0")/lib/bench.sh" load-bench

prepare_services
build_sandbox_prerequisites "$root"
bench_example run load_bench "the load benchmark" "$@"
