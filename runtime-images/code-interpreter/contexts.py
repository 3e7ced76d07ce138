"""The code interpreter's contexts: one persistent interpreter each, run as the sandbox user.

Python contexts are Debian's ipykernel driven through jupyter_client (messages as Jupyter sends
them). Debian packages no JavaScript, TypeScript, R, Java or bash Jupyter kernel, so a
JavaScript context is one persistent node process running repl.js (TypeScript: the same with
each cell compiled by Debian's TypeScript compiler), an R context one R process running repl.R,
a Java context one JVM running JavaRepl (our driver of the JDK's JShell API), and a bash
context one persistent bash process; all are driven over pipes with a sentinel per execution
(Java: a framed report channel, JavaRepl.java says why).

Every context yields the same "lines" (dicts) that server.py writes as NDJSON, in the shape
E2B's SDK parses: stdout, stderr, result, error, number_of_executions.
"""

import base64
import codecs
import datetime
import json
import os
import queue
import secrets
import signal
import subprocess
import threading
import uuid

HOME = "/home/user"
HERE = os.path.dirname(os.path.abspath(__file__))
# Bounds of one execution: output bytes sent (stdout + stderr + results), images returned.
MAX_OUTPUT_BYTES = int(os.environ.get("AEGIS_CI_MAX_OUTPUT_BYTES", str(8 * 1024 * 1024)))
MAX_IMAGES = int(os.environ.get("AEGIS_CI_MAX_IMAGES", "16"))
# How often a waiting execution yields a keepalive, so a client that went away (its timeout) is
# noticed and the execution interrupted; E2B's server sends one every 5 s too.
KEEPALIVE_SECS = 5.0
IMAGE_KEYS = ("png", "jpeg", "svg")
# The Java context's runtime (a jlink image of Debian's JDK, made at image build), our driver's
# classes and the class-data archive made from its start-up (a faster JVM start).
JAVA = os.environ.get("AEGIS_CI_JAVA", "/opt/aegis/java/bin/java")
JAVA_CLASSES = os.path.join(HERE, "java", "repl.jar")
JAVA_CDS = os.path.join(HERE, "java", "repl.jsa")

# Jupyter MIME types -> the result fields the SDK reads (as E2B's server maps them).
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}


class ContextError(Exception):
    """A context could not be made, reached or restarted; the message says why."""


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def result_line(data, main):
    """A Jupyter mime bundle as the SDK's result line."""
    line = {"type": "result", "is_main_result": bool(main)}
    extra = {}
    for mime, value in data.items():
        field = MIME_FIELDS.get(mime)
        if field is None:
            extra[mime] = value
        else:
            line[field] = value
    text = line.get("text")
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        line["text"] = text[1:-1]
    if extra:
        line["extra"] = extra
    return line


class Budget:
    """What one execution may still send: output bytes and images."""

    def __init__(self):
        self.bytes_left = MAX_OUTPUT_BYTES
        self.images_left = MAX_IMAGES
        self.told = False

    def admit(self, line):
        """The line to send (possibly cut), or None when it is over the bounds; a notice once."""
        if line["type"] == "result" and any(k in line for k in IMAGE_KEYS):
            if self.images_left <= 0:
                for k in IMAGE_KEYS:
                    line.pop(k, None)
                if not self.told:
                    self.told = True
                    return [line, self.notice(f"images beyond {MAX_IMAGES} per execution were dropped")]
            else:
                self.images_left -= 1
        size = len(json.dumps(line))
        if size <= self.bytes_left:
            self.bytes_left -= size
            return [line]
        if line["type"] in ("stdout", "stderr") and self.bytes_left > 0:
            line["text"] = line["text"][: self.bytes_left]
            self.bytes_left = 0
            return [line, self.notice(f"output beyond {MAX_OUTPUT_BYTES} bytes was dropped")]
        self.bytes_left = 0
        if not self.told:
            self.told = True
            return [self.notice(f"output beyond {MAX_OUTPUT_BYTES} bytes was dropped")]
        return []

    def notice(self, text):
        self.told = True
        return {"type": "stderr", "text": f"[code interpreter] {text}\n", "timestamp": now()}


