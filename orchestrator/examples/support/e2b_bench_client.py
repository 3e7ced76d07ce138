"""The E2B path measured through E2B's own Python SDK (unmodified), beside its baselines in the
same run, iteration by iteration so background load hits both sides alike:

- create -> first output of a pooled `base` sandbox, and of one made while the pool is empty,
  vs `docker run --rm` of the same image;
- a command round trip through the SDK vs the same command as REST `cmd.run` on a kept-alive
  connection (same process, same key, same sandbox);
- kill;
- 64 MiB up and down through the SDK vs `docker cp` both ways (into a stopped container of the
  same image).

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY (the SDK's), NODE_URL and NODE_KEY (REST,
the same key), BENCH_IMAGE (the template's image), BENCH_POOL (the pool's metric label),
BENCH_ITERATIONS, BENCH_TRANSFERS, and for the gVisor class BENCH_DOCKER_HOST (the engine the
node drives, where the baselines run too) and BENCH_DOCKER_RUNTIME (`runsc`: the baselines'
containers run under gVisor as the sandboxes do). Prints one JSON object of series
(milliseconds) on stdout.
"""

import json
import os
import subprocess
import tempfile
import time

import requests
from bench_pool import NODE, ms, wait_pool
from e2b import Sandbox

KEY = os.environ["NODE_KEY"]
IMAGE = os.environ["BENCH_IMAGE"]
N = int(os.environ.get("BENCH_ITERATIONS", "20"))
TRANSFERS = int(os.environ.get("BENCH_TRANSFERS", "3"))
BIG = 64 * 1024 * 1024


ENGINE = ["-H", os.environ["BENCH_DOCKER_HOST"]] if os.environ.get("BENCH_DOCKER_HOST") else []
RUNTIME = ["--runtime", os.environ["BENCH_DOCKER_RUNTIME"]] if os.environ.get("BENCH_DOCKER_RUNTIME") else []


def docker_argv(*argv):
    """`docker` on the engine the node drives; `run` and `create` in the sandboxes' runtime."""
    extra = RUNTIME if argv and argv[0] in ("run", "create") else []
    return ["docker", *ENGINE, argv[0], *extra, *argv[1:]]


def docker(*argv):
    subprocess.run(docker_argv(*argv), check=True, capture_output=True)


def main():
    out = {"create_pooled": [], "create_cold": [], "docker_run": [], "kill": [],
           "sdk_command": [], "rest_command": [], "upload": [], "download": [],
           "docker_cp_in": [], "docker_cp_out": []}

    for _ in range(N):
        wait_pool()
        t0 = time.monotonic()
        pooled = Sandbox.create("base", timeout=120)
        pooled.commands.run("echo hi")
        out["create_pooled"].append(ms(t0))
        # The pool was just emptied: this one is made while the caller waits.
        t0 = time.monotonic()
        cold = Sandbox.create("base", timeout=120)
        cold.commands.run("echo hi")
        out["create_cold"].append(ms(t0))
        t0 = time.monotonic()
        subprocess.run(docker_argv("run", "--rm", "--network", "none", IMAGE, "echo", "hi"),
                       check=True, capture_output=True)
        out["docker_run"].append(ms(t0))
        for sbx in (pooled, cold):
            t0 = time.monotonic()
            sbx.kill()
            out["kill"].append(ms(t0))

    sbx = Sandbox.create("base", timeout=600)
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {KEY}"
    listed = session.get(f"{NODE}/v1/sandboxes", timeout=30).json()
    ours = [s["id"] for s in listed
            if s["state"] == "running" and "e2b_runtime" in (s.get("spec") or {}).get("labels", {})]
    if len(ours) != 1:
        raise RuntimeError(f"expected the one E2B sandbox in the key's listing, got {ours}")
    rest_body = {"name": "cmd.run", "arguments": {"command": "true"}, "sandbox_id": ours[0]}
    for _ in range(3):
        sbx.commands.run("true")
        session.post(f"{NODE}/v1/tools/call", json=rest_body, timeout=30).raise_for_status()
    for _ in range(N * 5):
        t0 = time.monotonic()
        sbx.commands.run("true")
        out["sdk_command"].append(ms(t0))
        t0 = time.monotonic()
        r = session.post(f"{NODE}/v1/tools/call", json=rest_body, timeout=30)
        r.raise_for_status()
        out["rest_command"].append(ms(t0))

    payload = os.urandom(BIG)
    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, "big.bin")
        back = os.path.join(tmp, "back.bin")
        with open(local, "wb") as f:
            f.write(payload)
        helper = subprocess.run(docker_argv("create", "--network", "none", IMAGE, "true"),
                                check=True, capture_output=True, text=True).stdout.strip()
        try:
            for _ in range(TRANSFERS):
                t0 = time.monotonic()
                sbx.files.write("/home/user/big.bin", payload)
                out["upload"].append(ms(t0))
                t0 = time.monotonic()
                got = sbx.files.read("/home/user/big.bin", format="bytes")
                out["download"].append(ms(t0))
                if len(got) != BIG:
                    raise RuntimeError(f"downloaded {len(got)} bytes of {BIG}")
                t0 = time.monotonic()
                docker("cp", local, f"{helper}:/tmp/big.bin")
                out["docker_cp_in"].append(ms(t0))
                t0 = time.monotonic()
                docker("cp", f"{helper}:/tmp/big.bin", back)
                out["docker_cp_out"].append(ms(t0))
        finally:
            subprocess.run(docker_argv("rm", "-f", helper), capture_output=True)
    sbx.kill()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
