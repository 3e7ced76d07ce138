"""Pause that keeps memory, through E2B's own Python SDK, unmodified: a gVisor sandbox runs a
background shell loop counting in a shell variable and a Python REPL holding a value; it is
paused (the SDK's default keeps memory), then resumed by connect(); both must still run with
their state. Then it is paused again and killed while paused.

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY.
Prints one JSON report on stdout; the Rust test (tests/suite/gvisor_pause.rs) judges it, and
looks at Docker and the rows between the steps it is told about on stderr.
"""

import json
import sys
import time

from e2b import Sandbox


def read_int(sbx, path):
    text = sbx.files.read(path).strip()
    return int(text) if text else -1


def wait_for(what, check, seconds=30):
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


def main():
    report = {}
    sbx = Sandbox.create("base", timeout=300, allow_internet_access=False)
    report["sandbox_id"] = sbx.sandbox_id
    # The count lives in the shell's memory; the file only shows it. A loop started again
    # would count from 1.
    loop = sbx.commands.run(
        "i=0; while true; do i=$((i+1)); echo $i > /home/user/counter.tmp; "
        "mv /home/user/counter.tmp /home/user/counter; sleep 0.1; done",
        background=True,
        timeout=0,
    )
    repl = sbx.commands.run("python3 -q -u -i", background=True, stdin=True, timeout=0)
    report["pids"] = sorted([loop.pid, repl.pid])
    sbx.commands.send_stdin(repl.pid, "import os; secret = [41]; secret.append(os.getpid())\n")
    sbx.commands.send_stdin(
        repl.pid, "open('/home/user/before', 'w').write(str(sum(secret[:1]) + 1))\n"
    )
    wait_for("the REPL's first answer", lambda: sbx.files.exists("before"))
    report["repl_before"] = sbx.files.read("before")
    wait_for("the loop counting", lambda: sbx.files.exists("counter") and read_int(sbx, "counter") > 20)

    sbx.pause()
    report["state_paused"] = str(Sandbox.get_info(sbx.sandbox_id).state)
    # Read from the workspace the holder keeps (not through the sandbox, which is paused).
    step("paused")

    sbx.connect(timeout=300)
    report["running_after_connect"] = sbx.is_running()
    after = read_int(sbx, "counter")
    report["counter_at_resume"] = after
    time.sleep(1.5)
    report["counter_later"] = read_int(sbx, "counter")
    report["pids_after"] = sorted(p.pid for p in sbx.commands.list())
    # The REPL's variable, asked for after the resume: only the same process has it.
    sbx.commands.send_stdin(
        repl.pid, "open('/home/user/after', 'w').write(str(secret[0] + 1) + ' ' + str(secret[1] == os.getpid()))\n"
    )
    wait_for("the REPL's answer after the resume", lambda: sbx.files.exists("after"))
    report["repl_after"] = sbx.files.read("after")
    report["command_after"] = sbx.commands.run("echo again").stdout.strip()

    # Paused again, then killed while paused: its checkpoint and holder go.
    sbx.pause()
    step("paused_again")
    sbx.kill()
    report["killed"] = True
    print(json.dumps(report))


if __name__ == "__main__":
    main()
