"""The internet out of E2B sandboxes, under policy, driven by E2B's own Python SDK (unmodified):
E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY point it at the node.

Usage: e2b_egress_client.py egress. Needs ALLOWED_URL and OTHER_URL (two hosts the operator's
grant names, served by the test on a local address the node's egress rules open), META_URL and
LOOP_URL (names the node resolves to the cloud-metadata address and to loopback), and
E2B_CLOSED_KEY (a key the operator grants no egress). Prints one JSON report on stdout; every
step records what happened, the Rust test judges it.

A command in a sandbox reaches out the way any program does: through HTTP_PROXY, which the node
sets to the sandbox's own egress proxy (Python's urllib honours it).
"""

import json
import os
import sys
import time

from e2b import ALL_TRAFFIC, Sandbox
from e2b.sandbox.commands.command_handle import CommandExitException

from e2b_steps import attempt

# A GET through the sandbox's proxy: as urllib sends a plain http:// URL (absolute form), or,
# with `tunnel`, inside a CONNECT tunnel (what https:// clients do; the test hosts speak HTTP).
FETCH = r'''
import http.client, os, sys, urllib.error, urllib.parse, urllib.request
url = urllib.parse.urlsplit(sys.argv[1])
try:
    if sys.argv[2:] == ["tunnel"]:
        proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
        conn = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=15)
        conn.set_tunnel(url.hostname, url.port)
        try:
            conn.request("GET", url.path or "/")
        except OSError as e:
            print(403 if "403" in str(e) else "error", e, end="")
            sys.exit(3 if "403" in str(e) else 4)
        r = conn.getresponse()
        print(r.status, r.read().decode(), end="")
    else:
        with urllib.request.urlopen(sys.argv[1], timeout=15) as r:
            print(r.status, r.read().decode(), end="")
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode(), end="")
    sys.exit(3)
except Exception as e:
    print("error", type(e).__name__, e, end="")
    sys.exit(4)
'''


def fetch(sbx, url, how=""):
    """[exit code, what the fetch printed] of a GET of `url` from inside the sandbox."""
    try:
        r = sbx.commands.run(f"python3 /home/user/fetch.py {url} {how}", timeout=60)
        return [r.exit_code, r.stdout]
    except CommandExitException as e:
        return [e.exit_code, e.stdout + e.stderr]


def network_of(sbx):
    info = sbx.get_info()
    return {
        "allow_internet_access": info.allow_internet_access,
        "network": {k: v for k, v in (info.network or {}).items() if k in ("allow_out", "deny_out")},
    }


def made(report, name, key=None, **opts):
    """A sandbox with the fetch script written in; its id in the report."""
    extra = {"api_key": key} if key else {}
    sbx = Sandbox.create("base", timeout=300, **opts, **extra)
    sbx.files.write("/home/user/fetch.py", FETCH)
    report.setdefault("ids", {})[name] = sbx.sandbox_id
    return sbx


