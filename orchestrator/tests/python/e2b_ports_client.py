"""Reaches servers in E2B sandboxes through a node's sandbox ports, driven by E2B's own Python
SDK (unmodified): E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY point it at the node.

Usage: e2b_ports_client.py <scenario> ; scenarios: `ports` (needs E2B_OTHER_KEY, another key),
`bench` (E2B_BENCH_REQUESTS requests each way), `remote` (needs E2B_REMOTE_URL, another
replica's sandbox URL), `wake` (auto-resume on traffic; needs E2B_OTHER_KEY), `tls` (the node's
TLS listener at E2B_TLS_ADDR, its CA at E2B_TLS_CA; needs E2B_OTHER_KEY). Prints one JSON report on stdout; every step
records what happened, the Rust test judges it.

A port is reached as E2B's `get_host(port)` names it, `<port>-<id>.<domain>`: the client
connects to the node (the host of E2B_SANDBOX_URL) and sends that name as `Host`, what a
wildcard DNS entry for the domain would make a browser do; and with E2B's headers
`E2b-Sandbox-Id` + `E2b-Sandbox-Port` on the sandbox URL.
"""

import base64
import hashlib
import http.client
import json
import os
import socket
import ssl
import sys
import threading
import time
import urllib.parse
import urllib.request

from e2b import Sandbox

from e2b_steps import attempt

SITE = "/home/user/site"
PAGE = "hello from a sandbox port ✓\n"

# A WebSocket echo server with only the standard library: the handshake, then every text or
# binary frame sent back unmasked; a close frame ends it.
ECHO_SERVER = r'''
import base64, hashlib, socket, struct, sys, threading
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def recv_exact(c, n):
    b = b""
    while len(b) < n:
        chunk = c.recv(n - len(b))
        if not chunk:
            raise EOFError
        b += chunk
    return b
def serve(c):
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = c.recv(4096)
        if not chunk:
            return
        head += chunk
    key = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key:")][0]
    accept = base64.b64encode(hashlib.sha1(key + GUID.encode()).digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    while True:
        b0, b1 = recv_exact(c, 2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack(">H", recv_exact(c, 2))[0]
        elif n == 127:
            n = struct.unpack(">Q", recv_exact(c, 8))[0]
        mask = recv_exact(c, 4) if b1 & 0x80 else b"\0\0\0\0"
        data = bytes(x ^ mask[i % 4] for i, x in enumerate(recv_exact(c, n)))
        op = b0 & 0x0F
        if op == 8:
            c.sendall(b"\x88\x00")
            return
        head = bytes([0x80 | op])
        head += bytes([n]) if n < 126 else (b"\x7e" + struct.pack(">H", n) if n < 65536 else b"\x7f" + struct.pack(">Q", n))
        c.sendall(head + data)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
while True:
    c, _ = s.accept()
    threading.Thread(target=lambda c=c: (serve(c), c.close()), daemon=True).start()
'''


