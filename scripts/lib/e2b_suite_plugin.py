"""A pytest plugin for scripts/e2b_suite.sh: E2B's own test suite against our node, minus the
tests listed in one exclusions file with the reason each cannot pass here.

E2B_SUITE_EXCLUSIONS names the file, or several joined by `:` (scripts/e2b_suite.sh adds
e2b-suite-exclusions-newer-sdk.txt when the tests of one SDK run against a newer release); each
holds one entry a line, `<pytest node id> | <reason>`; `#` starts a comment. A node id is exact (`tests/sync/.../test_run.py::test_run`), or a whole file
(`tests/sync/.../test_fork.py`). Excluded tests are deselected, never run; an entry that names
no collected test is reported, so the list cannot go stale silently. At the end the plugin
prints the SDK the tests ran against (E2B_SUITE_SDK_RAN, from scripts/e2b_suite.sh), passed,
failed and excluded per reason and per directory, and the failures' ids.
"""

import os
from collections import Counter

import pytest

_entries = {}  # node id or file -> reason
_excluded = []  # (node id, reason)


def _load(path):
    entries = {}
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if "|" not in line:
                raise pytest.UsageError(f"{path}:{number}: expected `<node id> | <reason>`")
            node, reason = (part.strip() for part in line.split("|", 1))
            if not node or not reason:
                raise pytest.UsageError(f"{path}:{number}: a node id and a reason are both needed")
            entries[node] = reason
    return entries


def pytest_configure(config):
    for path in filter(None, os.environ.get("E2B_SUITE_EXCLUSIONS", "").split(os.pathsep)):
        for node, reason in _load(path).items():
            if node in _entries:
                raise pytest.UsageError(f"{path}: {node} is excluded twice")
            _entries[node] = reason


def _reason_of(nodeid):
    if nodeid in _entries:
        return nodeid, _entries[nodeid]
    file = nodeid.split("::", 1)[0]
    if file in _entries:
        return file, _entries[file]
    return None, None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    keep, drop, used = [], [], set()
    for item in items:
        entry, reason = _reason_of(item.nodeid)
        if reason is None:
            keep.append(item)
        else:
            used.add(entry)
            drop.append(item)
            _excluded.append((item.nodeid, reason))
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    config._e2b_suite_unused = sorted(set(_entries) - used)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    stats = terminalreporter.stats
    count = lambda key: len(stats.get(key, []))
    failed_ids = sorted({r.nodeid for r in stats.get("failed", []) + stats.get("error", [])})
    tr = terminalreporter
    tr.section("E2B suite against the node")
    if os.environ.get("E2B_SUITE_SDK_RAN"):
        tr.write_line(f"sdk:      {os.environ['E2B_SUITE_SDK_RAN']}")
    tr.write_line(f"passed:   {count('passed')}")
    tr.write_line(f"failed:   {len(failed_ids)}")
    tr.write_line(f"skipped:  {count('skipped')}")
    tr.write_line(f"excluded: {len(_excluded)}")
    for reason, n in Counter(reason for _, reason in _excluded).most_common():
        tr.write_line(f"  {n:3d}  {reason}")
    # The same per directory of the suite (tests/sync, tests/charts, ...).
    folder = lambda nodeid: nodeid.split("::", 1)[0].rsplit("/", 1)[0]
    by_dir = {}
    for key in ("passed", "failed", "error", "skipped"):
        for report in stats.get(key, []):
            if getattr(report, "when", "call") == "call" or key in ("failed", "error", "skipped"):
                by_dir.setdefault(folder(report.nodeid), Counter())[key if key != "error" else "failed"] += 1
    for nodeid, _ in _excluded:
        by_dir.setdefault(folder(nodeid), Counter())["excluded"] += 1
    for name in sorted(by_dir):
        c = by_dir[name]
        total = sum(c.values())
        tr.write_line(
            f"{name}: {c['passed']} passed / {total} ({c['failed']} failed, {c['skipped']} skipped, {c['excluded']} excluded)"
        )
    for nodeid in failed_ids:
        tr.write_line(f"FAILED {nodeid}")
    for entry in getattr(config, "_e2b_suite_unused", []):
        tr.write_line(f"UNUSED exclusion (names no collected test): {entry}")
