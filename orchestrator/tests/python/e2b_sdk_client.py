"""Drives a node through E2B's own Python SDK (PyPI `e2b`, pinned by scripts/test.sh), unmodified:
only E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY point it at the node.

Usage: e2b_sdk_client.py <scenario> ; environment: the three exports, plus for `attacks`
E2B_OTHER_KEY (another operator key) and E2B_BOUND_KEY (a key bound to a narrow context).
Prints one JSON report on stdout; every step records what happened, the Rust test judges it.
"""

import asyncio
import datetime
import io
import json
import os
import sys
import time
import urllib.request
import urllib.error

from e2b import AsyncSandbox, CommandExitException, PtySize, Sandbox, SandboxQuery, SandboxState
from e2b.sandbox.signature import get_signature

from e2b_steps import attempt, terminal_end


def http_status(url, data=None):
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def basics():
    report = {}
    t0 = time.monotonic()
    sbx = Sandbox.create("base", timeout=120, metadata={"suite": "e2b", "n": "1"})
    first = sbx.commands.run("echo hello from e2b")
    report["create_to_first_output_ms"] = int((time.monotonic() - t0) * 1000)
    report["sandbox_id"] = sbx.sandbox_id
    report["echo"] = {"stdout": first.stdout, "exit_code": first.exit_code}
    attempt(report, "pwd", lambda: sbx.commands.run("pwd").stdout.strip())
    attempt(report, "pipe", lambda: sbx.commands.run("echo abc | tr a-c x-z").stdout.strip())
    attempt(report, "python", lambda: sbx.commands.run("python3 -c 'print(6*7)'").stdout.strip())
    attempt(report, "node", lambda: sbx.commands.run("node -e 'console.log(7*6)'").stdout.strip())
    attempt(report, "whoami", lambda: sbx.commands.run("whoami").stdout.strip())
    attempt(report, "no_network", lambda: sbx.commands.run("python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), 3)'").stdout)

    def failure(line):
        """How a command that must fail failed: the SDK's exception, exit code and stderr."""
        try:
            sbx.commands.run(line)
            return "no exception"
        except Exception as e:
            return {"type": type(e).__name__, "exit_code": getattr(e, "exit_code", None),
                    "stderr": getattr(e, "stderr", None)}

    attempt(report, "failing", lambda: failure("ls /home/user/nope"))

    # A plain line of a program runs as its own argv (no bash in between, so none of the
    # variables bash sets); a builtin still means what bash makes of it; a program that does
    # not exist gets bash's answer.
    attempt(report, "direct_environ", lambda: sbx.commands.run("cat /proc/self/environ").stdout)
    attempt(report, "shell_environ", lambda: sbx.commands.run("cat /proc/self/environ; true").stdout)
    attempt(report, "builtin_cd", lambda: sbx.commands.run("cd /tmp").exit_code)
    # A line the policy would refuse as an argv (`python3 -m` runs code) runs under bash as ever.
    attempt(report, "code_option_line", lambda: sbx.commands.run("python3 -m site --user-base").stdout)

    attempt(report, "not_found", lambda: failure("no-such-program-e2b --flag"))
    attempt(report, "write", lambda: sbx.files.write("notes/a.txt", "héllo ✓").path)
    attempt(report, "read", lambda: sbx.files.read("notes/a.txt"))
    attempt(report, "cat", lambda: sbx.commands.run("cat /home/user/notes/a.txt").stdout)
    attempt(report, "exists", lambda: [sbx.files.exists("notes/a.txt"), sbx.files.exists("notes/zz")])
    attempt(report, "stat", lambda: (lambda i: {"name": i.name, "type": str(i.type), "size": i.size, "path": i.path})(sbx.files.get_info("notes/a.txt")))
    attempt(report, "make_dir", lambda: [sbx.files.make_dir("made/deep"), sbx.files.make_dir("made/deep")])
    attempt(report, "rename", lambda: sbx.files.rename("notes/a.txt", "notes/b.txt").path)
    attempt(report, "list", lambda: sorted(e.path for e in sbx.files.list("/home/user", depth=2)))
    attempt(report, "remove", lambda: [sbx.files.remove("notes/b.txt"), sbx.files.exists("notes/b.txt")])
    attempt(report, "write_files", lambda: [w.path for w in sbx.files.write_files([
        {"path": "multi/one.txt", "data": "1"}, {"path": "multi/two.bin", "data": b"\x00\xff\x01"}])])
    attempt(report, "read_binary", lambda: list(sbx.files.read("multi/two.bin", format="bytes")))
    # Larger than the node's file size limit (10 MiB): it moves in chunks, both ways.
    big = bytes((i * 7 + 3) % 256 for i in range(12 * 1024 * 1024 + 17))
    attempt(report, "upload_big", lambda: sbx.files.write("big.bin", big).path)
    attempt(report, "download_big", lambda: bytes(sbx.files.read("big.bin", format="bytes")) == big)
    attempt(report, "big_size", lambda: sbx.commands.run("stat -c %s big.bin").stdout.strip())
    attempt(report, "text_chunks", lambda: (lambda t: sbx.files.write("t.txt", t) and sbx.files.read("t.txt") == t)("é" * (3 * 1024 * 1024)))
    attempt(report, "root_refused", lambda: sbx.commands.run("id", user="root").stdout)
    attempt(report, "list_filtered", lambda: [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"suite": "e2b"})).next_items()])
    attempt(report, "list_other_filter", lambda: [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"suite": "other"})).next_items()])
    second = Sandbox.create("base", timeout=60, metadata={"suite": "e2b", "n": "2"})
    report["second_id"] = second.sandbox_id

    def pages():
        p = Sandbox.list(query=SandboxQuery(metadata={"suite": "e2b"}), limit=1, order="asc")
        first_page = [s.sandbox_id for s in p.next_items()]
        more = p.has_next
        second_page = [s.sandbox_id for s in p.next_items()]
        return {"first": first_page, "more": more, "second": second_page, "done": not p.has_next}

    attempt(report, "pages", pages)
    attempt(report, "connect", lambda: Sandbox.connect(second.sandbox_id, timeout=30).commands.run("echo again").stdout)
    second.kill()
    attempt(report, "info_metadata", lambda: sbx.get_info().metadata)
    attempt(report, "set_timeout", lambda: sbx.set_timeout(60))
    # A signed URL without the sandbox's headers, then a forged and an expired one.
    url = sbx.download_url("big.bin", use_signature_expiration=60)
    report["signed_download"] = http_status(url)[0]
    forged = url.replace("signature=v1_", "signature=v1_A")
    report["forged_download"] = http_status(forged)[0]
    # A signed upload URL writes that one path; a read URL's signature does not write.
    boundary = "b0und4ry"
    form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"signed/up.txt\"\r\n\r\n"
            f"via a signed url\r\n--{boundary}--\r\n").encode()

    def post(u):
        req = urllib.request.Request(u, data=form, method="POST",
                                     headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    report["signed_upload"] = post(sbx.upload_url("signed/up.txt", use_signature_expiration=60))
    attempt(report, "signed_upload_read", lambda: sbx.files.read("signed/up.txt"))
    report["read_url_upload"] = post(sbx.download_url("signed/up.txt", use_signature_expiration=60))
    # Signed with the SDK's own helper, valid until a minute ago.
    old = get_signature("big.bin", "read", None, sbx._envd_access_token, expiration_in_seconds=-60)
    expired = sbx._file_url("big.bin", None, old["signature"], old["expiration"])
    report["expired_download"] = list(map(lambda x: x if isinstance(x, int) else x.decode(errors="replace"), http_status(expired)))
    attempt(report, "kill", lambda: sbx.kill())
    attempt(report, "kill_again", lambda: Sandbox.kill(sbx.sandbox_id))
    attempt(report, "after_kill", lambda: sbx.commands.run("echo still here").stdout)
    # A sandbox left to its timeout.
    short = Sandbox.create("base", timeout=3)
    report["short_id"] = short.sandbox_id
    print(json.dumps(report))


def live():
    """Processes that outlive the call that started them, terminals and watches."""
    report = {}
    sbx = Sandbox.create("base", timeout=180)
    report["sandbox_id"] = sbx.sandbox_id

    # The command cannot end before its first line reached the callback: the callback writes
    # the file it waits for. Output that came only at the end would never release it.
    def streaming():
        seen = []

        def on_stdout(s):
            seen.append(s)
            if "first" in s:
                sbx.files.write("release", "go")

        r = sbx.commands.run("echo first; while [ ! -f /home/user/release ]; do sleep 0.05; done; echo second",
                             on_stdout=on_stdout, timeout=60)
        return {"seen": seen, "stdout": r.stdout}

    attempt(report, "streaming", streaming)

    def background():
        h = sbx.commands.run("echo started; sleep 1; echo done-bg; exit 3", background=True)
        try:
            h.wait()
            return "no exception"
        except CommandExitException as e:
            return {"pid": h.pid, "stdout": e.stdout, "exit_code": e.exit_code}

    attempt(report, "background", background)

    def stdin():
        h = sbx.commands.run("cat; echo eof", background=True, stdin=True)
        sbx.commands.send_stdin(h.pid, "hello stdin\n")
        sbx.commands.send_stdin(h.pid, "second line\n")
        sbx.commands.close_stdin(h.pid)
        return h.wait().stdout

    attempt(report, "stdin", stdin)

    def kill():
        h = sbx.commands.run("sleep 600", background=True)
        killed = sbx.commands.kill(h.pid)
        try:
            h.wait()
            return {"killed": killed, "wait": "no exception"}
        except CommandExitException as e:
            return {"killed": killed, "exit_code": e.exit_code, "error": e.error,
                    "again": sbx.commands.kill(h.pid)}

    attempt(report, "kill", kill)

    def connect():
        h = sbx.commands.run("echo before; while [ ! -f /home/user/go2 ]; do sleep 0.05; done; echo after",
                             background=True)
        pid = h.pid
        h.disconnect()
        listed = [{"pid": p.pid, "cmd": p.cmd, "args": p.args} for p in sbx.commands.list()]
        c = sbx.commands.connect(pid)
        sbx.files.write("go2", "go")
        r = c.wait()
        return {"pid": pid, "listed": listed, "stdout": r.stdout,
                "after_end": [p.pid for p in sbx.commands.list()]}

    attempt(report, "connect", connect)

    # Re-attaching while the Start stream is still open: both streams get every event.
    def connect_open():
        h = sbx.commands.run("echo one; while [ ! -f /home/user/go3 ]; do sleep 0.05; done; echo two",
                             background=True)
        c = sbx.commands.connect(h.pid)
        # Both Connects before the process is let go: once it has ended, a Connect is refused
        # (as envd refuses it), and under load it may end before a later Connect arrives.
        second = sbx.commands.connect(h.pid)
        sbx.files.write("go3", "go")
        first, other = h.wait(), c.wait()
        return {"pid": h.pid, "connected": [c.pid, second.pid], "start": first.stdout,
                "connect": other.stdout, "second": second.wait().stdout}

    attempt(report, "connect_open", connect_open)

    def pty():
        t = sbx.pty.create(PtySize(rows=24, cols=80))
        sbx.pty.resize(t.pid, PtySize(rows=30, cols=100))
        sbx.pty.send_stdin(t.pid, b"stty size; exit 4\n")
        output, code = terminal_end(t)
        other = sbx.pty.create(PtySize(rows=10, cols=40))
        return {"output": output, "exit_code": code, "kill": sbx.pty.kill(other.pid)}

    attempt(report, "pty", pty)

    def watch():
        sbx.files.make_dir("watched")
        w = sbx.files.watch_dir("watched")
        sbx.files.write("watched/new.txt", "x")
        events = []
        for _ in range(100):
            events += [{"name": e.name, "type": str(e.type)} for e in w.get_new_events()]
            if any(e["name"] == "new.txt" for e in events):
                break
            time.sleep(0.1)
        w.stop()
        return events

    attempt(report, "watch", watch)

    # The async SDK watches through the WatchDir stream (recursive here).
    def watch_stream():
        async def go():
            a = await AsyncSandbox.connect(sbx.sandbox_id)
            seen, got = [], asyncio.Event()

            def on_event(e):
                seen.append({"name": e.name, "type": str(e.type)})
                if e.name == "sub/streamed.txt":
                    got.set()

            await a.files.make_dir("watched/sub")
            h = await a.files.watch_dir("watched", on_event=on_event, recursive=True)
            await a.files.write("watched/sub/streamed.txt", "y")
            await asyncio.wait_for(got.wait(), 60)
            await h.stop()
            return seen

        return asyncio.run(go())

    attempt(report, "watch_stream", watch_stream)
    sbx.kill()
    print(json.dumps(report))


def attacks():
    report = {}
    sbx = Sandbox.create("base", timeout=120)
    report["sandbox_id"] = sbx.sandbox_id
    other = os.environ["E2B_OTHER_KEY"]
    attempt(report, "other_connect", lambda: Sandbox.connect(sbx.sandbox_id, api_key=other).commands.run("echo hi").stdout)
    attempt(report, "other_kill", lambda: Sandbox.kill(sbx.sandbox_id, api_key=other))
    attempt(report, "other_list", lambda: [s.sandbox_id for s in Sandbox.list(api_key=other).next_items()])
    # The token is what makes an envd call: without it (or with another) nothing answers.
    base = os.environ["E2B_SANDBOX_URL"]
    for name, token in [("no_token", None), ("wrong_token", "0" * 64)]:
        headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "Content-Type": "application/json",
                   "Connect-Protocol-Version": "1"}
        if token:
            headers["X-Access-Token"] = token
        req = urllib.request.Request(base + "/filesystem.Filesystem/ListDir",
                                     data=json.dumps({"path": "/home/user"}).encode(),
                                     headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                report[name] = [r.status, r.read().decode()]
        except urllib.error.HTTPError as e:
            report[name] = [e.code, e.read().decode()]
    attempt(report, "outside_path", lambda: sbx.files.read("/etc/passwd"))
    attempt(report, "watch_outside", lambda: sbx.files.watch_dir("/etc").stop())
    # Another key's sandbox names no process of this one, by pid or otherwise.
    mine = sbx.commands.run("sleep 600", background=True)
    theirs = Sandbox.create("base", timeout=60, api_key=other)
    attempt(report, "other_process_kill", lambda: theirs.commands.kill(mine.pid))
    attempt(report, "other_process_connect", lambda: theirs.commands.connect(mine.pid).pid)
    attempt(report, "other_process_stdin", lambda: theirs.commands.send_stdin(mine.pid, "x"))
    attempt(report, "other_process_list", lambda: [p.pid for p in theirs.commands.list()])
    attempt(report, "own_process_kill", lambda: sbx.commands.kill(mine.pid))
    theirs.kill()
    attempt(report, "outside_write", lambda: sbx.files.write("/tmp/../etc/x", "x").path)
    attempt(report, "dotdot", lambda: sbx.files.read("../../etc/passwd"))
    sbx.kill()
    bound = os.environ["E2B_BOUND_KEY"]
    conf = Sandbox.create("base", timeout=120, api_key=bound)
    report["bound_id"] = conf.sandbox_id
    attempt(report, "bound_echo", lambda: conf.commands.run("echo confined").stdout)
    attempt(report, "bound_cat", lambda: conf.commands.run("cat /home/user/x").stdout)
    attempt(report, "bound_shell", lambda: conf.commands.run("echo a | cat").stdout)
    attempt(report, "bound_background", lambda: conf.commands.run("echo in the background", background=True).wait().stdout)
    attempt(report, "bound_background_out", lambda: conf.commands.run("sleep 30", background=True).pid)
    attempt(report, "bound_pty", lambda: conf.pty.create(PtySize(rows=24, cols=80)).pid)
    attempt(report, "bound_watch_out", lambda: conf.files.watch_dir("/home/user").stop())
    attempt(report, "bound_write_in", lambda: conf.files.write("/home/user/shared/ok.txt", "ok").path)
    attempt(report, "bound_write_out", lambda: conf.files.write("/home/user/private.txt", "no").path)
    conf.kill()
    print(json.dumps(report))


def conformance():
    """What E2B's own test suite asks of a server and the node once answered otherwise
    (scripts/e2b_suite.sh runs that suite): environments and directories of commands and
    terminals, command deadlines, a sandbox gone under a running command or past its timeout,
    removing what is not there, listing order, what a stat tells, symlinks, watch events of
    written files."""
    report = {}
    sbx = Sandbox.create("base", timeout=180, envs={"SBX_VAR": "from-create", "OVERRIDE": "sandbox"})
    report["sandbox_id"] = sbx.sandbox_id
    attempt(report, "sandbox_env", lambda: sbx.commands.run("echo $SBX_VAR $OVERRIDE", envs={"OVERRIDE": "command"}).stdout)
    # A value is data, never run: quotes and $(...) arrive as written.
    tricky = "it's $(id) `id` \"q\""
    attempt(report, "command_env", lambda: sbx.commands.run(
        "python3 -c \"import os; print(os.environ['FOO'])\"", envs={"FOO": tricky}).stdout)
    report["tricky"] = tricky
    attempt(report, "env_forbidden", lambda: sbx.commands.run("true", envs={"LD_PRELOAD": "/home/user/x.so"}).stdout)
    attempt(report, "cwd_root", lambda: sbx.commands.run("pwd", cwd="/").stdout)

    def terminal():
        chunks = []
        t = sbx.pty.create(PtySize(rows=24, cols=80), envs={"ABC": "123"}, cwd="/")
        sbx.pty.send_stdin(t.pid, b"echo ABC=$ABC; pwd; exit\n")
        r = t.wait(on_pty=lambda d: chunks.append(bytes(d)))
        return {"exit_code": r.exit_code, "output": b"".join(chunks).decode(errors="replace")}

    attempt(report, "terminal", terminal)

    def deadline():
        t0 = time.monotonic()
        try:
            sbx.commands.run("sleep 10", timeout=2)
            return "no exception"
        except Exception as e:
            return {"type": type(e).__name__, "secs": round(time.monotonic() - t0, 1)}

    attempt(report, "deadline", deadline)
    attempt(report, "remove_missing", lambda: sbx.files.remove("nowhere/none.txt"))
    sbx.files.make_dir("ord/a/x")
    sbx.files.write("ord/a-b", "1")
    attempt(report, "list_order", lambda: [e.path for e in sbx.files.list("ord", depth=2)])

    def info(path):
        i = sbx.files.get_info(path)
        return {"type": str(i.type), "size": i.size, "mode": i.mode, "permissions": i.permissions,
                "modified": i.modified_time.timestamp() if i.modified_time else None,
                "symlink_target": i.symlink_target}

    sbx.files.write("d/f.txt", "hey")
    report["now"] = time.time()
    attempt(report, "dir_info", lambda: info("d"))
    attempt(report, "file_info", lambda: info("d/f.txt"))
    sbx.commands.run("chmod 600 f.txt && ln -s f.txt link && ln -s /etc/passwd out", cwd="d")
    attempt(report, "chmod_info", lambda: info("d/f.txt"))
    attempt(report, "link_info", lambda: info("d/link"))
    attempt(report, "out_link_info", lambda: info("d/out"))

    def rename_dir():
        sbx.files.write_files([{"path": "mv/src/a.txt", "data": "A"}, {"path": "mv/src/sub/b.bin", "data": b"\x00\xff"}])
        sbx.files.make_dir("mv/src/empty")
        moved = sbx.files.rename("mv/src", "mv/dst")
        return {"path": moved.path, "type": str(moved.type),
                "tree": [e.path for e in sbx.files.list("mv/dst", depth=3)],
                "source_left": sbx.files.exists("mv/src"),
                "b": list(sbx.files.read("mv/dst/sub/b.bin", format="bytes"))}

    attempt(report, "rename_dir", rename_dir)
    sbx.files.make_dir("mv/taken")
    attempt(report, "rename_dir_onto", lambda: sbx.files.rename("mv/dst", "mv/taken").path)
    attempt(report, "rename_dir_into_itself", lambda: sbx.files.rename("mv/dst", "mv/dst/inner").path)

    # envd 0.6's file metadata: kept with the file (what a program sets in its namespace too),
    # carried by a rename, replaced by the next write.
    def metadata():
        meta = {"author": "mish", "purpose": "upload"}
        written = sbx.files.write("meta/a.txt", "x", metadata=meta).metadata
        info = sbx.files.get_info("meta/a.txt").metadata
        listed = [e.metadata for e in sbx.files.list("meta") if e.name == "a.txt"]
        sbx.commands.run("python3 -c \"import os; os.setxattr('/home/user/meta/a.txt', 'user.e2b.extra', b'set inside')\"")
        after_xattr = sbx.files.get_info("meta/a.txt").metadata
        moved = sbx.files.rename("meta/a.txt", "meta/b.txt").metadata
        moved_info = sbx.files.get_info("meta/b.txt").metadata
        plain = sbx.files.write("meta/b.txt", "y").metadata
        cleared = sbx.files.get_info("meta/b.txt").metadata
        return {"written": written, "info": info, "listed": listed, "after_xattr": after_xattr,
                "moved": moved, "moved_info": moved_info, "plain": plain, "cleared": cleared}

    attempt(report, "metadata", metadata)
    # gzip uploads, from memory and streamed; a body that is not gzip, a coding not served.
    text = "zipped text " * 20000
    attempt(report, "gzip", lambda: [sbx.files.write("gz/a.txt", text, gzip=True).path, sbx.files.read("gz/a.txt") == text])
    attempt(report, "gzip_stream", lambda: [sbx.files.write("gz/b.txt", io.BytesIO(text.encode()), gzip=True).path, sbx.files.read("gz/b.txt") == text])

    def raw_upload(encoding):
        req = urllib.request.Request(
            os.environ["E2B_SANDBOX_URL"] + "/files?path=gz/raw.txt", data=b"not gzip at all", method="POST",
            headers={"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token,
                     "Content-Type": "application/octet-stream", "Content-Encoding": encoding})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    report["bad_gzip"] = raw_upload("gzip")
    report["brotli"] = raw_upload("br")

    def watch_entries():
        sbx.files.make_dir("we")
        h = sbx.files.watch_dir("we", include_entry=True, allow_network_mounts=True)
        sbx.files.write("we/f.txt", "hello")
        events = []
        for _ in range(40):
            events += h.get_new_events()
            if any(str(e.type).endswith("WRITE") for e in events):
                break
            time.sleep(0.05)
        h.stop()
        return [{"name": e.name, "type": str(e.type),
                 "entry": None if e.entry is None else {"name": e.entry.name, "path": e.entry.path,
                                                        "type": str(e.entry.type), "size": e.entry.size}}
                for e in events]

    attempt(report, "watch_entries", watch_entries)

    def watch():
        sbx.files.make_dir("w")
        h = sbx.files.watch_dir("w")
        sbx.files.write("w/new.txt", "first")
        sbx.files.write("w/new.txt", "second")
        events = []
        for _ in range(40):
            events += [{"name": e.name, "type": str(e.type)} for e in h.get_new_events()]
            if len(events) >= 6:
                break
            time.sleep(0.05)
        h.stop()
        return events

    attempt(report, "watch", watch)

    # A directory made beneath a recursive watch, and what is written in it at once: one poll,
    # right after, has it all (no second chance). The second directory and its file are made
    # by one command, before any watch of theirs can exist.
    def watch_nested():
        sbx.files.make_dir("wn")
        h = sbx.files.watch_dir("wn", recursive=True)
        sbx.files.make_dir("wn/sub")
        sbx.files.write("wn/sub/f.txt", "content")
        first = [{"name": e.name, "type": str(e.type)} for e in h.get_new_events()]
        sbx.commands.run("mkdir -p wn/a/b && echo hi > wn/a/b/g.txt")
        second = [{"name": e.name, "type": str(e.type)} for e in h.get_new_events()]
        h.stop()
        return {"first": first, "second": second}

    attempt(report, "watch_nested", watch_nested)

    # A sandbox past its timeout is not running, even before the sweep removes it.
    short = Sandbox.create("base", timeout=3)
    time.sleep(4)
    attempt(report, "past_timeout_running", lambda: short.is_running())

    # A sandbox killed under a running command: the command's stream breaks and the SDK, asking
    # /health, learns the sandbox is gone.
    doomed = Sandbox.create("base", timeout=60)
    cmd = doomed.commands.run("sleep 60", background=True)
    doomed.kill()

    def killed_under():
        try:
            cmd.wait()
            return "no exception"
        except Exception as e:
            return {"type": type(e).__name__, "message": str(e)}

    attempt(report, "killed_under", killed_under)
    attempt(report, "killed_running", lambda: doomed.is_running())
    attempt(report, "alive_running", lambda: sbx.is_running())
    sbx.kill()
    report["short_id"] = short.sandbox_id
    report["doomed_id"] = doomed.sandbox_id
    print(json.dumps(report))


def bench():
    """Create to first output and a command's round trip, N times each (N from argv)."""
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    firsts, trips = [], []
    for _ in range(n):
        t0 = time.monotonic()
        sbx = Sandbox.create("base", timeout=60)
        sbx.commands.run("echo ready")
        firsts.append((time.monotonic() - t0) * 1000)
        for _ in range(5):
            t1 = time.monotonic()
            sbx.commands.run("true")
            trips.append((time.monotonic() - t1) * 1000)
        sbx.kill()

    sbx = Sandbox.create("base", timeout=300)
    payload = os.urandom(64 * 1024 * 1024)
    t0 = time.monotonic()
    sbx.files.write("bench.bin", payload)
    up = time.monotonic() - t0
    t0 = time.monotonic()
    back = sbx.files.read("bench.bin", format="bytes")
    down = time.monotonic() - t0
    assert bytes(back) == payload
    sbx.kill()

    def pct(values, p):
        values = sorted(values)
        return round(values[min(len(values) - 1, int(p * len(values)))], 1)

    print(json.dumps({
        "runs": n,
        "create_to_first_output_ms": {"p50": pct(firsts, 0.5), "p95": pct(firsts, 0.95)},
        "command_round_trip_ms": {"p50": pct(trips, 0.5), "p95": pct(trips, 0.95)},
        "upload_64mib_mib_per_s": round(64 / up, 1),
        "download_64mib_mib_per_s": round(64 / down, 1),
    }))


def api_get(path):
    """GET on the control API with the key, for routes the SDK has no method for."""
    req = urllib.request.Request(os.environ["E2B_API_URL"] + path,
                                 headers={"X-API-KEY": os.environ["E2B_API_KEY"]})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def pause_resume():
    """Pause keeps the files and ends the processes; connect and resume bring the files back."""
    report = {}
    sbx = Sandbox.create("base", timeout=120, metadata={"suite": "pause"})
    report["sandbox_id"] = sbx.sandbox_id
    payload = bytes(range(256)) * 5
    sbx.files.write("keep/a.txt", "kept across a pause")
    sbx.files.write("keep/bin.dat", payload)
    sbx.files.make_dir("empty/dir")
    sleeper = sbx.commands.run("sleep 300", background=True)
    report["sleeper_pid"] = sleeper.pid
    attempt(report, "listed_before", lambda: [p.cmd for p in sbx.commands.list()])
    attempt(report, "pause", lambda: sbx.pause())
    attempt(report, "running_after_pause", lambda: sbx.is_running())
    attempt(report, "pause_again", lambda: Sandbox.pause(sbx.sandbox_id))
    attempt(report, "info_paused", lambda: str(Sandbox.get_info(sbx.sandbox_id).state))
    attempt(report, "listed_paused", lambda: [(s.sandbox_id, str(s.state)) for s in Sandbox.list(query=SandboxQuery(metadata={"suite": "pause"})).next_items()])
    attempt(report, "read_while_paused", lambda: sbx.files.read("keep/a.txt"))
    attempt(report, "connect", lambda: sbx.connect(timeout=120).sandbox_id)
    attempt(report, "running_after_connect", lambda: sbx.is_running())
    attempt(report, "read_after", lambda: sbx.files.read("keep/a.txt"))
    attempt(report, "binary_after", lambda: bytes(sbx.files.read("keep/bin.dat", format="bytes")) == payload)
    attempt(report, "empty_dir_after", lambda: sbx.files.exists("empty/dir"))
    attempt(report, "processes_after", lambda: [p.cmd for p in sbx.commands.list()])
    attempt(report, "command_after", lambda: sbx.commands.run("cat keep/a.txt").stdout)
    # A second cycle through the class methods, as another process of the user would.
    attempt(report, "pause_by_id", lambda: Sandbox.pause(sbx.sandbox_id))
    attempt(report, "connect_by_id", lambda: Sandbox.connect(sbx.sandbox_id, timeout=60).files.read("keep/a.txt"))
    attempt(report, "resume_running", lambda: http_status_with_key(f"/sandboxes/{sbx.sandbox_id}/resume", {"timeout": 30}))
    attempt(report, "logs", lambda: [l["message"] for l in api_get(f"/v2/sandboxes/{sbx.sandbox_id}/logs")[1]["logs"]])
    attempt(report, "kill", lambda: sbx.kill())
    # Paused, then killed while paused: its row and snapshot go.
    gone = Sandbox.create("base", timeout=60)
    report["killed_paused_id"] = gone.sandbox_id
    attempt(report, "pause_then_kill", lambda: [gone.pause(), gone.kill(), Sandbox.kill(gone.sandbox_id)])
    # Left paused, for the test to look at Docker and the rows.
    left = Sandbox.create("base", timeout=60)
    left.files.write("left.txt", "still here")
    report["left_paused_id"] = left.sandbox_id
    attempt(report, "left_paused", lambda: left.pause())
    print(json.dumps(report))


def http_status_with_key(path, body):
    req = urllib.request.Request(os.environ["E2B_API_URL"] + path, data=json.dumps(body).encode(),
                                 method="POST", headers={"X-API-KEY": os.environ["E2B_API_KEY"],
                                                         "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def snapshots():
    """Snapshots and forks: independent sandboxes from the same files; listing; metrics."""
    report = {}
    sbx = Sandbox.create("base", timeout=180)
    created = datetime.datetime.now(datetime.timezone.utc)
    report["sandbox_id"] = sbx.sandbox_id
    sbx.files.write("shared.txt", "shared snapshot content")
    sbx.files.write("app/config.json", '{"env": "test"}')
    attempt(report, "snapshot", lambda: (lambda s: {"id": s.snapshot_id, "names": s.names})(sbx.create_snapshot(name="snap-one")))
    snap_id = report["snapshot"]["value"]["id"] if report["snapshot"]["ok"] else "none"
    attempt(report, "running_after_snapshot", lambda: sbx.is_running())
    sbx.files.write("later.txt", "after the snapshot")

    def two_from_snapshot():
        one = Sandbox.create(snap_id, timeout=60)
        two = Sandbox.create(snap_id, timeout=60)
        try:
            out = {"ids": [one.sandbox_id, two.sandbox_id],
                   "read": [one.files.read("shared.txt"), two.files.read("shared.txt")],
                   "config": one.files.read("app/config.json"),
                   "later": one.files.exists("later.txt")}
            one.files.write("shared.txt", "changed in one")
            out["after"] = [one.files.read("shared.txt"), two.files.read("shared.txt"),
                            sbx.files.read("shared.txt")]
            return out
        finally:
            one.kill()
            two.kill()

    attempt(report, "from_snapshot", two_from_snapshot)
    attempt(report, "by_name", lambda: (lambda n: [n.files.read("shared.txt"), n.kill()])(Sandbox.create("snap-one", timeout=60)))
    attempt(report, "second_snapshot", lambda: sbx.create_snapshot().snapshot_id)

    def listing():
        everything = [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
        mine = [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()]
        named = [s.snapshot_id for s in Sandbox.list_snapshots(name="snap-one").next_items()]
        nothing = Sandbox.list_snapshots(name="snap-none").next_items()
        pages = Sandbox.list_snapshots(limit=1)
        first = [s.snapshot_id for s in pages.next_items()]
        more = pages.has_next
        second = [s.snapshot_id for s in pages.next_items()]
        return {"all": everything, "mine": mine, "named": named, "nothing": nothing,
                "first": first, "more": more, "second": second, "done": not pages.has_next}

    attempt(report, "list", listing)

    def forks():
        made = sbx.fork(count=2, timeout=60)
        boxes = [f for f in made if isinstance(f, Sandbox)]
        try:
            out = {"count": len(made), "sandboxes": len(boxes), "ids": [b.sandbox_id for b in boxes],
                   "read": [b.files.read("later.txt") for b in boxes]}
            boxes[0].files.write("later.txt", "fork zero")
            out["after"] = [b.files.read("later.txt") for b in boxes] + [sbx.files.read("later.txt")]
            return out
        finally:
            for b in boxes:
                b.kill()

    attempt(report, "fork", forks)

    def metrics():
        m = sbx.get_metrics()
        past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
        old = sbx.get_metrics(start=past, end=past + datetime.timedelta(minutes=30))
        # The sandbox's first 10 s, asked for once they are well past: only kept samples.
        wait = (created + datetime.timedelta(seconds=25) - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
        if wait > 0:
            time.sleep(wait)
        early = sbx.get_metrics(start=created, end=created + datetime.timedelta(seconds=10))
        return {"samples": [{"cpu_count": x.cpu_count, "cpu_used_pct": x.cpu_used_pct,
                             "mem_used": x.mem_used, "mem_total": x.mem_total,
                             "disk_used": x.disk_used, "disk_total": x.disk_total} for x in m],
                "past": len(old),
                "early": [x.timestamp.timestamp() - created.timestamp() for x in early]}

    sbx.files.write("fill.bin", os.urandom(3 * 1024 * 1024))
    attempt(report, "metrics", metrics)
    attempt(report, "delete", lambda: [Sandbox.delete_snapshot(snap_id), Sandbox.delete_snapshot(snap_id)])
    attempt(report, "create_deleted", lambda: Sandbox.create(snap_id, timeout=30).sandbox_id)
    attempt(report, "kill", lambda: sbx.kill())
    attempt(report, "fork_killed", lambda: sbx.fork())
    print(json.dumps(report))


def snapshot_attacks():
    """Another key, hostile contents, and the quota."""
    report = {}
    other = {"api_key": os.environ["E2B_OTHER_KEY"]}
    sbx = Sandbox.create("base", timeout=120)
    report["sandbox_id"] = sbx.sandbox_id
    sbx.files.write("secret.txt", "mine")
    # Links out and in, set-id bits: what a snapshot must not carry as such.
    attempt(report, "plant", lambda: sbx.commands.run(
        "ln -s /etc/passwd out_link; ln -s secret.txt in_link; echo hi > suid.sh; "
        "chmod 6755 suid.sh; ls -l; stat -c %a suid.sh").stdout.strip())
    attempt(report, "snapshot", lambda: sbx.create_snapshot().snapshot_id)
    snap_id = report["snapshot"].get("value", "none")

    def restored():
        copy = Sandbox.create(snap_id, timeout=60)
        try:
            return {"secret": copy.files.read("secret.txt"),
                    "out_link": copy.files.exists("out_link"),
                    "in_link": copy.files.exists("in_link"),
                    "suid": copy.commands.run("stat -c '%a %U' suid.sh").stdout.strip()}
        finally:
            copy.kill()

    attempt(report, "restored", restored)
    hostile = os.environ.get("E2B_HOSTILE_SNAPSHOT")
    if hostile:
        def from_hostile():
            copy = Sandbox.create(hostile, timeout=60)
            try:
                return {"listing": copy.commands.run("find . -printf '%p %y %m\\n' | sort").stdout,
                        "ok": copy.files.read("ok.txt"),
                        "passwd_link": copy.files.exists("evil"),
                        "etc_written": copy.commands.run("test -e /etc/hostile && echo present || echo absent").stdout.strip()}
            finally:
                copy.kill()

        attempt(report, "hostile", from_hostile)
    # Another key sees nothing of mine.
    attempt(report, "other_pause", lambda: Sandbox.pause(sbx.sandbox_id, **other))
    attempt(report, "other_snapshot", lambda: Sandbox.create_snapshot(sbx.sandbox_id, **other).snapshot_id)
    attempt(report, "other_list", lambda: [s.snapshot_id for s in Sandbox.list_snapshots(**other).next_items()])
    attempt(report, "other_create", lambda: Sandbox.create(snap_id, timeout=30, **other).sandbox_id)
    attempt(report, "other_delete", lambda: Sandbox.delete_snapshot(snap_id, **other))
    attempt(report, "other_fork", lambda: Sandbox.fork(sbx.sandbox_id, **other))
    attempt(report, "other_metrics", lambda: Sandbox.get_metrics(sbx.sandbox_id, **other))
    attempt(report, "pause", lambda: sbx.pause())
    attempt(report, "other_connect", lambda: Sandbox.connect(sbx.sandbox_id, **other).sandbox_id)
    attempt(report, "other_kill", lambda: Sandbox.kill(sbx.sandbox_id, **other))
    attempt(report, "still_paused", lambda: str(Sandbox.get_info(sbx.sandbox_id).state))
    # The quota (the test sets 3 snapshots and 1 MiB a key): a pause and a snapshot are held.
    big = Sandbox.create("base", timeout=60)
    big.files.write("big.bin", os.urandom(2 * 1024 * 1024))
    attempt(report, "too_large", lambda: big.create_snapshot().snapshot_id)
    big.kill()
    attempt(report, "third", lambda: Sandbox.create("base", timeout=30).create_snapshot().snapshot_id)
    attempt(report, "over_count", lambda: Sandbox.create("base", timeout=30).create_snapshot().snapshot_id)
    attempt(report, "resume", lambda: Sandbox.connect(sbx.sandbox_id, timeout=60).files.read("secret.txt"))
    print(json.dumps(report))


def auto_pause():
    """A sandbox whose timeout pauses it (`lifecycle.on_timeout = pause`, no auto-resume): paused
    at its timeout with its files, refused by envd until connect() resumes it."""
    report = {}
    sbx = Sandbox.create("base", timeout=3, lifecycle={"on_timeout": "pause", "auto_resume": False},
                         metadata={"suite": "auto-pause"})
    report["sandbox_id"] = sbx.sandbox_id
    attempt(report, "lifecycle", lambda: sbx.get_info().lifecycle)
    sbx.files.write("kept.txt", "kept at the timeout")
    time.sleep(5)
    attempt(report, "state", lambda: str(sbx.get_info().state))
    attempt(report, "running", lambda: sbx.is_running())
    attempt(report, "listed_paused", lambda: [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"suite": "auto-pause"}, state=[SandboxState.PAUSED])).next_items()])
    attempt(report, "command_while_paused", lambda: sbx.commands.run("echo no").stdout)
    attempt(report, "read_while_paused", lambda: sbx.files.read("kept.txt"))
    # Settled: the pause is stored (the sweep may still have been taking it above).
    for _ in range(50):
        if Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED and api_get(f"/sandboxes/{sbx.sandbox_id}")[1].get("pauseMode"):
            break
        time.sleep(0.2)
    attempt(report, "connect", lambda: sbx.connect(timeout=60).sandbox_id)
    attempt(report, "state_after", lambda: str(sbx.get_info().state))
    attempt(report, "running_after", lambda: sbx.is_running())
    attempt(report, "read_after", lambda: sbx.files.read("kept.txt"))
    attempt(report, "logs", lambda: [l["message"] for l in api_get(f"/v2/sandboxes/{sbx.sandbox_id}/logs")[1]["logs"]])
    attempt(report, "logs_v1", lambda: api_get(f"/sandboxes/{sbx.sandbox_id}/logs?limit=100")[1])
    attempt(report, "kill", lambda: sbx.kill())
    # Memory kept over the pause is asked for explicitly: refused, nothing made.
    attempt(report, "keep_memory", lambda: Sandbox.create("base", timeout=3, lifecycle={"on_timeout": {"action": "pause", "keep_memory": True}}).sandbox_id)
    print(json.dumps(report))


SNAPSHOT_SCENARIOS = {"pause_resume": pause_resume, "snapshots": snapshots,
                      "snapshot_attacks": snapshot_attacks, "auto_pause": auto_pause}


if __name__ == "__main__":
    {"basics": basics, "live": live, "attacks": attacks, "conformance": conformance,
     "bench": bench, **SNAPSHOT_SCENARIOS}[sys.argv[1]]()
