#!/usr/bin/env bash
# Entrypoint of the offline stand-in for postgres:15-bookworm (see Dockerfile beside it).
# As root: prepare $PGDATA and the socket directory, then re-run itself as postgres.
# As postgres: on first start (no $PGDATA/PG_VERSION) initdb, create the user's database, run
# /docker-entrypoint-initdb.d, then exec the server.
set -Eeuo pipefail

# Messages in the same spirit as the official image, on stderr.
log() { printf '%s [entrypoint] %s\n' "$(date -u '+%Y-%m-%d %H:%M:%S UTC')" "$*" >&2; }

# Refuse to start an open server by accident: a password is required unless trust was asked for.
check_password() {
  if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "${POSTGRES_HOST_AUTH_METHOD:-}" != trust ]; then
    log "ERROR: database is uninitialized and POSTGRES_PASSWORD is not set."
    log "Set POSTGRES_PASSWORD to a non-empty value for the superuser, or POSTGRES_HOST_AUTH_METHOD=trust"
    log "to allow every connection without a password (never do that on a reachable network)."
    exit 1
  fi
}

# Root only: ownership and modes the server insists on, then drop to the postgres user.
prepare_as_root() {
  mkdir -p "$PGDATA" /var/run/postgresql
  chmod 700 "$PGDATA" || true
  chmod 3777 /var/run/postgresql || true
  find "$PGDATA" \! -user postgres -exec chown postgres:postgres '{}' +
  chown postgres:postgres /var/run/postgresql
}

# initdb with the requested superuser and password; the password never touches argv or disk.
init_cluster() {
  local user="${POSTGRES_USER:-postgres}"
  log "initialising a new cluster in $PGDATA for superuser '$user'"
  # shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of flags, split on purpose
  initdb --username="$user" --pwfile=<(printf '%s\n' "${POSTGRES_PASSWORD:-}") \
    ${POSTGRES_INITDB_ARGS:-} -D "$PGDATA" >&2
  local method="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}"
  printf '\n# network clients (added by docker-entrypoint.sh)\nhost all all all %s\n' "$method" >>"$PGDATA/pg_hba.conf"
}

# Run with a server reachable only on the Unix socket, so nobody connects before setup is done.
with_temp_server() {
  pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p 5432" -w start >&2
  "$@"
  pg_ctl -D "$PGDATA" -m fast -w stop >&2
}

# The database named by POSTGRES_DB (default: the user's name), then the init scripts.
setup_databases() {
  local user="${POSTGRES_USER:-postgres}"
  local db="${POSTGRES_DB:-$user}"
  export PGPASSWORD="${POSTGRES_PASSWORD:-}"
  local psql=(psql -v ON_ERROR_STOP=1 --username "$user" --no-password --no-psqlrc)
  if [ "$db" != postgres ]; then
    local exists
    exists="$("${psql[@]}" --dbname postgres -tA --set db="$db" <<<"SELECT 1 FROM pg_database WHERE datname = :'db';")"
    if [ -z "$exists" ]; then
      log "creating database '$db'"
      "${psql[@]}" --dbname postgres --set db="$db" <<<'CREATE DATABASE :"db";' >&2
    fi
  fi
  local f
  for f in /docker-entrypoint-initdb.d/*; do
    [ -e "$f" ] || continue
    case "$f" in
      *.sh)
        if [ -x "$f" ]; then log "running $f"; "$f"; else log "sourcing $f"; # shellcheck disable=SC1090
          . "$f"; fi ;;
      *.sql) log "running $f"; "${psql[@]}" --dbname "$db" -f "$f" >&2 ;;
      *.sql.gz) log "running $f"; gunzip -c "$f" | "${psql[@]}" --dbname "$db" >&2 ;;
      *) log "ignoring $f" ;;
    esac
  done
  unset PGPASSWORD
}

main() {
  # "docker run image -c foo=bar" means flags for the server.
  if [ "${1:-}" != "" ] && [ "${1:0:1}" = - ]; then
    set -- postgres "$@"
  fi
  if [ "${1:-}" = postgres ]; then
    if [ "$(id -u)" = 0 ]; then
      prepare_as_root
      exec setpriv --reuid=postgres --regid=postgres --init-groups "${BASH_SOURCE[0]}" "$@"
    fi
    if [ ! -s "$PGDATA/PG_VERSION" ]; then
      check_password
      init_cluster
      with_temp_server setup_databases
      log "initialisation complete; starting the server"
    else
      log "cluster in $PGDATA already initialised; starting the server"
    fi
  fi
  exec "$@"
}

main "$@"
