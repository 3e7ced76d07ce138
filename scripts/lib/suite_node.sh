# A fresh node for running an E2B test suite by hand against it (scripts/e2b_suite.sh,
# scripts/e2b_ci_suite.sh). Source it after prepare.sh, set LOG_TAG and ROOT, then call
# start_suite_node: it makes PostgreSQL and the sandbox prerequisites ready, starts the
# orchestrator binary (ORCHESTRATOR_BIN, default target/debug/orchestrator, built when missing)
# on a database of its own with the test suite's configuration (loopback, random ports,
# defaults otherwise; SANDBOX_EXECUTOR_BIN as given), makes an operator key and exports
# E2B_API_URL = E2B_SANDBOX_URL = http://<node>/e2b and E2B_API_KEY = e2b_<hex of the key>. With
# SUITE_ISOLATION=gvisor, its sandboxes run under gVisor on an engine of the suite's own. With
# SUITE_TLS_DOMAIN set, the node also serves TLS for *.<that domain> (see suite_certificate),
# reports <domain>:<TLS port> as its sandbox domain, and SSL_CERT_FILE names the run's CA. On
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
  # With SUITE_TLS_DOMAIN: the node's TLS listener too, with a wildcard certificate for
  # *.<domain> signed by a CA made here (trusted through SSL_CERT_FILE, which httpx and
  # Python's ssl read), and that domain (with the TLS port) as the sandbox domain it reports.
  local config=()
  if [ -n "${SUITE_TLS_DOMAIN:-}" ]; then
    local tls_port
    tls_port=$(free_port)
    suite_certificate "$SUITE_WORK" "$SUITE_TLS_DOMAIN"
    cat >"$SUITE_WORK/node.yaml" <<YAML
server:
  tls:
    listen: 127.0.0.1:$tls_port
    cert_file: $SUITE_WORK/cert.pem
    key_file: $SUITE_WORK/key.pem
e2b:
  domain: $SUITE_TLS_DOMAIN:$tls_port
YAML
    config=(ORCHESTRATOR_CONFIG="$SUITE_WORK/node.yaml")
    export SSL_CERT_FILE="$SUITE_WORK/ca.pem"
    say "TLS on 127.0.0.1:$tls_port for *.$SUITE_TLS_DOMAIN (the suite's own CA)"
  fi
  # With SUITE_ISOLATION=gvisor: every sandbox runs under gVisor, on a runsc engine of the
  # suite's own (never the host's dockerd config, never the engine tests/suite/gvisor.rs starts
  # and stops), with the images it needs loaded from the host's engine.
  if [ "${SUITE_ISOLATION:-container}" = gvisor ]; then
    local images=(aegis-runtime/busybox:1 aegis-runtime/base:bookworm) host
    # Each runtime's image, as the registry's one reader (build.sh --list) gives it.
    for r in "${runtimes[@]}"; do
      images+=("$("$ROOT/runtime-images/build.sh" --list | awk -v lang="$r" '$2 == lang { print $4; exit }')")
    done
    say "starting the suite's gVisor engine (scripts/lib/gvisor_engine.sh)"
    host=$(suite_gvisor start "${images[@]}") || die "the gVisor engine did not start"
    SUITE_DOCKER_HOST=$host
    config+=(ORCHESTRATOR__DOCKER__HOST="$host" ORCHESTRATOR__SANDBOX__ISOLATION=gvisor
      ORCHESTRATOR__SANDBOX__REQUIRE_LANDLOCK=false)
  elif [ "${SUITE_ISOLATION:-container}" != container ]; then
    die "SUITE_ISOLATION: expected container or gvisor, not $SUITE_ISOLATION"
  fi
  say "starting the node on $base (database $SUITE_DB_NAME, log $SUITE_WORK/node.log)"
  env -u ORCHESTRATOR_CONFIG "${config[@]}" \
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

# A CA of the run's own and a certificate for *.<domain> signed by it (openssl): ca.pem,
# cert.pem and key.pem in <dir>.
suite_certificate() {
  local dir=$1 domain=$2
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=aegis e2b suite CA" -keyout "$dir/ca.key" -out "$dir/ca.pem" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    >/dev/null 2>&1 || die "openssl cannot make the suite's CA"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=*.$domain" \
    -keyout "$dir/key.pem" -out "$dir/cert.csr" >/dev/null 2>&1 || die "openssl cannot make a key"
  printf 'subjectAltName=DNS:*.%s\nextendedKeyUsage=serverAuth\nauthorityKeyIdentifier=keyid\n' \
    "$domain" >"$dir/cert.ext"
  openssl x509 -req -in "$dir/cert.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -CAcreateserial -days 2 -extfile "$dir/cert.ext" -out "$dir/cert.pem" >/dev/null 2>&1 \
    || die "openssl cannot sign the certificate"
}

# scripts/lib/gvisor_engine.sh under names of the suite's own.
suite_gvisor() {
  AEGIS_GVISOR_DIR=/var/lib/aegis-gvisor-suite AEGIS_GVISOR_RUN=/run/aegis-gvisor-suite \
    AEGIS_GVISOR_BRIDGE=aegis-gvsuite AEGIS_GVISOR_RANGE=10.217.0.0/16 \
    AEGIS_GVISOR_TAG=aegis-gvisor-suite bash "$ROOT/scripts/lib/gvisor_engine.sh" "$@"
}

stop_suite_node() {
  local status=$?
  if [ -n "${SUITE_DNS_PID:-}" ]; then kill "$SUITE_DNS_PID" 2>/dev/null || true; fi
  if [ -n "$SUITE_NODE_PID" ] && kill -0 "$SUITE_NODE_PID" 2>/dev/null; then
    kill -TERM "$SUITE_NODE_PID" 2>/dev/null || true
    for _ in $(seq 1 120); do kill -0 "$SUITE_NODE_PID" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$SUITE_NODE_PID" 2>/dev/null || true
  fi
  if [ -n "${SUITE_DOCKER_HOST:-}" ]; then
    # Its containers, networks and processes go with it.
    suite_gvisor stop >/dev/null 2>&1 || say "the suite's gVisor engine did not stop cleanly"
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