class Context:
    """What every context offers server.py."""

    language = "python"

    def __init__(self, cwd):
        self.id = str(uuid.uuid4())
        self.cwd = cwd
        self.lock = threading.Lock()

    def describe(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}


class PythonContext(Context):
    """An ipykernel kept alive; executions through its shell channel, output from iopub."""

    language = "python"

    def __init__(self, cwd):
        super().__init__(cwd)
        self.km = None
        self.kc = None
        self.start()

    def start(self):
        """A new kernel (a new manager each time: its ipc socket paths are new too)."""
        from jupyter_client.manager import KernelManager

        # Unix sockets, not TCP: a sandbox without egress may not connect over TCP at all (the
        # executor's Landlock domain), loopback included.
        runtime = os.environ.get("JUPYTER_RUNTIME_DIR", "/tmp")
        prefix = os.path.join(runtime, secrets.token_hex(6))
        self.km = KernelManager(kernel_name="python3", transport="ipc", ip=prefix)
        try:
            self.km.start_kernel(cwd=self.cwd, env=dict(os.environ))
            self.kc = self.km.blocking_client()
            self.kc.start_channels()
            self.kc.wait_for_ready(timeout=60)
        except Exception as e:  # jupyter_client raises RuntimeError and others
            raise ContextError(f"the Python kernel did not start: {e}") from e

    def restart(self):
        with self.lock:
            self.close()
            self.start()

    def close(self):
        try:
            if self.kc is not None:
                self.kc.stop_channels()
            self.km.shutdown_kernel(now=True)
        except Exception:
            pass

    def interrupt(self):
        try:
            self.km.interrupt_kernel()
        except Exception:
            pass

    def quiet(self, code):
        """Runs code silently (environment set-up); an error is returned as text."""
        msg_id = self.kc.execute(code, silent=True, store_history=False)
        error = None
        for msg in self._messages(msg_id, None):
            if msg is None:
                continue
            if msg["msg_type"] == "error":
                error = f"{msg['content']['ename']}: {msg['content']['evalue']}"
        return error

    def _messages(self, msg_id, deadline):
        """The iopub messages of msg_id until its kernel is idle; None now and then (keepalive)."""
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=KEEPALIVE_SECS)
            except queue.Empty:
                if not self.km.is_alive():
                    raise ContextError("the kernel died")
                yield None
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return
            yield msg

    def execute(self, code, env):
        """The lines of one execution, with env set for it and put back after."""
        if not self.km.is_alive():
            self.close()
            self.start()
            yield {"type": "stderr", "text": "[code interpreter] the kernel had died; a new one was started\n", "timestamp": now()}
        if env:
            setup = "import os as __o\n" + "".join(
                f"__o.environ[{k!r}] = {v!r}\n" for k, v in env.items()
            )
            failed = self.quiet(setup)
            if failed:
                yield {"type": "error", "name": "EnvironmentError", "value": failed, "traceback": failed}
                return
        try:
            msg_id = self.kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=True)
            errored = False
            for msg in self._messages(msg_id, None):
                if msg is None:
                    yield {"type": "keepalive"}
                    continue
                kind, content = msg["msg_type"], msg["content"]
                stamp = msg["header"].get("date")
                stamp = stamp.isoformat() if hasattr(stamp, "isoformat") else str(stamp)
                if kind == "stream":
                    yield {"type": content["name"], "text": content["text"], "timestamp": stamp}
                elif kind == "execute_input":
                    yield {"type": "number_of_executions", "execution_count": content["execution_count"]}
                elif kind == "display_data":
                    yield result_line(content["data"], False)
                elif kind == "execute_result":
                    yield result_line(content["data"], True)
                elif kind == "error" and not errored:
                    errored = True
                    yield {
                        "type": "error",
                        "name": content["ename"],
                        "value": content["evalue"],
                        "traceback": "\n".join(content["traceback"]),
                    }
        except ContextError:
            self.close()
            yield {"type": "error", "name": "KernelDied", "value": "the kernel died during the execution (out of memory?); the next call starts a new one", "traceback": ""}
        finally:
            if env:
                restore = "import os as __o\n" + "".join(
                    f"__o.environ[{k!r}] = {os.environ[k]!r}\n" if k in os.environ
                    else f"__o.environ.pop({k!r}, None)\n"
                    for k in env
                )
                try:
                    self.quiet(restore)
                except Exception:
                    pass


