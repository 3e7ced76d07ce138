"""`!command` and `x = !command` in the code interpreter's Python kernel without a terminal (an
IPython extension loaded at kernel start, see ipython_kernel_config.py).

IPython runs shell escapes through pexpect, which needs a pseudo-terminal; a sandbox opens
none for its processes (openpty is refused), so `!pwd` failed with "out of pty devices". Here
the command runs under /bin/bash -c with pipes instead: its stdout and stderr stream to the
cell's as they come, its status is `_exit_code`, and an interrupt stops it.
"""

import os
import signal
import subprocess
import sys
import threading


def _copy(stream, sink):
    for chunk in iter(lambda: stream.read1(65536), b""):
        sink.write(chunk.decode("utf-8", "replace"))
        sink.flush()
    stream.close()


def _start(cmd, stderr):
    return subprocess.Popen(
        ["/bin/bash", "-c", cmd],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
        start_new_session=True,
        cwd=os.getcwd(),
    )


def _wait(proc):
    try:
        return proc.wait()
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise


def load_ipython_extension(ip):
    from IPython.utils.text import SList

    def system(cmd):
        """`!cmd`: run it, its output streamed into the cell's."""
        proc = _start(ip.var_expand(cmd, depth=1), subprocess.PIPE)
        pumps = [
            threading.Thread(target=_copy, args=(proc.stdout, sys.stdout), daemon=True),
            threading.Thread(target=_copy, args=(proc.stderr, sys.stderr), daemon=True),
        ]
        for pump in pumps:
            pump.start()
        status = _wait(proc)
        for pump in pumps:
            pump.join()
        ip.user_ns["_exit_code"] = status

    def getoutput(cmd, split=True, depth=0):
        """`x = !cmd`: its output (stdout and stderr) as IPython's SList of lines."""
        proc = _start(ip.var_expand(cmd, depth=depth + 1), subprocess.STDOUT)
        out, _ = proc.communicate()
        ip.user_ns["_exit_code"] = proc.returncode
        text = out.decode("utf-8", "replace")
        return SList(text.splitlines()) if split else text

    ip.system = system
    ip.system_piped = system
    ip.getoutput = getoutput
