#!/usr/bin/env bash
# E2B's own test suite, run by hand against a node of ours (issues 22 and 42): the sync sandbox,
# commands, files, PTY and API tests of E2B's Python SDK, unmodified, through the three
# exports an E2B user sets. Not part of our CI (it needs a copy of E2B's repository, which is
# never committed here):
#
#   git -C <E2B clone> archive <commit> packages/python-sdk | tar -x -C /tmp/e2b-src
#   scripts/e2b_suite.sh /tmp/e2b-src/packages/python-sdk [pytest args, e.g. -k test_run]
#   E2B_SUITE_SDK=2.63.0 scripts/e2b_suite.sh /tmp/e2b-src/packages/python-sdk
#   SUITE_ISOLATION=gvisor scripts/e2b_suite.sh /tmp/e2b-src/packages/python-sdk
#
# SUITE_ISOLATION=gvisor runs every sandbox under gVisor, on a runsc engine the script starts
# beside the host's (scripts/lib/suite_node.sh), and deselects the tests of
# e2b-suite-exclusions-gvisor.txt instead of those of e2b-suite-exclusions-container.txt.
#
# Any commit of E2B's repository: e139fc38e (the release of e2b 2.45.1, the SDK our own tests
# pin) and its HEAD, b8029973a at the last fetch, whose python-sdk is still 2.45.1 (2.46 to
# 2.63.0 were released from commits not in that copy). The tests run against the SDK release
# E2B_SUITE_SDK (default: the copy's own version, from its pyproject.toml), never against the
# copy's source: the one installed in Python when it is that version, otherwise
# target/e2b-sdk-<version> (`pip install --target`, as scripts/test.sh installs the latest SDK,
# done here when missing) put first on PYTHONPATH. With pytest and the plugins the suite's
# pytest.ini uses, installed when missing.
#
# What it does: starts the orchestrator binary (ORCHESTRATOR_BIN, default target/debug/
# orchestrator, built when missing) on a fresh database of the PostgreSQL at DATABASE_URL (a
# throwaway cluster when unset, as scripts/test.sh), with the test suite's configuration
# (loopback, random ports, defaults otherwise; SANDBOX_EXECUTOR_BIN and SANDBOX_CHANNEL_DIR as
# given); makes an operator key; exports E2B_API_URL = E2B_SANDBOX_URL = http://<node>/e2b and
# E2B_API_KEY = e2b_<hex of the key>; gives the node a TLS listener for *.sandboxes.test (a CA
# of the run's own, trusted by pytest through SSL_CERT_FILE) and, as root, makes those names
# resolve to the node for pytest alone (scripts/lib/wildcard_dns.py, seen through a mount
# namespace); runs pytest on tests/sync/sandbox_sync and
# tests/sync/api_sync, deselecting the tests listed in orchestrator/tests/e2b-suite-exclusions.txt
# (one `<node id> | <reason>` a line: what cannot pass here, and why; with a newer SDK than the
# tests', e2b-suite-exclusions-newer-sdk.txt too: mocks the newer SDK bypasses); prints the SDK it ran,
# passed, failed and excluded per reason; then stops the node, removes whatever sandbox it left
# and drops the database. Exits with pytest's status.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOG_TAG=e2b-suite
# shellcheck source=scripts/lib/prepare.sh
source "$ROOT/scripts/lib/prepare.sh"
# shellcheck source=scripts/lib/suite_node.sh
source "$ROOT/scripts/lib/suite_node.sh"

