"""The code interpreter's HTTP server inside a code-interpreter sandbox (port 49999).

It speaks the API E2B's code-interpreter SDK calls (written here from the protocol, not from
E2B's server): GET /health; POST /execute streams NDJSON lines (stdout, stderr, result, error,
number_of_executions, keepalive, then end_of_execution); POST /contexts, GET /contexts,
POST /contexts/<id>/restart, DELETE /contexts/<id>. It runs as the sandbox user under the
sandbox's limits; contexts are in contexts.py. The same API answers on a Unix socket
(socket_path()) for commands inside the sandbox. `server.py --wait-ready SECONDS` exits 0 once
/health answers (the door runs it after starting the server, so a create answers when ready).
"""

import http.client
import http.server
import json
import os
import shutil
import socket
import socketserver
import sys
import threading
import time

import contexts as ctx

PORT = int(os.environ.get("AEGIS_CI_PORT", "49999"))
MAX_CONTEXTS = int(os.environ.get("AEGIS_CI_MAX_CONTEXTS", "8"))
MAX_BODY = 4 * 1024 * 1024


class Registry:
    """The contexts of this sandbox and the default one of each language."""

    def __init__(self):
        self.lock = threading.Lock()
        self.contexts = {}
        self.defaults = {}
        self.ready = False

    def create(self, language, cwd):
        language = ctx.normalize_language(language)
        kind = ctx.LANGUAGES.get(language)
        if kind is None:
            raise LookupError(
                f"language {language!r} is not offered here ({', '.join(ctx.LANGUAGES)})"
            )
        if not os.path.isabs(cwd):
            raise ValueError(f"cwd {cwd!r} is not an absolute path")
        with self.lock:
            if len(self.contexts) >= MAX_CONTEXTS:
                raise OverflowError(
                    f"this sandbox already has {MAX_CONTEXTS} contexts (the most it may have); remove one first"
                )
        os.makedirs(cwd, exist_ok=True)
        made = kind(cwd)
        with self.lock:
            self.contexts[made.id] = made
        return made

    def default(self, language):
        language = ctx.normalize_language(language)
        with self.lock:
            found = self.contexts.get(self.defaults.get(language, ""))
        if found is not None:
            return found
        made = self.create(language, ctx.HOME)
        with self.lock:
            self.defaults[language] = made.id
        return made

    def get(self, context_id):
        with self.lock:
            return self.contexts.get(context_id)

    def remove(self, context_id):
        with self.lock:
            found = self.contexts.pop(context_id, None)
            for language, cid in list(self.defaults.items()):
                if cid == context_id:
                    del self.defaults[language]
        if found is not None:
            found.close()
        return found is not None

    def listed(self):
        with self.lock:
            return [c.describe() for c in self.contexts.values()]


