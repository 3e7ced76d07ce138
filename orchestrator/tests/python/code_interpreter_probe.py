"""Talks to the code interpreter server from inside its sandbox, standard library only, on
the server's Unix socket (a command in a sandbox without egress may not connect over TCP, not
even to 127.0.0.1:49999, where the same API answers requests relayed from outside): tests/suite/code_interpreter.rs runs this file's text followed by a scenario
under `python3 -c`, and reads the JSON the scenario prints."""
import http.client
import json
import socket
import time



SOCKET = "/tmp/aegis-ci/http.sock"


class Connection(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(SOCKET)


def request(method, path, body, timeout):
    conn = Connection("localhost", timeout=timeout)
    data = None if body is None else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    return conn, conn.getresponse()


def call(method, path, body=None, timeout=60):
    """(status, text) of one request."""
    conn, r = request(method, path, body, timeout)
    try:
        return r.status, r.read().decode()
    finally:
        conn.close()


def execute(code, language=None, context_id=None, env=None, timeout=60):
    """The NDJSON lines of one /execute (keepalives left out); "timed_out" when `timeout`
    seconds passed first (the connection is then closed, as the SDK closes it)."""
    body = {"code": code, "language": language, "context_id": context_id, "env_vars": env}
    lines = []
    deadline = time.monotonic() + timeout
    conn, r = request("POST", "/execute", body, timeout)
    try:
        if r.status != 200:
            return {"status": r.status, "text": r.read().decode()}
        for raw in r:
            if time.monotonic() > deadline:
                return "timed_out"
            line = json.loads(raw)
            if line["type"] != "keepalive":
                lines.append(line)
    except (socket.timeout, TimeoutError):
        return "timed_out"
    finally:
        conn.close()
    return lines


def of(lines, kind):
    """The lines of one type."""
    return [l for l in lines if l["type"] == kind]


def stdout(lines):
    return "".join(l["text"] for l in of(lines, "stdout"))


def new_context(language=None, cwd=None):
    body = {}
    if language:
        body["language"] = language
    if cwd:
        body["cwd"] = cwd
    status, text = call("POST", "/contexts", body)
    assert status == 200, (status, text)
    return json.loads(text)
