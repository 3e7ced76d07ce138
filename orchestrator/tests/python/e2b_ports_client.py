"""Reaches servers in E2B sandboxes through a node's sandbox ports, driven by E2B's own Python
SDK (unmodified): E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY point it at the node.

Usage: e2b_ports_client.py <scenario> ; scenarios: `ports` (needs E2B_OTHER_KEY, another key),
`bench` (E2B_BENCH_REQUESTS requests each way), `remote` (needs E2B_REMOTE_URL, another
replica's sandbox URL). Prints one JSON report on stdout; every step
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
import sys
import time
import urllib.parse

from e2b import Sandbox

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


def attempt(report, name, fn):
    try:
        report[name] = {"ok": True, "value": fn()}
    except Exception as e:  # the report says which step failed and how
        report[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}


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


if __name__ == "__main__":
    scenario = sys.argv[1]
    print(json.dumps({"ports": ports, "bench": bench, "remote": remote}[scenario]()))
