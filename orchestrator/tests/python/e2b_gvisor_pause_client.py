"""Pause that keeps memory, through E2B's own Python SDK, unmodified: a gVisor sandbox runs a
background shell loop counting in a shell variable and a Python REPL holding a value; it is
paused (the SDK's default keeps memory), then resumed by connect(); both must still run with
their state. Then it is paused and resumed twice more (each pause keeps memory again: the loop
counts on and the REPL answers each time), paused a fourth time and killed while paused. Then
the other kinds: a pause at
the timeout (autoPause) keeps memory too; `keep_memory=False`, at a pause or in the lifecycle's
timeout pause, keeps the files only (the REPL is gone after the resume, its file is not).

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY.
Prints one JSON report on stdout; the Rust test (tests/suite/gvisor_pause.rs) judges it, and
looks at Docker and the rows between the steps it is told about on stderr.
"""

import json
import os
import sys
import time
import urllib.request

from e2b import Sandbox

from e2b_steps import counting_sandbox_with_repl, latest_log_fields, raw_fork, read_int, step, wait_for, written


def pause_logged(sbx_id):
    """The log line of the sandbox's latest pause at its timeout, once the sweep stored it (its
    state says paused from the moment its timeout passes, before that)."""
    url = os.environ["E2B_API_URL"].rstrip("/") + f"/v2/sandboxes/{sbx_id}/logs"
    req = urllib.request.Request(url, headers={"X-API-KEY": os.environ["E2B_API_KEY"]})
    with urllib.request.urlopen(req, timeout=30) as r:
        logs = json.load(r).get("logs", [])
    lines = [l.get("message", "") for l in logs if "at its timeout" in l.get("message", "")]
    return lines[-1] if lines else None


def start_repl(sbx, name="auto"):
    """A Python REPL holding `kept = 42`, which it wrote to `<name>.before`."""
    h = sbx.commands.run("python3 -q -u -i", background=True, stdin=True, timeout=0)
    sbx.commands.send_stdin(h.pid, f"kept = 42; open('/home/user/{name}.before', 'w').write(str(kept))\n")
    wait_for("the REPL's first answer", lambda: written(sbx, f"{name}.before"))
    return h.pid


def ask_repl(sbx, pid, name):
    sbx.commands.send_stdin(pid, f"open('/home/user/{name}.after', 'w').write(str(kept))\n")
    wait_for("the REPL's answer", lambda: written(sbx, f"{name}.after"))
    return sbx.files.read(f"{name}.after")


def main():
    report = {}
    sbx, repl = counting_sandbox_with_repl(report)
    sbx.commands.send_stdin(repl.pid, "import os; secret = [41]; secret.append(os.getpid())\n")
    sbx.commands.send_stdin(
        repl.pid, "open('/home/user/before', 'w').write(str(sum(secret[:1]) + 1))\n"
    )
    wait_for("the REPL's first answer", lambda: written(sbx, "before"))
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
    wait_for("the REPL's answer after the resume", lambda: written(sbx, "after"))
    report["repl_after"] = sbx.files.read("after")
    report["command_after"] = sbx.commands.run("echo again").stdout.strip()

    # Paused and resumed twice more: each pause keeps memory (a resume starts a new container
    # from the checkpoint, which can be checkpointed again).
    report["cycles"] = []
    for n in (2, 3):
        before = read_int(sbx, "counter")
        sbx.pause()
        fields = latest_log_fields(sbx.sandbox_id, "sandbox paused")
        step(f"paused_{n}")
        sbx.connect(timeout=300)
        at_resume = read_int(sbx, "counter")
        time.sleep(1.0)
        later = read_int(sbx, "counter")
        pids = sorted(p.pid for p in sbx.commands.list())
        sbx.commands.send_stdin(
            repl.pid, f"open('/home/user/after{n}', 'w').write(str(secret[0] + 1) + ' ' + str(secret[1] == os.getpid()))\n"
        )
        wait_for(f"the REPL's answer after resume {n}", lambda: written(sbx, f"after{n}"))
        report["cycles"].append({
            "counter_before": before,
            "files_only_because": fields.get("files_only_because"),
            "counter_at_resume": at_resume,
            "counter_later": later,
            "pids": pids,
            "repl": sbx.files.read(f"after{n}"),
        })

    # Paused a fourth time, then killed while paused.
    sbx.pause()
    step("paused_again")
    sbx.kill()
    report["killed"] = True

    # autoPause keeps memory (`autoPauseMemory: true`, which a container template is refused):
    # the REPL answers after the timeout paused it.
    auto = Sandbox.create("base", timeout=300, allow_internet_access=False,
                          lifecycle={"on_timeout": {"action": "pause", "keep_memory": True}})
    a = start_repl(auto)
    auto.set_timeout(1)
    report["auto_pause_log"] = wait_for("the timeout pause", lambda: pause_logged(auto.sandbox_id))
    auto.connect(timeout=300)
    report["auto_repl_after"] = ask_repl(auto, a, "auto")
    # keep_memory=False at a pause: the files only, the REPL is gone.
    auto.pause(keep_memory=False)
    auto.connect(timeout=300)
    report["files_pause_pids_after"] = [p.pid for p in auto.commands.list()]
    report["files_pause_file_kept"] = auto.files.read("auto.before")
    auto.kill()

    # keep_memory=False in the lifecycle: the timeout pause keeps the files only.
    cold = Sandbox.create("base", timeout=300, allow_internet_access=False,
                          lifecycle={"on_timeout": {"action": "pause", "keep_memory": False}})
    start_repl(cold, "cold")
    cold.set_timeout(1)
    report["cold_pause_log"] = wait_for("the timeout pause", lambda: pause_logged(cold.sandbox_id))
    cold.connect(timeout=300)
    report["cold_pids_after"] = [p.pid for p in cold.commands.list()]
    report["cold_file_kept"] = cold.files.read("cold.before")
    cold.kill()

    # Measured, not judged: pause and resume of a sandbox holding 256 MiB of random bytes.
    big = Sandbox.create("base", timeout=300, allow_internet_access=False)
    b = big.commands.run("python3 -q -u -i", background=True, stdin=True, timeout=0)
    big.commands.send_stdin(b.pid, "import hashlib, os; blob = os.urandom(256 << 20); "
                            "digest = hashlib.sha256(blob).hexdigest(); "
                            "open('/home/user/big.before', 'w').write(digest)\n")
    wait_for("256 MiB in memory",
             lambda: written(big, "big.before"), 120)
    t0 = time.monotonic()
    big.pause()
    t1 = time.monotonic()
    step("big_paused")
    t2 = time.monotonic()
    big.connect(timeout=300)
    t3 = time.monotonic()
    # The digest is made before the file is opened: the file appears with its content.
    big.commands.send_stdin(b.pid, "after = hashlib.sha256(blob).hexdigest(); "
                            "open('/home/user/big.after', 'w').write(after)\n")
    wait_for("the digest after the resume",
             lambda: written(big, "big.after"), 120)
    report["big_same"] = big.files.read("big.after") == big.files.read("big.before")
    report["big_pause_ms"] = int((t1 - t0) * 1000)
    report["big_resume_ms"] = int((t3 - t2) * 1000)
    big.kill()
    print(json.dumps(report))


