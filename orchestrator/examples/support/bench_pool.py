"""What the Python benchmark clients (e2b_bench_client.py, code_bench_client.py) share: the
time since a start, and the node's warm pool of one template as its metrics show it, so that a
pooled create is measured only when the pool holds a sandbox.

Environment: NODE_URL (the node) and BENCH_POOL (the pool's metric label, `e2b:<template>`).
"""

import os
import time
import urllib.request

NODE = os.environ["NODE_URL"]
POOL = os.environ["BENCH_POOL"]


def ms(t0):
    """Milliseconds since `t0` (a `time.monotonic()`)."""
    return (time.monotonic() - t0) * 1000.0


def pool_idle():
    """Idle sandboxes in the pool, from `aegis_pool_idle_sandboxes` (0 when it has no line)."""
    with urllib.request.urlopen(f"{NODE}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("aegis_pool_idle_sandboxes{") and f'"{POOL}"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_pool(at_least=1, within=60):
    """Waits until the pool holds `at_least` sandboxes; fails after `within` seconds."""
    deadline = time.monotonic() + within
    while pool_idle() < at_least:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pool {POOL} never refilled")
        time.sleep(0.05)