[ $# -ge 1 ] || die "usage: scripts/e2b_suite.sh <path to E2B's packages/python-sdk> [pytest args]"
SDK="$(cd "$1" && pwd)" || die "no such directory: $1"
shift
[ -f "$SDK/tests/conftest.py" ] && [ -d "$SDK/tests/sync/sandbox_sync" ] \
  || die "$SDK is not E2B's packages/python-sdk (no tests/sync/sandbox_sync)"
EXCLUSIONS="$ROOT/orchestrator/tests/e2b-suite-exclusions.txt"
[ -f "$EXCLUSIONS" ] || die "missing $EXCLUSIONS"

sdk_version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$SDK/pyproject.toml" | head -n1)
[ -n "$sdk_version" ] || die "no version in $SDK/pyproject.toml"
run_version="${E2B_SUITE_SDK:-$sdk_version}"
[[ "$run_version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "E2B_SUITE_SDK: expected a release such as 2.63.0, not $run_version"
# Every look at what Python has installed is made without the caller's PYTHONPATH: pip, seeing
# another SDK there, would uninstall it from that folder.
installed() { env -u PYTHONPATH python3 -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$1" 2>/dev/null || true; }
SDK_PATH=""
if [ "$(installed e2b)" != "$run_version" ]; then
  SDK_PATH="$ROOT/target/e2b-sdk-$run_version"
  if [ ! -d "$SDK_PATH/e2b" ]; then
    say "installing e2b $run_version from PyPI into ${SDK_PATH#"$ROOT"/}"
    env -u PYTHONPATH python3 -m pip install -q --target "$SDK_PATH" "e2b==$run_version" >&2 \
      || die "cannot install e2b==$run_version (pip)"
  fi
fi
if ! env -u PYTHONPATH python3 -c 'import pytest, pytest_asyncio, pytest_timeout' 2>/dev/null; then
  say "installing pytest, pytest-asyncio and pytest-timeout from PyPI"
  env -u PYTHONPATH python3 -m pip install -q "pytest>=9.0.3,<10" "pytest-asyncio>=1.3.0,<2" "pytest-timeout>=2.4.0,<3" >&2 \
    || die "cannot install pytest (pip)"
fi
RUN_PYTHONPATH="$ROOT/scripts/lib${SDK_PATH:+:$SDK_PATH}"
ran=$(cd / && PYTHONPATH="$RUN_PYTHONPATH" python3 -P -c 'import importlib.metadata as m, e2b, os; print(m.version("e2b"), os.path.dirname(e2b.__file__))') \
  || die "the SDK does not import (PYTHONPATH=$RUN_PYTHONPATH)"
[ "${ran%% *}" = "$run_version" ] || die "expected e2b $run_version, Python imports $ran"
[ "$run_version" = "$sdk_version" ] || say "the tests of e2b $sdk_version run against the SDK release $run_version"

# Sandbox ports at https://<port>-<id>.<domain> (E2B's get_host, which the host-routing tests
# open with httpx): the node serves TLS for *.sandboxes.test (.test is reserved, RFC 6761) with a
# certificate of the run's own CA, and a DNS server started here answers every name under it
# with the loopback address. pytest alone sees that server: it runs in a mount namespace of its
# own whose /etc/resolv.conf names it (needs root and unshare); the machine's resolver is not
# touched. Without them those tests are deselected (e2b-suite-exclusions-no-resolver.txt).
SUITE_TLS_DOMAIN=sandboxes.test
export SUITE_TLS_DOMAIN
start_suite_node
export E2B_SUITE_EXCLUSIONS="$EXCLUSIONS"
resolver=""
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null; then
  dns_addr="127.53.$((RANDOM % 250 + 1)).1"
  python3 "$ROOT/scripts/lib/wildcard_dns.py" "$dns_addr" "$SUITE_TLS_DOMAIN" 127.0.0.1 \
    >"$SUITE_WORK/dns.log" 2>&1 &
  SUITE_DNS_PID=$!
  for _ in $(seq 1 50); do grep -q ready "$SUITE_WORK/dns.log" 2>/dev/null && break; sleep 0.1; done
  if grep -q ready "$SUITE_WORK/dns.log"; then
    printf 'nameserver %s\n' "$dns_addr" >"$SUITE_WORK/resolv.conf"
    resolver="$SUITE_WORK/resolv.conf"
    say "*.$SUITE_TLS_DOMAIN resolves to the node for pytest only (DNS on $dns_addr)"
  else
    say "the DNS server did not start ($(cat "$SUITE_WORK/dns.log")); host-routing tests deselected"
  fi
fi
if [ -z "$resolver" ]; then
  E2B_SUITE_EXCLUSIONS="$E2B_SUITE_EXCLUSIONS:$ROOT/orchestrator/tests/e2b-suite-exclusions-no-resolver.txt"
fi
# Containers (the default class) lack what needs a kernel of the sandbox's own (root, memory
# snapshots, a boot id of its own); under gVisor (SUITE_ISOLATION=gvisor) those run, and what
# gVisor of these machines lacks is listed instead.
if [ "${SUITE_ISOLATION:-container}" = gvisor ]; then
  E2B_SUITE_EXCLUSIONS="$E2B_SUITE_EXCLUSIONS:$ROOT/orchestrator/tests/e2b-suite-exclusions-gvisor.txt"
else
  E2B_SUITE_EXCLUSIONS="$E2B_SUITE_EXCLUSIONS:$ROOT/orchestrator/tests/e2b-suite-exclusions-container.txt"
fi
# The tests of one SDK against a newer release: their mocks of functions it no longer calls.
if [ "$run_version" != "$sdk_version" ]; then
  E2B_SUITE_EXCLUSIONS="$E2B_SUITE_EXCLUSIONS:$ROOT/orchestrator/tests/e2b-suite-exclusions-newer-sdk.txt"
fi

say "running E2B's suite ($SDK: tests of e2b $sdk_version) against the SDK e2b $ran, with the exclusions of ${E2B_SUITE_EXCLUSIONS//"$ROOT"\//}"
export E2B_SUITE_SDK_RAN="e2b ${ran%% *} (tests of $sdk_version)"
cd "$SDK"
set +e
# -P: the SDK's own source folder beside the tests is not put first on sys.path; the tests run
# against the installed PyPI release, as a user's code would. The caller's PYTHONPATH is not
# kept: the SDK is the one chosen above.
in_namespace=()
if [ -n "$resolver" ]; then
  # shellcheck disable=SC2016 # expanded by the inner shell
  in_namespace=(unshare --mount --propagation private sh -c
    'mount --bind "$0" /etc/resolv.conf && exec "$@"' "$resolver")
fi
"${in_namespace[@]}" env PYTHONPATH="$RUN_PYTHONPATH" python3 -P -m pytest \
  -p e2b_suite_plugin -p no:cacheprovider \
  tests/sync/sandbox_sync tests/sync/api_sync "$@"
status=$?
set -e
say "reproduce: ${E2B_SUITE_SDK:+E2B_SUITE_SDK=$E2B_SUITE_SDK }scripts/e2b_suite.sh $SDK"
exit "$status"