def egress():
    report = {}
    allowed, other = os.environ["ALLOWED_URL"], os.environ["OTHER_URL"]
    meta, loop = os.environ["META_URL"], os.environ["LOOP_URL"]
    allowed_host = allowed.split("//", 1)[1].split(":", 1)[0]
    other_host = other.split("//", 1)[1].split(":", 1)[0]

    # Allow one host, deny everything else.
    a = made(report, "a", network={"allow_out": [allowed_host], "deny_out": [ALL_TRAFFIC]})
    attempt(report, "a_allowed", lambda: fetch(a, allowed))
    attempt(report, "a_other", lambda: fetch(a, other))
    attempt(report, "a_tunnel_allowed", lambda: fetch(a, allowed, "tunnel"))
    attempt(report, "a_tunnel_other", lambda: fetch(a, other, "tunnel"))
    attempt(report, "a_info", lambda: network_of(a))
    attempt(report, "a_proxy_env", lambda: a.commands.run("echo $HTTP_PROXY").stdout.strip())
    # Live: now the other host only.
    attempt(report, "a_update", lambda: a.update_network(
        {"allow_out": [other_host], "deny_out": [ALL_TRAFFIC]}))
    attempt(report, "a_updated_allowed", lambda: fetch(a, allowed))
    attempt(report, "a_updated_other", lambda: fetch(a, other))
    attempt(report, "a_updated_info", lambda: network_of(a))
    # An empty update clears the rules: what the operator grants, both hosts.
    attempt(report, "a_clear", lambda: a.update_network({}))
    attempt(report, "a_cleared_allowed", lambda: fetch(a, allowed))
    attempt(report, "a_cleared_other", lambda: fetch(a, other))
    # Internal ranges stay refused, even with nothing denied and the operator naming them.
    attempt(report, "a_meta", lambda: fetch(a, meta))
    attempt(report, "a_meta_literal", lambda: fetch(a, "http://169.254.169.254/latest/meta-data/"))
    attempt(report, "a_loop", lambda: fetch(a, loop))
    # A bad entry is refused, naming it.
    attempt(report, "a_bad_update", lambda: a.update_network({"allow_out": ["a.*.test"]}))
    attempt(report, "a_off", lambda: a.update_network({"allow_internet_access": False}))
    attempt(report, "a_off_allowed", lambda: fetch(a, allowed))
    attempt(report, "a_off_info", lambda: network_of(a))

    # Deny the hosts' address: allow wins where it covers (allowed), deny where not (other).
    b = made(report, "b", network={"allow_out": [allowed_host], "deny_out": ["127.0.0.2/32"]})
    attempt(report, "b_allowed", lambda: fetch(b, allowed))
    attempt(report, "b_other", lambda: fetch(b, other))
    # Pause and resume keep the rules.
    attempt(report, "b_pause", lambda: b.pause())
    attempt(report, "b_resume", lambda: Sandbox.connect(b.sandbox_id, timeout=300).sandbox_id)
    attempt(report, "b_resumed_allowed", lambda: fetch(b, allowed))
    attempt(report, "b_resumed_other", lambda: fetch(b, other))
    attempt(report, "b_resumed_info", lambda: network_of(b))
    # A fork has the same rules (its own copy).
    forks = []

    def fork():
        made = b.fork()[0]
        if isinstance(made, Exception):
            raise made
        forks.append(made)
        report["ids"]["fork"] = made.sandbox_id
        return made.sandbox_id

    attempt(report, "fork", fork)
    attempt(report, "fork_allowed", lambda: fetch(forks[0], allowed))
    attempt(report, "fork_other", lambda: fetch(forks[0], other))

    # Asking for the metadata address and loopback by name does not open them.
    c = made(report, "c", network={"allow_out": ["169.254.169.254", "meta.test", "loop.test"],
                                   "deny_out": [ALL_TRAFFIC]})
    attempt(report, "c_meta", lambda: fetch(c, meta))
    attempt(report, "c_meta_literal", lambda: fetch(c, "http://169.254.169.254/latest/meta-data/"))
    attempt(report, "c_loop", lambda: fetch(c, loop))

    # No internet asked: no network at all.
    d = made(report, "d", allow_internet_access=False)
    attempt(report, "d_allowed", lambda: fetch(d, allowed))
    attempt(report, "d_info", lambda: network_of(d))
    attempt(report, "d_update", lambda: d.update_network({"allow_out": [allowed_host]}))

    # A key the operator grants nothing gets nothing, whatever it asks.
    closed = os.environ["E2B_CLOSED_KEY"]
    e = made(report, "e", key=closed, network={"allow_out": [allowed_host]})
    attempt(report, "e_allowed", lambda: fetch(e, allowed))
    attempt(report, "e_info", lambda: network_of(e))
    attempt(report, "e_update", lambda: e.update_network({"allow_out": [allowed_host]}))

    for sbx in [a, c, d, e] + forks:
        sbx.kill()
    # b stays for the test to look at its resumed container; it kills it.
    return report


if __name__ == "__main__":
    scenario = sys.argv[1]
    print(json.dumps({"egress": egress}[scenario]()))
