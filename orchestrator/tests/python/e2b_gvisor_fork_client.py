"""Fork that keeps memory, through E2B's own Python SDK, unmodified: a gVisor sandbox runs a
background shell loop counting in a shell variable and a Python REPL holding a value; it is
forked into two (`Sandbox.fork(count=2)`). Each fork, and the source, must run on with the
same processes and their state; a file written in one fork is in no other; another API key
cannot fork it (404, by the raw HTTP API); a second fork of the source (restored by the first)
keeps its files only and says why; the forks are killed, then the source.

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, E2B_OTHER_API_KEY.
Prints one JSON report on stdout; the Rust test (tests/suite/gvisor_pause.rs) judges it, and
looks at Docker and the rows between the steps it is told about on stderr.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

from e2b import Sandbox


def read_int(sbx, path):
    text = sbx.files.read(path).strip()
    return int(text) if text else -1


def written(sbx, path):
    """The file's content once it has some (a REPL opens a file before it writes to it)."""
    return sbx.files.exists(path) and sbx.files.read(path)


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


def latest_fork_fields(sbx_id):
    """The fields of the sandbox's latest fork log line."""
    url = os.environ["E2B_API_URL"].rstrip("/") + f"/v2/sandboxes/{sbx_id}/logs"
    req = urllib.request.Request(url, headers={"X-API-KEY": os.environ["E2B_API_KEY"]})
    with urllib.request.urlopen(req, timeout=30) as r:
        logs = json.load(r).get("logs", [])
    forked = [l for l in logs if l.get("message", "").startswith("sandbox forked")]
    return (forked[-1].get("fields") or {}) if forked else {}


def looked_at(sbx, repl_pid, name):
    """What runs in `sbx`: its loop's count twice, its processes, the REPL's value."""
    seen = {"counter": read_int(sbx, "counter")}
    time.sleep(1.5)
    seen["counter_later"] = read_int(sbx, "counter")
    seen["pids"] = sorted(p.pid for p in sbx.commands.list())
    sbx.commands.send_stdin(
        repl_pid, f"open('/home/user/after-{name}', 'w').write(str(secret_plus_one()))\n"
    )
    seen["repl"] = wait_for(f"the REPL's answer in {name}", lambda: written(sbx, f"after-{name}"))
    return seen


def main():
    report = {}
    sbx = Sandbox.create("base", timeout=300)  # with its network, the SDK's default
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
    sbx.commands.send_stdin(
        repl.pid, "secret = [41]; secret_plus_one = lambda: secret[0] + 1\n"
    )
    sbx.commands.send_stdin(repl.pid, "open('/home/user/before', 'w').write('ready')\n")
    wait_for("the REPL's first answer", lambda: written(sbx, "before"))
    wait_for("the loop counting", lambda: sbx.files.exists("counter") and read_int(sbx, "counter") > 20)
    report["counter_before_fork"] = read_int(sbx, "counter")

    started = time.monotonic()
    made = sbx.fork(count=2, timeout=300)
    report["fork_ms"] = int((time.monotonic() - started) * 1000)  # measured, not judged
    for fork in made:
        if isinstance(fork, Exception):
            raise fork
    report["fork_ids"] = [f.sandbox_id for f in made]
    step("forked")

    everyone = [("source", sbx), ("fork0", made[0]), ("fork1", made[1])]
    for name, s in everyone:
        report[name] = looked_at(s, repl.pid, name)
    # Each has a workspace of its own.
    made[0].files.write("only-in-fork0", "x")
    report["has_fork0_file"] = {name: s.files.exists("only-in-fork0") for name, s in everyone}
    report["command_in_fork1"] = made[1].commands.run("echo forked").stdout.strip()

    # Another key sees no such sandbox.
    report["other_key_fork"] = raw_fork(sbx.sandbox_id, os.environ["E2B_OTHER_API_KEY"])[0]
    # The source runs in the new container its restore started: a second fork keeps memory too.
    _, kept, answer = raw_fork(sbx.sandbox_id, os.environ["E2B_API_KEY"])
    report["second_fork_kept"] = kept
    report["second_fork_files_only_because"] = latest_fork_fields(sbx.sandbox_id).get("files_only_because")
    for result in answer or []:
        if result.get("sandbox"):
            Sandbox.connect(result["sandbox"]["sandboxID"]).kill()

    for fork in made:
        fork.kill()
    step("forks_killed")
    report["source_after_kills"] = read_int(sbx, "counter") > report["source"]["counter_later"]
    sbx.kill()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