class ProcessContext(Context):
    """A persistent interpreter process (node or bash) driven over pipes.

    Each execution writes one request on the process's stdin; the process runs it and then
    writes a sentinel (unique per execution) on stdout and stderr, and, for node, a JSON
    report (result or error) on fd 3. Output before the sentinel is the execution's.
    """

    def __init__(self, cwd):
        super().__init__(cwd)
        self.proc = None
        self.events = None
        self.start()

    def argv(self):
        raise NotImplementedError

    def start(self):
        r3, w3 = os.pipe()
        try:
            self.proc = subprocess.Popen(
                self.argv(),
                cwd=self.cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(w3,),
                start_new_session=True,
                env=dict(os.environ, AEGIS_CI_REPORT_FD=str(w3)),
            )
        except OSError as e:
            os.close(r3)
            os.close(w3)
            raise ContextError(f"the {self.language} process did not start: {e}") from e
        os.close(w3)
        self.events = queue.Queue()
        for name, fd in (("stdout", self.proc.stdout.fileno()), ("stderr", self.proc.stderr.fileno()), ("report", r3)):
            threading.Thread(target=self._pump, args=(name, fd), daemon=True).start()

    def _pump(self, name, fd):
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            self.events.put((name, chunk))
            if not chunk:
                break
        if name == "report":
            os.close(fd)

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()

    def restart(self):
        with self.lock:
            self.close()
            self.start()

    def interrupt(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
            except OSError:
                pass

    def request(self, code, env, token):
        raise NotImplementedError

    def execute(self, code, env):
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self.start()
            yield {"type": "stderr", "text": f"[code interpreter] the {self.language} process had ended; a new one was started\n", "timestamp": now()}
        self.count = getattr(self, "count", 0) + 1
        yield {"type": "number_of_executions", "execution_count": self.count}
        token = "\x1eAEGIS-END-" + secrets.token_hex(8) + "\x1e"
        try:
            self.proc.stdin.write(self.request(code, env, token))
            self.proc.stdin.flush()
        except OSError as e:
            yield {"type": "error", "name": "ContextDied", "value": f"the {self.language} process is gone: {e}", "traceback": ""}
            return
        yield from self._collect(token.encode())

    def _events(self):
        """The process's output as (name, chunk) pairs as they come (an empty chunk: that
        stream ended), and ("keepalive", None) whenever it is quiet for KEEPALIVE_SECS."""
        while True:
            try:
                yield self.events.get(timeout=KEEPALIVE_SECS)
            except queue.Empty:
                yield "keepalive", None

    def _died(self, why):
        """The error event of a process that ended or spoke nonsense; the context is closed."""
        self.close()
        return {"type": "error", "name": "ContextDied", "value": why, "traceback": ""}

    def _collect(self, token):
        pending = {"stdout": b"", "stderr": b""}
        done = {"stdout": False, "stderr": False, "report": self.reports_on_fd3() is False}
        report = b""
        events = self._events()
        while not all(done.values()):
            name, chunk = next(events)
            if chunk is None:
                yield {"type": "keepalive"}
                continue
            if not chunk:
                done[name] = True
                if name != "report":
                    yield self._died(f"the {self.language} process ended")
                    return
                continue
            if name == "report":
                report += chunk
                if report.endswith(b"\n"):
                    done["report"] = True
                continue
            data = pending[name] + chunk
            at = data.find(token)
            if at >= 0:
                done[name] = True
                out, pending[name] = data[:at], b""
            else:
                keep = len(token) - 1
                out, pending[name] = data[:-keep] if len(data) > keep else b"", data[-keep:] if len(data) > keep else data
            if out:
                yield {"type": name, "text": out.decode("utf-8", "replace"), "timestamp": now()}
        if report.strip():
            yield from answer_events(parse_answer(report))

    def reports_on_fd3(self):
        return True


class JavascriptContext(ProcessContext):
    """Node running repl.js: one vm context kept across executions."""

    language = "javascript"

    def argv(self):
        return ["node", os.path.join(HERE, "repl.js")]

    def request(self, code, env, token):
        return (json.dumps({"code": code, "env": env or {}, "token": token}) + "\n").encode()


class TypescriptContext(JavascriptContext):
    """Node running repl.js --typescript: each cell compiled by Debian's TypeScript compiler."""

    language = "typescript"

    def argv(self):
        return ["node", os.path.join(HERE, "repl.js"), "--typescript"]


class RContext(ProcessContext):
    """R running repl.R: one global environment kept across executions."""

    language = "r"

    def argv(self):
        return ["Rscript", "--vanilla", os.path.join(HERE, "repl.R")]

    def request(self, code, env, token):
        scratch = scratch_dir("aegis-ci-r")
        name = uuid.uuid4().hex
        paths = [os.path.join(scratch, f"{name}.{part}.R") for part in ("code", "setup", "restore")]
        setup = "".join(f"do.call(Sys.setenv, setNames(list({r_string(v)}), {r_string(k)}))\n" for k, v in (env or {}).items())
        restore = "".join(
            f"do.call(Sys.setenv, setNames(list({r_string(os.environ[k])}), {r_string(k)}))\n"
            if k in os.environ else f"Sys.unsetenv({r_string(k)})\n"
            for k in (env or {})
        )
        for path, text in zip(paths, (code, setup, restore)):
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
                f.write("\n")
        hex_part = token.strip("\x1e")[len("AEGIS-END-"):]
        return f"{paths[0]} {paths[1]} {paths[2]} {hex_part}\n".encode()


def r_string(value):
    """A Python string as an R string literal (JSON's escapes are R's too, ASCII only)."""
    return json.dumps(value, ensure_ascii=True)


def scratch_dir(name):
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), name)
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


