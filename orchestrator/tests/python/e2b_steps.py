"""What the E2B SDK clients in this folder share: a step recorded in the report whatever it
raises, waiting for a condition, reading what a sandbox wrote, telling the Rust test that a step
is done, a terminal's end, a fork by the raw HTTP API, a sandbox whose processes hold state in memory, and the fields of a sandbox's latest log line of one kind.

Each client imports it from beside itself (python3 puts a script's folder first on its path).
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

from e2b import CommandExitException, Sandbox


def attempt(report, name, fn):
    """Records `fn()` under `name`: its value, or which exception it raised and why."""
    try:
        report[name] = {"ok": True, "value": fn()}
    except Exception as e:  # the report says which step failed and how
        report[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}


def read_int(sbx, path):
    """The number a file of the sandbox holds (-1 while it is empty)."""
    text = sbx.files.read(path).strip()
    return int(text) if text else -1


def written(sbx, path):
    """The file's content once it has some (a REPL opens a file before it writes to it)."""
    return sbx.files.exists(path) and sbx.files.read(path)


def wait_for(what, check, seconds=30):
    """`check()`'s first true value; raises, naming `what`, when none came within `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {seconds} s")
        time.sleep(0.2)


def step(name):
    """Tells the test a step is done, and waits for it to have looked (a line on stdin)."""
    print(f"STEP {name}", file=sys.stderr, flush=True)
    sys.stdin.readline()


def terminal_end(t):
    """Waits for the terminal `t` to end: (what it printed, decoded; its exit code)."""
    chunks = []
    try:
        t.wait(on_pty=lambda d: chunks.append(bytes(d)))
        code = 0
    except CommandExitException as e:
        code = e.exit_code
    return b"".join(chunks).decode(errors="replace"), code


def latest_log_fields(sbx_id, prefix):
    """The fields of the sandbox's latest log line that starts with `prefix` (`{}` if none)."""
    url = os.environ["E2B_API_URL"].rstrip("/") + f"/v2/sandboxes/{sbx_id}/logs"
    req = urllib.request.Request(url, headers={"X-API-KEY": os.environ["E2B_API_KEY"]})
    with urllib.request.urlopen(req, timeout=30) as r:
        logs = json.load(r).get("logs", [])
    found = [l for l in logs if l.get("message", "").startswith(prefix)]
    return (found[-1].get("fields") or {}) if found else {}


def raw_fork(sandbox_id, key):
    """A raw `POST /sandboxes/{id}/fork` made with `key`: (status, what it kept, its answer)."""
    url = os.environ["E2B_API_URL"].rstrip("/") + f"/sandboxes/{sandbox_id}/fork"
    req = urllib.request.Request(
        url,
        data=b"{}",
        method="POST",
        headers={"X-API-KEY": key, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.headers.get("x-aegis-fork-kept"), json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, None, None


def counting_sandbox_with_repl(report):
    """A `base` sandbox (with its network, the SDK's default) running a background shell loop
    that counts in a shell variable ten times a second, showing its count in the file `counter`
    (the count lives in the shell's memory only: a loop started again would count from 1), and
    a Python REPL reading stdin. The sandbox's id and the two pids go into `report`; (the
    sandbox, the REPL's handle)."""
    sbx = Sandbox.create("base", timeout=300)
    report["sandbox_id"] = sbx.sandbox_id
    loop = sbx.commands.run(
        "i=0; while true; do i=$((i+1)); echo $i > /home/user/counter.tmp; "
        "mv /home/user/counter.tmp /home/user/counter; sleep 0.1; done",
        background=True,
        timeout=0,
    )
    repl = sbx.commands.run("python3 -q -u -i", background=True, stdin=True, timeout=0)
    report["pids"] = sorted([loop.pid, repl.pid])
    return sbx, repl