# A server answering every GET with the Host header line it received, its name as written.
HOST_SERVER = r'''
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = "".join(k + ": " + v for k, v in self.headers.items() if k.lower() == "host").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''


def node():
    """The node's host and port, from E2B_SANDBOX_URL."""
    url = urllib.parse.urlsplit(os.environ["E2B_SANDBOX_URL"])
    return url.hostname, url.port


def request(host, path="/", headers=None, conn=None, method="GET"):
    """One request to the node with `host` as Host; (status, body, headers)."""
    own = conn is None
    if own:
        conn = http.client.HTTPConnection(*node(), timeout=30)
    try:
        conn.request(method, path, headers={"Host": host, **(headers or {})})
        r = conn.getresponse()
        return r.status, r.read().decode("utf-8", "replace"), dict(r.getheaders())
    finally:
        if own:
            conn.close()


def by_headers(sbx_id, port, path="/", headers=None):
    """One request to the sandbox URL with E2B's headers naming the sandbox and the port."""
    base = urllib.parse.urlsplit(os.environ["E2B_SANDBOX_URL"])
    conn = http.client.HTTPConnection(base.hostname, base.port, timeout=30)
    try:
        conn.request("GET", base.path.rstrip("/") + path, headers={
            "E2b-Sandbox-Id": sbx_id, "E2b-Sandbox-Port": str(port), **(headers or {})})
        r = conn.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        conn.close()


def start_site(sbx, port):
    sbx.files.write(f"{SITE}/index.html", PAGE)
    sbx.commands.run(
        f"python3 -m http.server {port} --bind 127.0.0.1 --directory {SITE}", background=True)


def wait_listening(sbx, port, headers=None):
    """Until the server answers through the node (a 502 while it starts): the last status and
    how many requests (each on a connection of its own) it took."""
    deadline = time.monotonic() + 30
    attempts = 0
    while True:
        status, body, _ = request(sbx.get_host(port), headers=headers)
        attempts += 1
        if status == 200 or time.monotonic() > deadline:
            return status, attempts
        time.sleep(0.2)


def websocket_echo(host, message):
    """A WebSocket handshake to `host` through the node, one masked text frame, its echo."""
    s = socket.create_connection(node(), timeout=30)
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall((f"GET /echo HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                   f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                   "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                raise EOFError(f"closed during the handshake: {head!r}")
            head += chunk
        head, rest = head.split(b"\r\n\r\n", 1)
        status = head.split(b"\r\n")[0].decode()
        want = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        accepted = want in head
        data = message.encode()
        mask = os.urandom(4)
        s.sendall(bytes([0x81, 0x80 | len(data)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
        got = rest
        while len(got) < 2 or len(got) < 2 + (got[1] & 0x7F):
            chunk = s.recv(4096)
            if not chunk:
                raise EOFError("closed before the echo")
            got += chunk
        echoed = got[2:2 + (got[1] & 0x7F)].decode()
        s.sendall(bytes([0x88, 0x80]) + os.urandom(4))
        return {"status": status, "accepted": accepted, "echo": echoed}
    finally:
        s.close()


def ports():
    report = {}
    sbx = Sandbox.create("base", timeout=180)
    report["sandbox_id"] = sbx.sandbox_id
    report["domain"] = sbx.sandbox_domain
    report["host"] = sbx.get_host(8000)
    start_site(sbx, 8000)
    listening, report["probes"] = wait_listening(sbx, 8000)
    report["listening"] = {"ok": True, "value": listening}
    attempt(report, "by_host", lambda: request(sbx.get_host(8000))[:2])

    def keep_alive():
        # Three requests on one connection to the node: one admission, one audit row.
        conn = http.client.HTTPConnection(*node(), timeout=30)
        try:
            return [request(sbx.get_host(8000), "/index.html", conn=conn)[0] for _ in range(3)]
        finally:
            conn.close()

    attempt(report, "keep_alive", keep_alive)
    attempt(report, "by_headers", lambda: by_headers(sbx.sandbox_id, 8000, "/index.html"))
    attempt(report, "missing_file", lambda: request(sbx.get_host(8000), "/nope.txt")[0])
    attempt(report, "closed_port", lambda: request(sbx.get_host(8999))[:2])
    attempt(report, "closed_port_headers", lambda: by_headers(sbx.sandbox_id, 8999))
    # envd's own port through E2B's headers stays the door's envd.
    attempt(report, "envd_port_is_the_door", lambda: by_headers(
        sbx.sandbox_id, 49983, "/health", {"X-Access-Token": sbx._envd_access_token or ""})[0])

    sbx.files.write("/home/user/echo.py", ECHO_SERVER)
    sbx.commands.run("python3 /home/user/echo.py 8765", background=True)

    report["websocket_attempts"] = 0

    def echo():
        deadline = time.monotonic() + 30
        while True:
            try:
                report["websocket_attempts"] += 1
                got = websocket_echo(sbx.get_host(8765), "ping ✓ through the node")
                # 502 while the server starts.
                if " 502 " not in got["status"] or time.monotonic() > deadline:
                    return got
            except Exception:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.3)

    attempt(report, "websocket", echo)

    # Private sandboxes: the token of their create answer, nobody else's.
    private = Sandbox.create("base", timeout=180, network={"allow_public_traffic": False})
    other_private = Sandbox.create("base", timeout=60, network={"allow_public_traffic": False})
    report["private_token_given"] = bool(private.traffic_access_token)
    report["public_token"] = sbx.traffic_access_token
    start_site(private, 8000)
    token = {"e2b-traffic-access-token": private.traffic_access_token or ""}
    attempt(report, "private_listening", lambda: wait_listening(private, 8000, token)[0])
    attempt(report, "private_without_token", lambda: request(private.get_host(8000))[:2])
    attempt(report, "private_with_token", lambda: request(private.get_host(8000), headers=token)[:2])
    attempt(report, "private_with_other_token", lambda: request(private.get_host(8000), headers={
        "e2b-traffic-access-token": other_private.traffic_access_token or "x"})[:2])
    attempt(report, "private_by_headers_with_token", lambda: by_headers(private.sandbox_id, 8000, "/", token)[0])
    attempt(report, "private_by_headers_without", lambda: by_headers(private.sandbox_id, 8000)[0])
    attempt(report, "private_info", lambda: Sandbox.get_info(private.sandbox_id).sandbox_domain)

    # Another key: its SDK finds nothing of ours, and its own private sandbox's token opens
    # nothing of ours (the answer is the one a missing token gets).
    other_key = os.environ["E2B_OTHER_KEY"]
    theirs = Sandbox.create("base", timeout=60, api_key=other_key,
                            network={"allow_public_traffic": False})

    def other_connect():
        try:
            Sandbox.connect(private.sandbox_id, api_key=other_key)
            return "connected"
        except Exception as e:
            return f"{type(e).__name__}: {e}"

    attempt(report, "other_key_connect", other_connect)
    attempt(report, "other_key_token", lambda: request(private.get_host(8000), headers={
        "e2b-traffic-access-token": theirs.traffic_access_token or "x"})[:2])
    report["private_id"] = private.sandbox_id
    report["other_private_id"] = other_private.sandbox_id
    theirs.kill()
    other_private.kill()

    # A sandbox that is gone, and one that never was, answer alike.
    unknown = "00000000-0000-4000-8000-000000000000"
    attempt(report, "unknown_sandbox", lambda: request(f"8000-{unknown}.{sbx.sandbox_domain}")[:2])
    gone_host = private.get_host(8000)
    private.kill()
    attempt(report, "killed_sandbox", lambda: request(gone_host, headers=token)[:2])
    sbx.kill()
    return report


def bench():
    """Requests/s and p50/p99 of GET /index.html through the node's sandbox port (one
    connection to the node)."""
    n = int(os.environ.get("E2B_BENCH_REQUESTS", "300"))
    sbx = Sandbox.create("base", timeout=300)
    start_site(sbx, 8000)
    listening, probes = wait_listening(sbx, 8000)
    report = {"listening": listening, "probes": probes, "requests": n}
    conn = http.client.HTTPConnection(*node(), timeout=30)
    host = sbx.get_host(8000)
    times = []
    t0 = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        status, body, _ = request(host, "/index.html", conn=conn)
        times.append(time.perf_counter() - t)
        if status != 200:
            raise RuntimeError(f"request {len(times)}: {status} {body}")
    total = time.perf_counter() - t0
    conn.close()
    times.sort()
    report["through_port"] = {"rps": n / total, "p50_ms": times[n // 2] * 1e3,
                              "p99_ms": times[min(n - 1, n * 99 // 100)] * 1e3}
    # The same server reached directly is measured by the caller (`docker exec` into the
    # sandbox's container, which Landlock does not confine): the sandbox stays up for it.
    report["sandbox_id"] = sbx.sandbox_id
    return report


def remote():
    """A sandbox made through one replica (E2B_API_URL, E2B_SANDBOX_URL) reached through
    another (E2B_REMOTE_URL, the other replica's sandbox URL), which relays to its holder."""
    report = {}
    sbx = Sandbox.create("base", timeout=180)
    report["sandbox_id"] = sbx.sandbox_id
    start_site(sbx, 8000)
    listening, report["probes"] = wait_listening(sbx, 8000)
    report["listening"] = {"ok": True, "value": listening}
    remote_url = urllib.parse.urlsplit(os.environ["E2B_REMOTE_URL"])

    def through_remote(port, path="/index.html"):
        conn = http.client.HTTPConnection(remote_url.hostname, remote_url.port, timeout=30)
        try:
            conn.request("GET", remote_url.path.rstrip("/") + path, headers={
                "E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(port)})
            r = conn.getresponse()
            return r.status, r.read().decode("utf-8", "replace")
        finally:
            conn.close()

    def remote_by_host():
        conn = http.client.HTTPConnection(remote_url.hostname, remote_url.port, timeout=30)
        try:
            conn.request("GET", "/index.html", headers={"Host": sbx.get_host(8000)})
            r = conn.getresponse()
            return r.status, r.read().decode("utf-8", "replace")
        finally:
            conn.close()

    attempt(report, "remote_by_headers", lambda: through_remote(8000))
    attempt(report, "remote_by_host", remote_by_host)
    attempt(report, "remote_closed", lambda: through_remote(8001, "/"))
    sbx.kill()
    return report


def api_detail(sbx_id):
    """The sandbox's detail as the API answers it (`GET /sandboxes/{id}`)."""
    url = os.environ["E2B_API_URL"].rstrip("/") + f"/sandboxes/{sbx_id}"
    req = urllib.request.Request(url, headers={"X-API-KEY": os.environ["E2B_API_KEY"]})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def pause_stored(sbx_id):
    """Whether the sandbox's log says its pause was stored (its detail says `paused` from the
    moment its timeout passes, before the sweep has taken the pause)."""
    url = os.environ["E2B_API_URL"].rstrip("/") + f"/v2/sandboxes/{sbx_id}/logs"
    req = urllib.request.Request(url, headers={"X-API-KEY": os.environ["E2B_API_KEY"]})
    with urllib.request.urlopen(req, timeout=30) as r:
        logs = json.load(r).get("logs", [])
    return any(line.get("message", "").startswith("sandbox paused") for line in logs)


def until_paused(sbx):
    """Until the pause is stored (the sweep takes it within seconds of the timeout): a request
    before that finds the sandbox still running and just extends its life."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if pause_stored(sbx.sandbox_id):
            break
        time.sleep(0.2)
    return str(sbx.get_info().state)


def wake():
    """Auto-resume on traffic (`lifecycle` `auto_resume`): paused sandboxes reached at
    get_host(port). Made with auto_resume, a burst of requests wakes it once; without, 409 and it
    stays paused; a private one is not woken by a request without its token."""
    report = {}
    wakes = {"on_timeout": "pause", "auto_resume": True}
    sbx = Sandbox.create("base", timeout=120, lifecycle=wakes)
    report["sandbox_id"] = sbx.sandbox_id
    attempt(report, "lifecycle", lambda: sbx.get_info().lifecycle)
    start_site(sbx, 8000)
    attempt(report, "served", lambda: wait_listening(sbx, 8000)[0])
    # Its timeout passes now: the sweep pauses it (files kept, processes not).
    sbx.set_timeout(0)
    attempt(report, "paused", lambda: until_paused(sbx))

    # Six requests at once, each on a connection of its own: one wake.
    results = [None] * 6
    def one(i):
        try:
            results[i] = list(request(sbx.get_host(8000))[:2])
        except Exception as e:  # recorded, judged by the test
            results[i] = [0, f"{type(e).__name__}: {e}"]
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report["burst"] = {"ok": True, "value": results}
    attempt(report, "state_after_burst", lambda: str(sbx.get_info().state))
    attempt(report, "running_after_burst", lambda: sbx.is_running())
    # The files came back with it: the same page, served again once its server is started.
    start_site_again = lambda: sbx.commands.run(
        f"python3 -m http.server 8000 --bind 127.0.0.1 --directory {SITE}", background=True)
    start_site_again()
    attempt(report, "served_again", lambda: [wait_listening(sbx, 8000)[0],
                                             request(sbx.get_host(8000))[1]])

    # Without auto_resume: E2B's edge's 409, and it stays paused.
    still = Sandbox.create("base", timeout=120, lifecycle={"on_timeout": "pause"})
    report["still_id"] = still.sandbox_id
    still.pause()
    attempt(report, "still_paused", lambda: until_paused(still))
    attempt(report, "no_auto_resume", lambda: request(still.get_host(8000))[:2])
    attempt(report, "still_state", lambda: str(still.get_info().state))

    # Private with auto_resume: no token, a made-up one, another key's sandbox's: refused and
    # still paused; its own token wakes it.
    private = Sandbox.create("base", timeout=120, lifecycle=wakes,
                             network={"allow_public_traffic": False})
    report["private_id"] = private.sandbox_id
    other_key = os.environ["E2B_OTHER_KEY"]
    theirs = Sandbox.create("base", timeout=60, api_key=other_key,
                            network={"allow_public_traffic": False})
    private.pause()
    attempt(report, "private_paused", lambda: until_paused(private))
    host = private.get_host(8000)
    attempt(report, "private_no_token", lambda: request(host)[:2])
    attempt(report, "private_made_up_token", lambda: request(host, headers={
        "e2b-traffic-access-token": "0" * 48})[:2])
    attempt(report, "private_other_keys_token", lambda: request(host, headers={
        "e2b-traffic-access-token": theirs.traffic_access_token or "x"})[:2])
    attempt(report, "private_state_refused", lambda: str(private.get_info().state))
    attempt(report, "private_own_token", lambda: request(host, headers={
        "e2b-traffic-access-token": private.traffic_access_token or ""})[:2])
    attempt(report, "private_state_woken", lambda: str(private.get_info().state))
    theirs.kill()
    for s in (sbx, still, private):
        s.kill()
    return report


class NamedHTTPS(http.client.HTTPSConnection):
    """HTTPS to `name` through a TCP connection to `addr`: what a wildcard DNS entry pointing the
    domain at the node makes a client do (SNI and the certificate check on the name)."""

    def __init__(self, name, addr, context):
        super().__init__(name, addr[1], context=context, timeout=30)
        self._addr = addr

    def connect(self):
        sock = socket.create_connection(self._addr, timeout=self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def tls_request(host, headers=None, path="/", trust=True):
    """One request over TLS to the node's TLS address (E2B_TLS_ADDR) for `host`, trusting the
    suite's CA (E2B_TLS_CA) or, with `trust=False`, only the system's."""
    addr_host, addr_port = os.environ["E2B_TLS_ADDR"].rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=os.environ["E2B_TLS_CA"] if trust else None)
    conn = NamedHTTPS(host.split(":")[0], (addr_host, int(addr_port)), ctx)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        conn.close()


def tls():
    """Sandbox ports over the node's TLS listener (server.tls, a certificate for *.<domain> made
    by the suite's CA): public and private sandboxes at https://<get_host(port)>."""
    report = {}
    sbx = Sandbox.create("base", timeout=180)
    report["sandbox_id"] = sbx.sandbox_id
    start_site(sbx, 8000)
    attempt(report, "listening", lambda: wait_listening(sbx, 8000)[0])
    host = sbx.get_host(8000)
    attempt(report, "tls_by_host", lambda: tls_request(host, path="/index.html"))
    attempt(report, "tls_by_headers", lambda: tls_request(
        f"node.{sbx.sandbox_domain}", path="/e2b/index.html",
        headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000"}))
    attempt(report, "tls_node_routes", lambda: tls_request(
        f"node.{sbx.sandbox_domain}", path="/health/ready")[0])
    attempt(report, "tls_untrusted", lambda: tls_request(host, trust=False))
    attempt(report, "tls_other_name", lambda: tls_request(
        f"8000-{sbx.sandbox_id}.elsewhere.test"))

    private = Sandbox.create("base", timeout=180, network={"allow_public_traffic": False})
    report["private_id"] = private.sandbox_id
    token = {"e2b-traffic-access-token": private.traffic_access_token or ""}
    start_site(private, 8000)
    attempt(report, "private_listening", lambda: wait_listening(private, 8000, token)[0])
    other_key = os.environ["E2B_OTHER_KEY"]
    theirs = Sandbox.create("base", timeout=60, api_key=other_key,
                            network={"allow_public_traffic": False})
    private_host = private.get_host(8000)
    attempt(report, "tls_private_without_token", lambda: tls_request(private_host))
    attempt(report, "tls_private_other_keys_token", lambda: tls_request(private_host, headers={
        "e2b-traffic-access-token": theirs.traffic_access_token or "x"}))
    attempt(report, "tls_private_with_token", lambda: tls_request(private_host, headers=token))

    # maskRequestHost: the server sees the sandbox's chosen Host, ${PORT} replaced.
    masked = Sandbox.create("base", timeout=120,
                            network={"mask_request_host": "custom-host.example.com:${PORT}"})
    report["masked_id"] = masked.sandbox_id
    masked.files.write("/home/user/host.py", HOST_SERVER)
    masked.commands.run("python3 /home/user/host.py 8080", background=True)

    def seen_host():
        deadline = time.monotonic() + 30
        while True:
            status, body = tls_request(masked.get_host(8080))
            if status == 200 or time.monotonic() > deadline:
                return [status, body]
            time.sleep(0.3)

    attempt(report, "masked_host", seen_host)
    attempt(report, "masked_detail", lambda: api_detail(masked.sandbox_id)
            .get("network", {}).get("maskRequestHost"))
    for s in (theirs, private, sbx, masked):
        s.kill()
    return report


if __name__ == "__main__":
    scenario = sys.argv[1]
    print(json.dumps({"ports": ports, "bench": bench, "remote": remote, "wake": wake,
                      "tls": tls}[scenario]()))
