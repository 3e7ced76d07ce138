"""Pause and resume, and fork, of an E2B sandbox holding 256 MiB of memory, timed through E2B's
own Python SDK for orchestrator/examples/isolation_bench.rs (one node of one isolation class).

Each iteration makes a sandbox whose Python REPL holds 256 MiB of random bytes (untimed) and
times `pause()` followed by `connect()` (the resume); then another such sandbox and times
`fork(count=1)` (answered once the fork runs). Fresh sandboxes each time: a gVisor container
started from a checkpoint is not checkpointed again on this engine.

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, BENCH_PAUSES.
Prints one JSON object: pause_resume_ms and fork_ms (lists), kept_memory (whether the REPL
survived every pause) and fork_kept_memory (whether every fork had it).
"""

import json
import os
import time

from e2b import Sandbox

BLOB = "import os; blob = os.urandom(256 << 20); open('/home/user/{name}', 'w').write('1')\n"


def wait_for(what, check, seconds=120):
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {seconds} s")
        time.sleep(0.1)


def hold_memory(sbx, name):
    """A REPL holding 256 MiB; its pid once it does."""
    h = sbx.commands.run("python3 -q -u -i", background=True, stdin=True, timeout=0)
    sbx.commands.send_stdin(h.pid, BLOB.format(name=name))
    wait_for("256 MiB in memory", lambda: sbx.files.exists(name))
    return h.pid


def main():
    pauses = int(os.environ.get("BENCH_PAUSES", "3"))
    report = {"pause_resume_ms": [], "fork_ms": [], "kept_memory": True, "fork_kept_memory": True}
    for i in range(pauses):
        # A fresh sandbox each time: a gVisor container started from a checkpoint is not
        # checkpointed again on Docker 20.10 with runsc 2022-12 (its pause keeps the files).
        sbx = Sandbox.create("base", timeout=1200, allow_internet_access=False)
        pid = hold_memory(sbx, f"held-{i}")
        started = time.monotonic()
        sbx.pause()
        sbx.connect(timeout=1200)
        report["pause_resume_ms"].append((time.monotonic() - started) * 1000)
        if not any(p.pid == pid for p in sbx.commands.list()):
            report["kept_memory"] = False
        sbx.kill()
        sbx = Sandbox.create("base", timeout=1200, allow_internet_access=False)
        pid = hold_memory(sbx, f"held-{i}")
        started = time.monotonic()
        made = sbx.fork(count=1, timeout=300)
        report["fork_ms"].append((time.monotonic() - started) * 1000)
        for fork in made:
            if isinstance(fork, Exception):
                raise fork
            if not any(p.pid == pid for p in fork.commands.list()):
                report["fork_kept_memory"] = False
            fork.kill()
        sbx.kill()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
