#!/usr/bin/env bash
# The code interpreter benchmark (issue 46): makes its dependencies available (PostgreSQL, the
# runtime images with code-interpreter, the static executor, E2B's code-interpreter SDK beside
# the pinned e2b in target/e2b-ci-sdk), then runs orchestrator/examples/code_bench.rs in release
# mode and prints p50/p95 per row with ratios.
# Usage: scripts/code_bench.sh [--iterations N]
#
# The release build goes to target/bench (override with CARGO_TARGET_DIR). Exits 0 whatever the
# figures, non-zero only when something failed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

LOG_TAG=code-bench
# shellcheck source=scripts/lib/prepare.sh
source "$root/scripts/lib/prepare.sh"

prepare_services
build_sandbox_prerequisites "$root"
sdk="$root/target/e2b-ci-sdk"
e2b_ci=2.11.5
if [ ! -d "$sdk/e2b_code_interpreter-$e2b_ci.dist-info" ]; then
  say "installing e2b-code-interpreter $e2b_ci from PyPI into $sdk"
  python3 -m pip install -q --target "$sdk" "e2b-code-interpreter==$e2b_ci" >&2 \
    || die "cannot install e2b-code-interpreter==$e2b_ci (pip)"
fi
if ! python3 -c 'import requests' 2>/dev/null; then
  python3 -m pip install -q requests >&2 || die "cannot install requests (pip)"
fi

say "building and running the code interpreter benchmark (release)"
export RUST_LOG=${RUST_LOG:-warn}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/bench}
cargo run --release --locked -p orchestrator --example code_bench -- --sdk "$sdk" "$@"