def replicas():
    """Paused through replica A, resumed through replica B beside the same engine: B restores
    it and serves it, its REPL's value intact. Environment: E2B_URL_A, E2B_URL_B."""
    a = {"api_url": os.environ["E2B_URL_A"], "sandbox_url": os.environ["E2B_URL_A"]}
    b = {"api_url": os.environ["E2B_URL_B"], "sandbox_url": os.environ["E2B_URL_B"]}
    report = {}
    # With its network (the SDK's default): its egress proxy moves with it.
    sbx = Sandbox.create("base", timeout=300, **a)
    report["sandbox_id"] = sbx.sandbox_id
    pid = start_repl(sbx, "moved")
    sbx.pause()
    there = Sandbox.connect(sbx.sandbox_id, timeout=300, **b)
    report["pids_after"] = [p.pid == pid for p in there.commands.list()]
    report["repl_after"] = ask_repl(there, pid, "moved")
    step("resumed_on_b")
    there.kill()
    print(json.dumps(report))


def fallback():
    """On an engine that cannot checkpoint: pause() and a fork keep the files, and the log says
    why."""
    report = {}
    sbx = Sandbox.create("base", timeout=300, allow_internet_access=False)
    start_repl(sbx, "fallback")
    sbx.pause()
    report["files_only_because"] = latest_log_fields(sbx.sandbox_id, "sandbox paused").get(
        "files_only_because"
    )
    sbx.connect(timeout=300)
    report["pids_after"] = [p.pid for p in sbx.commands.list()]
    report["file_kept"] = sbx.files.read("fallback.before")
    # A fork keeps the files too (the raw API, for the header saying what it kept).
    status, report["fork_kept"], forked = raw_fork(sbx.sandbox_id, os.environ["E2B_API_KEY"])
    if forked is None:
        raise RuntimeError(f"the fork was answered {status}")
    fork_id = forked[0]["sandbox"]["sandboxID"]
    fork = Sandbox.connect(fork_id)
    report["fork_file_kept"] = fork.files.read("fallback.before")
    report["fork_pids"] = [p.pid for p in fork.commands.list()]
    fork.kill()
    report["fork_files_only_because"] = latest_log_fields(sbx.sandbox_id, "sandbox forked").get(
        "files_only_because"
    )
    sbx.kill()
    print(json.dumps(report))


if __name__ == "__main__":
    if sys.argv[1:] == ["replicas"]:
        replicas()
    elif sys.argv[1:] == ["fallback"]:
        fallback()
    else:
        main()
