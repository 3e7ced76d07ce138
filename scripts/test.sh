#!/usr/bin/env bash
# The project's test command: makes every dependency of the suite available on a fresh machine,
# then runs the whole suite. Usage: scripts/test.sh [extra cargo test args]
#
# - Docker: must answer (fails loudly otherwise; nothing is skipped).
# - PostgreSQL: uses $DATABASE_URL when given (a role that may CREATE DATABASE); otherwise installs
#   Debian's postgresql if missing and starts a throwaway cluster on a free loopback port.
# - Runtime images and the static sandbox executor: built (idempotently) before the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

LOG_TAG=test
# shellcheck source=scripts/lib/prepare.sh
source "$root/scripts/lib/prepare.sh"

prepare_services

build_sandbox_prerequisites "$root"
export SANDBOX_TEST_IMAGE="${SANDBOX_TEST_IMAGE:-aegis-runtime/busybox:1}"

# An independent OpenAPI 3 validator checks /openapi.json in the suite.
if ! python3 -c 'import openapi_spec_validator' 2>/dev/null; then
  say "installing openapi-spec-validator from PyPI"
  python3 -m pip install -q openapi-spec-validator >&2 || die "cannot install openapi-spec-validator (pip)"
fi

# The SEAL Python wire-contract test uses the SDK's own runtime dependencies.
if ! python3 -c 'import cryptography, requests' 2>/dev/null; then
  say "installing cryptography and requests from PyPI (SEAL Python client test)"
  python3 -m pip install -q cryptography requests >&2 || die "cannot install cryptography/requests (pip)"
fi

# The MCP test drives /mcp with the official MCP Python SDK (pinned).
if ! python3 -c 'import mcp, httpx2' 2>/dev/null || [ "$(python3 -c 'import importlib.metadata as m; print(m.version("mcp"))')" != "2.3.0" ]; then
  say "installing mcp 2.3.0 from PyPI (MCP Python client test)"
  python3 -m pip install -q mcp==2.3.0 >&2 || die "cannot install mcp==2.3.0 (pip)"
fi

# tests/suite/e2b.rs drives the E2B door with E2B's own Python SDK, unmodified (pinned).
if [ "$(python3 -c 'import importlib.metadata as m; print(m.version("e2b"))' 2>/dev/null)" != "2.45.1" ]; then
  say "installing e2b 2.45.1 from PyPI (E2B SDK test)"
  python3 -m pip install -q e2b==2.45.1 >&2 || die "cannot install e2b==2.45.1 (pip)"
fi

# The same E2B tests run again with the latest SDK on PyPI (pinned here, bumped on purpose;
# tests/suite/e2b.rs LATEST_SDK), installed beside the pinned one: SDKs from 2.51 create through
# POST /v2/sandboxes with an Idempotency-Key.
e2b_latest=2.63.0
if [ ! -d "$root/target/e2b-sdk-$e2b_latest/e2b" ]; then
  say "installing e2b $e2b_latest from PyPI into target/e2b-sdk-$e2b_latest (E2B SDK test, latest)"
  python3 -m pip install -q --target "$root/target/e2b-sdk-$e2b_latest" "e2b==$e2b_latest" >&2 \
    || die "cannot install e2b==$e2b_latest (pip)"
fi
# tests/suite/code_interpreter.rs: E2B's code-interpreter SDK (unmodified, pinned), beside the
# pinned e2b so neither disturbs the other (it brings the e2b it needs into the same directory).
e2b_ci=2.11.5
if [ ! -d "$root/target/e2b-ci-sdk/e2b_code_interpreter-$e2b_ci.dist-info" ]; then
  say "installing e2b-code-interpreter $e2b_ci from PyPI into target/e2b-ci-sdk (code interpreter test)"
  python3 -m pip install -q --target "$root/target/e2b-ci-sdk" "e2b-code-interpreter==$e2b_ci" >&2 \
    || die "cannot install e2b-code-interpreter==$e2b_ci (pip)"
fi

