#!/usr/bin/env bash
# E2B's code-interpreter test suite, run by hand against a node of ours (issue 46): the tests
# of python/tests/sync, charts and images of e2b-dev/code-interpreter, unmodified, through E2B's
# code-interpreter SDK pointed at the node by the exports an E2B user sets. Not part of our CI
# (it needs a copy of E2B's repository, which is never committed here):
#
#   git -C <code-interpreter clone> archive <commit> python | tar -x -C /tmp/e2b-ci-suite
#   scripts/e2b_ci_suite.sh /tmp/e2b-ci-suite/python [pytest args, e.g. tests/charts -k bar]
#
# The tests run against the SDK scripts/test.sh installs for tests/suite/code_interpreter.rs,
# target/e2b-ci-sdk (e2b-code-interpreter 2.11.5, installed here when missing), never against the
# copy's own source; the copy's version is printed beside it. With pytest and pytest-asyncio
# (the suite's async tests), installed when missing; the suite's pytest.ini asks for
# pytest-xdist's two workers, replaced here by one process so the plugin sees every result.
#
# What it does: builds the `code-interpreter` runtime image when stale, starts a node on a fresh
# database (scripts/lib/suite_node.sh: ORCHESTRATOR_BIN, SANDBOX_EXECUTOR_BIN, DATABASE_URL as
# scripts/e2b_suite.sh takes them), runs pytest on tests/sync, tests/charts and tests/images (or
# the paths given), deselecting the tests listed in orchestrator/tests/e2b-ci-suite-exclusions.txt
# (`<node id> | <reason>` a line), prints passed, failed and excluded per directory and per
# reason, then stops the node and removes what it left. Exits with pytest's status.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOG_TAG=e2b-ci-suite
# shellcheck source=scripts/lib/prepare.sh
source "$ROOT/scripts/lib/prepare.sh"
# shellcheck source=scripts/lib/suite_node.sh
source "$ROOT/scripts/lib/suite_node.sh"

[ $# -ge 1 ] || die "usage: scripts/e2b_ci_suite.sh <path to code-interpreter's python folder> [pytest args]"
SUITE="$(cd "$1" && pwd)" || die "no such directory: $1"
shift
[ -f "$SUITE/tests/conftest.py" ] && [ -d "$SUITE/tests/charts" ] && [ -d "$SUITE/tests/sync" ] \
  || die "$SUITE is not code-interpreter's python folder (no tests/charts, tests/sync)"
EXCLUSIONS="$ROOT/orchestrator/tests/e2b-ci-suite-exclusions.txt"
[ -f "$EXCLUSIONS" ] || die "missing $EXCLUSIONS"
suite_version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$SUITE/pyproject.toml" | head -n1)

SDK_PATH="$ROOT/target/e2b-ci-sdk"
SDK_VERSION=$(sed -n "s/^e2b_ci=\"\{0,1\}\([0-9.]*\)\"\{0,1\}.*/\1/p" "$ROOT/scripts/test.sh" | head -n1)
[ -n "$SDK_VERSION" ] || die "no e2b_ci=\"<version>\" in scripts/test.sh"
if [ ! -d "$SDK_PATH/e2b_code_interpreter-$SDK_VERSION.dist-info" ]; then
  say "installing e2b-code-interpreter $SDK_VERSION from PyPI into target/e2b-ci-sdk"
  env -u PYTHONPATH python3 -m pip install -q --target "$SDK_PATH" "e2b-code-interpreter==$SDK_VERSION" >&2 \
    || die "cannot install e2b-code-interpreter==$SDK_VERSION (pip)"
fi
if ! env -u PYTHONPATH python3 -c 'import pytest, pytest_asyncio' 2>/dev/null; then
  say "installing pytest and pytest-asyncio from PyPI"
  env -u PYTHONPATH python3 -m pip install -q "pytest>=9.0.3,<10" "pytest-asyncio>=1.3.0,<2" >&2 \
    || die "cannot install pytest (pip)"
fi
RUN_PYTHONPATH="$ROOT/scripts/lib:$SDK_PATH"
ran=$(cd / && PYTHONPATH="$RUN_PYTHONPATH" python3 -P -c 'import importlib.metadata as m; print(m.version("e2b-code-interpreter"), m.version("e2b"))') \
  || die "the SDK does not import (PYTHONPATH=$RUN_PYTHONPATH)"

start_suite_node code-interpreter
export E2B_SUITE_EXCLUSIONS="$EXCLUSIONS"
export E2B_SUITE_SDK_RAN="e2b-code-interpreter ${ran% *} with e2b ${ran#* } (tests of code-interpreter ${suite_version:-?})"
unset E2B_TESTS_TEMPLATE
say "running $SUITE/tests (code-interpreter ${suite_version:-?}) against $E2B_SUITE_SDK_RAN, with the exclusions of ${EXCLUSIONS#"$ROOT"/}"
cd "$SUITE"
# The three folders unless the arguments name tests themselves.
named=0
for arg in "$@"; do case "$arg" in tests/*) named=1 ;; esac; done
[ "$named" = 1 ] || set -- tests/sync tests/charts tests/images "$@"
set +e
# -P: the SDK source beside the tests is not imported; -o addopts: the suite's own options less
# xdist's workers; -c: the suite's pytest.ini (markers, asyncio mode).
PYTHONPATH="$RUN_PYTHONPATH" python3 -P -m pytest -c pytest.ini -o addopts=--import-mode=importlib \
  -p e2b_suite_plugin -p no:cacheprovider "$@"
status=$?
set -e
say "reproduce: scripts/e2b_ci_suite.sh $SUITE"
exit "$status"
