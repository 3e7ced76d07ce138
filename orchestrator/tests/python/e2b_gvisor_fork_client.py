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
import time

from e2b import Sandbox

from e2b_steps import counting_sandbox_with_repl, latest_log_fields, raw_fork, read_int, step, wait_for, written


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
    sbx, repl = counting_sandbox_with_repl(report)
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
    report["second_fork_files_only_because"] = latest_log_fields(sbx.sandbox_id, "sandbox forked").get("files_only_because")
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