REGISTRY = Registry()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "aegis-code-interpreter"

    def log_message(self, fmt, *args):
        pass

    def plain(self, status, text):
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def json(self, status, value):
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise ValueError("Content-Length is not a number")
        if length > MAX_BODY:
            raise ValueError(f"the body is {length} bytes; at most {MAX_BODY} are read")
        raw = self.rfile.read(length) if length else b""
        if not raw.strip():
            return {}
        try:
            value = json.loads(raw)
        except ValueError as e:
            raise ValueError(f"the body is not JSON: {e}")
        if not isinstance(value, dict):
            raise ValueError("the body must be a JSON object")
        return value

    def path_parts(self):
        return [p for p in self.path.split("?", 1)[0].split("/") if p]

    def do_GET(self):
        parts = self.path_parts()
        if parts == ["health"]:
            if REGISTRY.ready:
                return self.json(200, "OK")
            return self.plain(503, "the default context is starting")
        if parts == ["contexts"]:
            return self.json(200, REGISTRY.listed())
        return self.plain(404, f"no route GET {self.path}")

    def do_DELETE(self):
        parts = self.path_parts()
        if len(parts) == 2 and parts[0] == "contexts":
            if REGISTRY.remove(parts[1]):
                return self.plain(200, "")
            return self.plain(404, f"Context {parts[1]} not found")
        return self.plain(404, f"no route DELETE {self.path}")

    def do_POST(self):
        parts = self.path_parts()
        try:
            body = self.body()
        except ValueError as e:
            return self.plain(400, str(e))
        if parts == ["execute"]:
            return self.execute(body)
        if parts == ["contexts"]:
            return self.create_context(body)
        if len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart":
            found = REGISTRY.get(parts[1])
            if found is None:
                return self.plain(404, f"Context {parts[1]} not found")
            try:
                found.restart()
            except ctx.ContextError as e:
                return self.plain(500, str(e))
            return self.plain(200, "")
        return self.plain(404, f"no route POST {self.path}")

    def create_context(self, body):
        language = body.get("language")
        cwd = body.get("cwd") or ctx.HOME
        if language is not None and not isinstance(language, str):
            return self.plain(400, "language must be a string")
        if not isinstance(cwd, str):
            return self.plain(400, "cwd must be a string")
        try:
            made = REGISTRY.create(language, cwd)
        except (LookupError, ValueError) as e:
            return self.plain(400, str(e))
        except OverflowError as e:
            return self.plain(429, str(e))
        except (ctx.ContextError, OSError) as e:
            return self.plain(500, f"Failed to create context: {e}")
        return self.json(200, made.describe())

    def execute(self, body):
        code = body.get("code")
        if not isinstance(code, str):
            return self.plain(400, "code: a string is required")
        context_id, language = body.get("context_id"), body.get("language")
        if context_id and language:
            return self.plain(400, "Only one of context_id or language can be provided")
        env = body.get("env_vars") or {}
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            return self.plain(400, "env_vars: an object of strings is required")
        if context_id:
            target = REGISTRY.get(context_id)
            if target is None:
                return self.plain(404, f"Context {context_id} not found")
        else:
            try:
                target = REGISTRY.default(language)
            except LookupError as e:
                return self.plain(400, str(e))
            except OverflowError as e:
                return self.plain(429, str(e))
            except (ctx.ContextError, OSError) as e:
                return self.plain(500, str(e))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.stream(target, code, env)

    def chunk(self, line):
        data = (json.dumps(line) + "\n").encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def stream(self, target, code, env):
        """Runs code in target, one line per output; a client that goes away interrupts it."""
        with target.lock:
            budget = ctx.Budget()
            lines = target.execute(code, env)
            try:
                for line in lines:
                    for admitted in [line] if line["type"] == "keepalive" else budget.admit(line):
                        self.chunk(admitted)
                self.chunk({"type": "end_of_execution"})
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError, OSError):
                # The caller went away (its timeout): interrupt, then let the run finish.
                target.interrupt()
                self.close_connection = True
                for _ in lines:
                    pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The same API on a Unix socket (socket_path()): commands in the sandbox reach the server
    there, as a sandbox without egress may not connect over TCP, loopback included."""

    daemon_threads = True

    def get_request(self):
        request, _ = super().get_request()
        return request, ("local", 0)


def socket_path():
    return os.path.join(os.environ.get("TMPDIR", "/tmp"), "aegis-ci", "http.sock")


class UnixHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection to socket_path()."""

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(socket_path())


def prepare_environment():
    """Writable places for Jupyter, IPython and matplotlib (the root filesystem is read-only)."""
    tmp = os.environ.get("TMPDIR", "/tmp")
    for name, sub in (("JUPYTER_RUNTIME_DIR", "jupyter-runtime"), ("IPYTHONDIR", "ipython"),
                      ("MPLCONFIGDIR", "matplotlib"), ("JUPYTER_DATA_DIR", "jupyter-data")):
        path = os.path.join(tmp, "aegis-ci", sub)
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.environ.setdefault(name, path)
    cache = os.path.join(ctx.HERE, "mpl")
    if os.path.isdir(cache):
        for entry in os.listdir(cache):
            target = os.path.join(os.environ["MPLCONFIGDIR"], entry)
            if not os.path.exists(target):
                shutil.copy(os.path.join(cache, entry), target)
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    os.environ.setdefault("HOME", ctx.HOME)
    # ipykernel's debugger warns about frozen modules on every kernel start otherwise.
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")


def log_path():
    return os.path.join(os.environ.get("TMPDIR", "/tmp"), "aegis-ci", "server.log")


def log_to_file():
    """The server's and its kernels' stderr into log_path(), which --wait-ready shows on failure."""
    path = log_path()
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 2)
    os.close(fd)


def wait_ready(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            conn = UnixHTTPConnection("localhost", timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return 0
        except OSError:
            pass
        time.sleep(0.1)
    print(f"the code interpreter did not answer /health on {socket_path()} within {seconds} s", file=sys.stderr)
    try:
        with open(log_path(), encoding="utf-8", errors="replace") as f:
            print("its log ends:\n" + f.read()[-2000:], file=sys.stderr)
    except OSError as e:
        print(f"its log {log_path()} cannot be read: {e}", file=sys.stderr)
    return 1


def main(argv):
    if len(argv) == 3 and argv[1] == "--wait-ready":
        return wait_ready(float(argv[2]))
    if len(argv) != 1:
        print("usage: server.py [--wait-ready SECONDS]", file=sys.stderr)
        return 2
    log_to_file()
    prepare_environment()
    server = Server(("127.0.0.1", PORT), Handler)
    if os.path.exists(socket_path()):
        os.unlink(socket_path())
    local = UnixServer(socket_path(), Handler)
    threading.Thread(target=local.serve_forever, daemon=True).start()

    def warm():
        try:
            REGISTRY.default("python")
            REGISTRY.default("javascript")
        except Exception as e:  # reported by /health staying 503 and the log
            print(f"the default contexts did not start: {e}", file=sys.stderr)
            return
        REGISTRY.ready = True

    threading.Thread(target=warm, daemon=True).start()
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
