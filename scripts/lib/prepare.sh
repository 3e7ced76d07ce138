# Shared set-up of scripts/test.sh and the benchmarks (through lib/bench.sh): Docker must
# answer, PostgreSQL is made reachable (DATABASE_URL, or a throwaway cluster from Debian's
# packages), and the sandbox prerequisites (the busybox runtime image, the static executor) are
# built. Source it; set LOG_TAG first to prefix messages.

say() { printf '[%s] %s\n' "${LOG_TAG:-setup}" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "${LOG_TAG:-setup}" "$*" >&2; exit 1; }

# Docker is a hard requirement of the suite: say so plainly instead of letting tests fail oddly.
check_docker() {
  command -v docker >/dev/null || die "the docker CLI is not installed; the tests and benchmarks need a Docker engine"
  timeout 20 docker info >/dev/null 2>&1 \
    || die "the Docker engine does not answer (docker info failed); start it: nothing here runs without real containers"
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
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=400 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
    start >/dev/null || { cat "$dir/server.log" >&2; die "PostgreSQL did not start"; }
  PG_STOP=("${run_as[@]}" "$bindir/pg_ctl" -D "$dir/data" -m immediate stop)
  PG_DIR=$dir
  trap stop_postgres EXIT
  export DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
}

stop_postgres() {
  remove_leftover_sandboxes
  "${PG_STOP[@]}" >/dev/null 2>&1 || true
  rm -rf "$PG_DIR"
}

# Sandboxes carry the id of the PostgreSQL cluster that recorded them; once this throwaway
# cluster is gone no reaper could ever collect what a failed test left, so remove it now.
remove_leftover_sandboxes() {
  local cluster
  cluster=$(psql "$DATABASE_URL" -Atc "SELECT system_identifier FROM pg_control_system()" 2>/dev/null) || return 0
  [ -n "$cluster" ] || return 0
  docker ps -aq --filter "label=org.aegis.db-cluster=$cluster" | xargs -r docker rm -f -v >/dev/null 2>&1 || true
  docker volume ls -q --filter "label=org.aegis.db-cluster=$cluster" | xargs -r docker volume rm -f >/dev/null 2>&1 || true
  # Egress networks, and the host firewall rules tagged for them (comment aegis-egress:<network>).
  local net rule
  for net in $(docker network ls --format '{{.Name}}' --filter "label=org.aegis.db-cluster=$cluster" 2>/dev/null); do
    docker network rm "$net" >/dev/null 2>&1 || true
    for tables in iptables ip6tables; do
      command -v "$tables" >/dev/null || continue
      "$tables" -w -S INPUT 2>/dev/null | grep -F -- "aegis-egress:$net" | tr -d '"' | sed 's/^-A /-D /' |
        while read -r rule; do
          # shellcheck disable=SC2086  # the rule is a list of words without spaces inside
          "$tables" -w $rule >/dev/null 2>&1 || true
        done
    done
  done
}

# Builds the runtime images the suite uses (busybox; the Debian shell runtime, offline through
# debootstrap when no base can be pulled, for the kernel-policy attacks; python for the intent
# pipeline, about 50 s more on the same bookworm base; base, E2B's general template for the E2B
# door's SDK tests, about 40 s more) and the static sandbox executor; exports
# SANDBOX_EXECUTOR_BIN.
# The executor must be static (it runs in FROM-scratch images); its own target directory keeps
# the static RUSTFLAGS from invalidating the main build cache.
build_sandbox_prerequisites() {
  local root=$1
  say "building runtime images"
  "$root/runtime-images/build.sh" --only busybox --only shell --only python --only base \
    --only code-interpreter
  say "building the static sandbox executor"
  CARGO_TARGET_DIR="$root/target/executor" RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --locked -p sandbox-executor --target x86_64-unknown-linux-gnu >&2
  export SANDBOX_EXECUTOR_BIN="$root/target/executor/x86_64-unknown-linux-gnu/release/sandbox-executor"
}

# Docker, then PostgreSQL (given or throwaway).
prepare_services() {
  check_docker
  if [ -n "${DATABASE_URL:-}" ]; then
    say "using PostgreSQL from DATABASE_URL"
  else
    start_postgres
  fi
}