class BashContext(ProcessContext):
    """One bash process reading each execution from a file it sources (state kept)."""

    language = "bash"

    def argv(self):
        return ["bash", "--norc", "--noprofile", "-c", BASH_DRIVER]

    def reports_on_fd3(self):
        return False

    def request(self, code, env, token):
        script = os.path.join(self.scratch(), f"{uuid.uuid4().hex}.sh")
        with open(script, "w", encoding="utf-8") as f:
            f.write(code)
            f.write("\n")
        exports = b64_words(env)
        return f"{script} {base64.b64encode(token.encode()).decode()} {exports}\n".encode()

    def scratch(self):
        return scratch_dir("aegis-ci-bash")


class JavaContext(ProcessContext):
    """A JVM running JavaRepl (our driver of the JDK's JShell API): one JShell kept across
    executions. Its output comes framed on fd 3 (JavaRepl.java says how), so each write of
    System.out is one stdout line as Java kernels stream them; fds 1 and 2 carry only what the
    JVM itself prints (crash and warning messages), passed on as they come."""

    language = "java"

    def argv(self):
        # The serial collector: fewer threads and a smaller heap for one user's cells; no
        # perf-data file (nothing written to /tmp); the JVM's own warnings on stderr.
        options = ["-XX:+UseSerialGC", "-XX:-UsePerfData", "-Xshare:auto", "-Xlog:disable", "-Xlog:all=warning:stderr"]
        if os.path.isfile(JAVA_CDS):
            options.append(f"-XX:SharedArchiveFile={JAVA_CDS}")
        tmp = os.environ.get("TMPDIR")
        if tmp:
            options.append(f"-Djava.io.tmpdir={tmp}")
        return [JAVA, *options, "-cp", JAVA_CLASSES, "JavaRepl"]

    def start(self):
        super().start()
        self.frames = b""
        self.decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in ("stdout", "stderr")}

    def request(self, code, env, token):
        words = [b64(token), b64(code)] + [f"{b64(k)}:{b64(v)}" for k, v in (env or {}).items()]
        return (" ".join(words) + "\n").encode()

    def _frame(self):
        """The next whole frame (kind, bytes) taken from self.frames, or None."""
        end = self.frames.find(b"\n")
        if end < 0:
            return None
        kind, _, size = self.frames[:end].decode("ascii", "replace").partition(" ")
        if not size.isdigit():
            raise ContextError(f"the java driver wrote a bad frame header {self.frames[:end][:80]!r}")
        start, stop = end + 1, end + 1 + int(size)
        if len(self.frames) < stop:
            return None
        data, self.frames = self.frames[start:stop], self.frames[stop:]
        return kind, data

    def _collect(self, token):
        token = token.decode()
        for name, chunk in self._events():
            if chunk is None:
                yield {"type": "keepalive"}
                continue
            if not chunk:
                yield self._died("the java process ended")
                return
            if name != "report":
                yield {"type": name, "text": chunk.decode("utf-8", "replace"), "timestamp": now()}
                continue
            self.frames += chunk
            while True:
                try:
                    frame = self._frame()
                except ContextError as e:
                    yield self._died(str(e))
                    return
                if frame is None:
                    break
                kind, data = frame
                if kind in self.decoders:
                    text = self.decoders[kind].decode(data)
                    if text:
                        yield {"type": kind, "text": text, "timestamp": now()}
                elif kind == "end":
                    answer = parse_answer(data)
                    if answer.get("token") != token:
                        continue  # a late report of an execution already given up
                    yield from answer_events(answer)
                    return


