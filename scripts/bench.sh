#!/usr/bin/env bash
# The sandbox benchmark: makes its dependencies available (like scripts/test.sh), then runs
# orchestrator/examples/bench.rs in release mode and prints its table.
# Usage: scripts/bench.sh [--iterations N] [--warmup N] [--pool-iterations M]
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
cd "$(dirname "$0")/.."
root=$(pwd)

say() { printf '[bench] %s\n' "$*" >&2; }
die() { printf '[bench] ERROR: %s\n' "$*" >&2; exit 1; }

check_docker() {
  command -v docker >/dev/null || die "the docker CLI is not installed; the benchmark needs a Docker engine"
  timeout 20 docker info >/dev/null 2>&1 \
    || die "the Docker engine does not answer (docker info failed); start it, the benchmark needs real containers"
  say "Docker engine answers ($(docker version --format '{{.Server.Version}}'))"
}

# Finds the PostgreSQL server binaries, installing Debian's package when absent.
pg_bindir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)
  if [ -z "$d" ] || [ ! -x "$d/initdb" ]; then
    [ "$(id -u)" = 0 ] || die "PostgreSQL is not installed and we are not root: install 'postgresql' or set DATABASE_URL"
    say "installing PostgreSQL from Debian packages"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
    d=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1)
  fi
  echo "$d"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Starts a throwaway cluster (trust auth, loopback only, no fsync) and exports DATABASE_URL.
start_postgres() {
  local bindir port dir run_as=()
  bindir=$(pg_bindir)
  dir=$(mktemp -d /tmp/orchestrator-pg.XXXXXX)
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --home "$dir" postgres
    chown postgres "$dir"
    run_as=(runuser -u postgres --)
  fi
  port=$(free_port)
  say "starting a throwaway PostgreSQL ($("$bindir/postgres" --version)) in $dir on 127.0.0.1:$port"
  "${run_as[@]}" "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
  "${run_as[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=100 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
    start >/dev/null || { cat "$dir/server.log" >&2; die "PostgreSQL did not start"; }
  PG_STOP=("${run_as[@]}" "$bindir/pg_ctl" -D "$dir/data" -m immediate stop)
  PG_DIR=$dir
  trap stop_postgres EXIT
  export DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
}

stop_postgres() {
  "${PG_STOP[@]}" >/dev/null 2>&1 || true
  rm -rf "$PG_DIR"
}

check_docker
if [ -n "${DATABASE_URL:-}" ]; then
  say "using PostgreSQL from DATABASE_URL"
else
  start_postgres
fi

say "building runtime images"
runtime-images/build.sh --only busybox

# The sandbox executor must be a static binary (it runs in FROM-scratch images); its own target
# directory keeps the static RUSTFLAGS from invalidating the main build cache.
say "building the static sandbox executor"
CARGO_TARGET_DIR="$root/target/executor" RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build --release --locked -p sandbox-executor --target x86_64-unknown-linux-gnu >&2
export SANDBOX_EXECUTOR_BIN="$root/target/executor/x86_64-unknown-linux-gnu/release/sandbox-executor"

say "building and running the benchmark (release)"
export RUST_LOG=${RUST_LOG:-warn}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/bench}
cargo run --release --locked -p orchestrator --example bench -- "$@"
