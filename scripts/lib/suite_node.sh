# A fresh node for running an E2B test suite by hand against it (scripts/e2b_suite.sh,
# scripts/e2b_ci_suite.sh). Source it after prepare.sh, set LOG_TAG and ROOT, then call
# start_suite_node: it makes PostgreSQL and the sandbox prerequisites ready, starts the
# orchestrator binary (ORCHESTRATOR_BIN, default target/debug/orchestrator, built when missing)
# on a database of its own with the test suite's configuration (loopback, random ports,
# defaults otherwise; SANDBOX_EXECUTOR_BIN as given), makes an operator key and exports
# E2B_API_URL = E2B_SANDBOX_URL = http://<node>/e2b and E2B_API_KEY = e2b_<hex of the key>. On
# exit it stops the node, removes whatever sandbox it left and drops the database (the node's
# log shown when the exit status is not 0).

start_suite_node() {
  local runtimes=("$@")
  prepare_services
  if [ -z "${SANDBOX_EXECUTOR_BIN:-}" ]; then
    build_sandbox_prerequisites "$ROOT"
  else
    "$ROOT/runtime-images/build.sh" --only base >&2
  fi
  local r
  for r in "${runtimes[@]}"; do
    "$ROOT/runtime-images/build.sh" --only "$r" >&2
  done
  local bin="${ORCHESTRATOR_BIN:-$ROOT/target/debug/orchestrator}"
  if [ ! -x "$bin" ]; then
    say "building the orchestrator binary"
    (cd "$ROOT" && cargo build --locked -p orchestrator --bin orchestrator >&2)
  fi

  # A database of its own, dropped at the end with whatever the node left.
  SUITE_DB_NAME="e2b_suite_$(python3 -c 'import secrets; print(secrets.token_hex(6))')"
  local db_url
  db_url=$(python3 - "$DATABASE_URL" "$SUITE_DB_NAME" <<'PY'
import sys, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
print(urllib.parse.urlunsplit(u._replace(path="/" + sys.argv[2])))
PY
)
  psql "$DATABASE_URL" -qAtc "CREATE DATABASE $SUITE_DB_NAME" >/dev/null
  SUITE_WORK=$(mktemp -d /tmp/e2b-suite.XXXXXX)
  SUITE_NODE_PID=""
  trap stop_suite_node EXIT

  local http_port grpc_port admin_key base
  http_port=$(free_port)
  grpc_port=$(free_port)
  admin_key="aok_$(python3 -c 'import secrets; print(secrets.token_hex(32))')"
  base="http://127.0.0.1:$http_port"
  say "starting the node on $base (database $SUITE_DB_NAME, log $SUITE_WORK/node.log)"
  env -u ORCHESTRATOR_CONFIG \
    DATABASE_URL="$db_url" \
    ORCHESTRATOR_ADMIN_KEY="$admin_key" \
    SANDBOX_EXECUTOR_BIN="$SANDBOX_EXECUTOR_BIN" \
    RUST_LOG="${RUST_LOG:-warn}" \
    "$bin" serve --http "127.0.0.1:$http_port" --grpc "127.0.0.1:$grpc_port" >"$SUITE_WORK/node.log" 2>&1 &
  SUITE_NODE_PID=$!
  local i
  for i in $(seq 1 120); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$base/health/ready")" = 200 ] && break
    kill -0 "$SUITE_NODE_PID" 2>/dev/null || die "the node exited at start"
    [ "$i" -lt 120 ] || die "the node never became ready"
    sleep 0.5
  done

  local key
  key=$(curl -sf -X POST "$base/v1/api-keys" -H "Authorization: Bearer $admin_key" \
    -H 'Content-Type: application/json' -d "{\"name\": \"$LOG_TAG\", \"role\": \"operator\"}" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["key"])') || die "cannot create an API key"
  export E2B_API_URL="$base/e2b"
  export E2B_SANDBOX_URL="$base/e2b"
  E2B_API_KEY="e2b_$(printf %s "$key" | od -An -v -tx1 | tr -d ' \n')"
  export E2B_API_KEY
  unset E2B_DEBUG E2B_DOMAIN E2B_ACCESS_TOKEN
}

stop_suite_node() {
  local status=$?
  if [ -n "$SUITE_NODE_PID" ] && kill -0 "$SUITE_NODE_PID" 2>/dev/null; then
    kill -TERM "$SUITE_NODE_PID" 2>/dev/null || true
    for _ in $(seq 1 120); do kill -0 "$SUITE_NODE_PID" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$SUITE_NODE_PID" 2>/dev/null || true
  fi
  local left
  left=$(docker ps -aq --filter "label=org.aegis.db-name=$SUITE_DB_NAME")
  if [ -n "$left" ]; then
    say "removing $(echo "$left" | wc -l) sandbox container(s) the node left"
    echo "$left" | xargs -r docker rm -f -v >/dev/null 2>&1 || true
  fi
  docker volume ls -q --filter "label=org.aegis.db-name=$SUITE_DB_NAME" | xargs -r docker volume rm -f >/dev/null 2>&1 || true
  psql "$DATABASE_URL" -qAtc "DROP DATABASE IF EXISTS $SUITE_DB_NAME WITH (FORCE)" >/dev/null 2>&1 || true
  if [ "$status" -ne 0 ] && [ -s "$SUITE_WORK/node.log" ]; then
    say "the node's log (last 40 lines):"
    tail -n 40 "$SUITE_WORK/node.log" >&2
  fi
  rm -rf "$SUITE_WORK"
  # A throwaway cluster of prepare_services (no DATABASE_URL given) goes too.
  if [ -n "${PG_DIR:-}" ]; then stop_postgres; fi
  if [ -n "$(docker ps -aq --filter "label=org.aegis.db-name=$SUITE_DB_NAME")" ]; then
    say "ERROR: sandbox containers are still there (label org.aegis.db-name=$SUITE_DB_NAME)"
    status=1
  fi
  exit "$status"
}
