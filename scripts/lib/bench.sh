# Shared start of the benchmark scripts (scripts/*bench.sh), written once. Source it with the
# log prefix as its argument, after `set -euo pipefail`:
#   source "$(dirname "$0")/lib/bench.sh" load-bench
# It goes to the repository root (`root`), sets LOG_TAG and sources prepare.sh (say, die,
# prepare_services, build_sandbox_prerequisites, ...); then the script calls what it needs.

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$(pwd)
LOG_TAG=$1
# shellcheck source=scripts/lib/prepare.sh
source "$root/scripts/lib/prepare.sh"

# Builds the orchestrator's `--example NAME` in release mode, in a target directory of its own
# (target/bench, or CARGO_TARGET_DIR) so the release flags leave the debug build's cache alone,
# with logs at warn unless RUST_LOG says otherwise (both exported: the example and what it
# starts read them). WHAT names it in the progress line.
#   bench_example run NAME WHAT [ARGS...]   build it and run it with ARGS
#   bench_example build NAME WHAT           build it only; it is then
#                                           $CARGO_TARGET_DIR/release/examples/NAME
bench_example() {
  local mode=$1 name=$2 what=$3
  shift 3
  export RUST_LOG=${RUST_LOG:-warn}
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/bench}
  case "$mode" in
    run)
      say "building and running $what (release)"
      cargo run --release --locked -p orchestrator --example "$name" -- "$@"
      ;;
    build)
      say "building $what (release)"
      cargo build --release --locked -p orchestrator --example "$name" >&2
      ;;
    *) die "bench_example: unknown mode '$mode' (run or build)" ;;
  esac
}

# Installs Python packages from PyPI unless `import MODULES` already works (MODULES as Python
# writes them, e.g. 'e2b, requests'); WHY, when not empty, says what they are for.
#   need_python_packages MODULES WHY PIP_SPEC...
need_python_packages() {
  local modules=$1 why=$2
  shift 2
  python3 -c "import $modules" 2>/dev/null && return 0
  say "installing $* from PyPI${why:+ ($why)}"
  python3 -m pip install -q "$@" >&2 || die "cannot install $* (pip)"
}

# Starts the runsc-enabled engine (gvisor_engine.sh) with the images the gVisor rows run, and
# stops it when the script exits; its address is then in `engine`.
start_gvisor_engine() {
  say "starting the runsc-enabled engine"
  engine=$(bash "$root/scripts/lib/gvisor_engine.sh" start aegis-runtime/busybox:1 aegis-runtime/base:bookworm)
  trap 'bash "$root/scripts/lib/gvisor_engine.sh" stop >&2 || true' EXIT
}