def parse_answer(data):
    """A driver's end-of-execution report (JSON), or {} when it is not one."""
    try:
        return json.loads(data)
    except ValueError:
        return {}


def answer_events(answer):
    """The error or the main result a driver reported, as the events E2B streams."""
    if "error" in answer:
        yield dict(answer["error"], type="error")
    elif answer.get("result"):
        yield result_line(answer["result"], True)


def b64(text):
    return base64.b64encode(text.encode()).decode()


def b64_words(env):
    """env as base64 words NAME=VALUE, one per variable (bash decodes them)."""
    return " ".join(base64.b64encode(f"{k}={v}".encode()).decode() for k, v in (env or {}).items())


# The bash driver: for each request line "<script> <token b64> [<NAME=VALUE b64>...]", export the
# variables, source the script in this shell (so variables, functions and cd persist), put the
# variables back, and write the token on stdout and stderr. SIGINT (an interrupt) stops the
# running command; the trap keeps the shell.
BASH_DRIVER = r"""
trap 'echo "KeyboardInterrupt" >&2' INT
while IFS= read -r __aegis_line; do
  read -r -a __aegis_w <<< "$__aegis_line"
  __aegis_script=${__aegis_w[0]}
  __aegis_token=$(printf %s "${__aegis_w[1]}" | base64 -d)
  __aegis_saved=()
  for __aegis_kv in "${__aegis_w[@]:2}"; do
    __aegis_kv=$(printf %s "$__aegis_kv" | base64 -d)
    __aegis_name=${__aegis_kv%%=*}
    if [ -n "${!__aegis_name+x}" ]; then __aegis_saved+=("$__aegis_name=${!__aegis_name}"); else __aegis_saved+=("$__aegis_name"); fi
    export "$__aegis_kv"
  done
  source "$__aegis_script" < /dev/null
  rm -f -- "$__aegis_script"
  for __aegis_kv in "${__aegis_saved[@]}"; do
    case "$__aegis_kv" in *=*) export "$__aegis_kv" ;; *) unset "$__aegis_kv" ;; esac
  done
  printf %s "$__aegis_token"
  printf %s "$__aegis_token" >&2
done
"""

LANGUAGES = {
    "python": PythonContext,
    "javascript": JavascriptContext,
    "typescript": TypescriptContext,
    "r": RContext,
    "bash": BashContext,
    "java": JavaContext,
}


def normalize_language(language):
    """The language asked for, as the contexts name it (E2B's aliases included)."""
    if not language:
        return "python"
    language = language.strip().lower()
    return {"js": "javascript", "ts": "typescript", "sh": "bash", "shell": "bash", "python3": "python"}.get(language, language)

