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
# shellcheck source=scripts/lib/bench.sh
source "$(dirname "$0")/lib/bench.sh" code-bench

prepare_services
build_sandbox_prerequisites "$root"
sdk="$root/target/e2b-ci-sdk"
e2b_ci=2.11.5
if [ ! -d "$sdk/e2b_code_interpreter-$e2b_ci.dist-info" ]; then
  say "installing e2b-code-interpreter $e2b_ci from PyPI into $sdk"
  python3 -m pip install -q --target "$sdk" "e2b-code-interpreter==$e2b_ci" >&2 \
    || die "cannot install e2b-code-interpreter==$e2b_ci (pip)"
fi
need_python_packages requests '' requests

bench_example run code_bench "the code interpreter benchmark" --sdk "$sdk" "$@"