# tests/suite/ops.rs parses /metrics with the Prometheus client's own parser and fuzzes the live API
# with schemathesis against its OpenAPI document (both pinned).
if [ "$(python3 -c 'import importlib.metadata as m; print(m.version("prometheus-client"))' 2>/dev/null)" != "0.26.0" ] \
  || [ "$(python3 -c 'import importlib.metadata as m; print(m.version("schemathesis"))' 2>/dev/null)" != "4.32.5" ]; then
  say "installing prometheus-client 0.26.0 and schemathesis 4.32.5 from PyPI (metrics and API fuzz tests)"
  python3 -m pip install -q prometheus-client==0.26.0 schemathesis==4.32.5 >&2 \
    || die "cannot install prometheus-client/schemathesis (pip)"
fi

# tests/suite/console.rs drives the operator console in a real browser: Debian's chromium and
# chromium-driver, through Selenium from PyPI.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || die "chromium/chromium-driver are not installed and we are not root: install them"
  say "installing chromium and chromium-driver (console browser test)"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >&2; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >&2 \
      || die "cannot install chromium/chromium-driver (apt-get)"
  fi
fi
# tests/suite/gvisor.rs runs sandboxes under gVisor on an engine of its own
# (scripts/lib/gvisor_engine.sh): Debian's runsc (gVisor 2022-12, the ptrace platform).
if ! command -v runsc >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || die "runsc (gVisor) is not installed and we are not root: install it (apt-get install runsc)"
  say "installing runsc (gVisor sandboxes test)"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc >&2; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc >&2 \
      || die "cannot install runsc (apt-get)"
  fi
fi
if [ "$(python3 -c 'import importlib.metadata as m; print(m.version("selenium"))' 2>/dev/null)" != "4.51.0" ]; then
  say "installing selenium 4.51.0 from PyPI (console browser test)"
  python3 -m pip install -q selenium==4.51.0 >&2 || die "cannot install selenium==4.51.0 (pip)"
fi

say "checking the crates' layers (ARCHITECTURE.md, Crates and their layers)"
"$root/scripts/check_layers.sh" >&2 || die "a crate depends on one its layer does not allow (see above)"

say "running the test suite"
export RUST_LOG=${RUST_LOG:-warn}
# Libraries, binaries and test targets (the orchestrator's integration tests are one binary,
# tests/suite); the examples (benchmarks) are not built here. Arguments choose instead, e.g.
# `scripts/test.sh --workspace --test suite -- doors::` (`--workspace` keeps the features of the
# whole build, so nothing is compiled again).
if [ "$#" -eq 0 ]; then
  cargo test --workspace --locked --lib --bins --tests 2>&1
else
  cargo test --locked "$@" 2>&1
fi

# The slow scenarios (kill -9 and restarts, two replicas, durable workflows and their wake-ups)
# once more with the machine loaded: one busy loop per core, started here and always stopped.
# A test that only passes on a quiet machine waits on time where it should wait on a condition.
# Skipped when the caller chose tests (extra arguments).
if [ "$#" -eq 0 ] && [ "${SKIP_LOADED_RERUN:-0}" != 1 ]; then
  hogs=()
  stop_hogs() { [ "${#hogs[@]}" -gt 0 ] && kill "${hogs[@]}" 2>/dev/null; hogs=(); }
  # Keep whatever EXIT trap the set-up installed (the throwaway PostgreSQL's) after ours.
  prev_exit_trap=$(trap -p EXIT | sed -E "s/^trap -- '(.*)' EXIT\$/\1/")
  # shellcheck disable=SC2064  # expanded now on purpose
  trap "stop_hogs; ${prev_exit_trap:-:}" EXIT
  for _ in $(seq "$(nproc)"); do
    ( while :; do :; done ) &
    hogs+=("$!")
  done
  say "running the slow scenarios again beside ${#hogs[@]} busy loops (crash, replicas, forwarding, workflows)"
  rerun_status=0
  cargo test --workspace --locked --test suite -- crash:: cluster:: workflows_crash:: workflow_schedule:: \
    workflows:: workflow_wakeup:: 2>&1 || rerun_status=$?
  stop_hogs
  exit "$rerun_status"
fi
