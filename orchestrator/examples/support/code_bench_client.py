"""The code interpreter measured through E2B's code-interpreter SDK (unmodified), beside the same
Python through `commands.run("python3 -c ...")` and our own REST `code.run`, iteration by
iteration in one run so background load hits every side alike:

- create -> first result: `Sandbox.create("code-interpreter-v1")` then `run_code("1+1")`, from a
  warm pool and made while the pool is empty; the same create then `commands.run("python3 -c
  'print(1+1)'")`; `docker run --rm` of the same image running that command; REST: a
  `code-interpreter` sandbox made with `POST /v1/sandboxes`, then its first `code.run`;
- a warm round trip in one sandbox: `run_code("1+1")` vs `commands.run("python3 -c ...")`, and
  REST `code.run` of `1+1` on a kept-alive connection.

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY (the SDK's), NODE_URL and NODE_KEY (REST,
the same key), BENCH_IMAGE, BENCH_POOL (the pool's metric label), BENCH_ITERATIONS. Prints one
JSON object of series (milliseconds) on stdout.
"""

import json
import os
import subprocess
import time

import requests
from bench_pool import NODE, ms, wait_pool
from e2b_code_interpreter import Sandbox

KEY = os.environ["NODE_KEY"]
IMAGE = os.environ["BENCH_IMAGE"]
N = int(os.environ.get("BENCH_ITERATIONS", "10"))
TEMPLATE = "code-interpreter-v1"
PY = "python3 -c 'print(1+1)'"


def two(execution):
    if execution.error is not None or execution.text != "2":
        raise RuntimeError(f"run_code('1+1') gave {execution}")


def printed_two(result):
    if result.exit_code != 0 or result.stdout != "2\n":
        raise RuntimeError(f"{PY} gave {result}")


def rest(session, method, path, body=None):
    r = session.request(method, f"{NODE}{path}", json=body, timeout=300)
    if r.status_code >= 300:
        raise RuntimeError(f"{method} {path}: {r.status_code} {r.text}")
    return r.json() if r.content else None


def rest_code(session, sandbox):
    out = rest(session, "POST", "/v1/tools/call",
               {"name": "code.run", "arguments": {"code": "1+1"}, "sandbox_id": sandbox})
    text = [r.get("text") for r in out["structuredContent"]["results"] if r.get("is_main_result")]
    if text != ["2"]:
        raise RuntimeError(f"REST code.run of 1+1 gave {out}")


def main():
    series = ["create_code_pooled", "create_code_cold", "create_command_pooled",
              "create_command_cold", "docker_run", "rest_create_code", "warm_code",
              "warm_command", "warm_rest_code"]
    out = {name: [] for name in series}
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {KEY}"

    for _ in range(N):
        for first, kind in ((lambda s: two(s.run_code("1+1")), "code"),
                            (lambda s: printed_two(s.commands.run(PY)), "command")):
            wait_pool(within=180)
            t0 = time.monotonic()
            pooled = Sandbox.create(TEMPLATE, timeout=300)
            first(pooled)
            out[f"create_{kind}_pooled"].append(ms(t0))
            # The pool was just emptied: this one is made while the caller waits.
            t0 = time.monotonic()
            cold = Sandbox.create(TEMPLATE, timeout=300)
            first(cold)
            out[f"create_{kind}_cold"].append(ms(t0))
            pooled.kill()
            cold.kill()
        t0 = time.monotonic()
        done = subprocess.run(["docker", "run", "--rm", "--network", "none", IMAGE,
                               "python3", "-c", "print(1+1)"],
                              check=True, capture_output=True, text=True)
        out["docker_run"].append(ms(t0))
        if done.stdout != "2\n":
            raise RuntimeError(f"docker run gave {done.stdout!r}")
        t0 = time.monotonic()
        made = rest(session, "POST", "/v1/sandboxes", {"runtime": "code-interpreter"})
        rest_code(session, made["sandbox_id"])
        out["rest_create_code"].append(ms(t0))
        rest(session, "DELETE", f"/v1/sandboxes/{made['sandbox_id']}")

    sbx = Sandbox.create(TEMPLATE, timeout=600)
    made = rest(session, "POST", "/v1/sandboxes", {"runtime": "code-interpreter"})
    for _ in range(3):
        two(sbx.run_code("1+1"))
        printed_two(sbx.commands.run(PY))
        rest_code(session, made["sandbox_id"])
    for _ in range(N * 5):
        t0 = time.monotonic()
        two(sbx.run_code("1+1"))
        out["warm_code"].append(ms(t0))
        t0 = time.monotonic()
        printed_two(sbx.commands.run(PY))
        out["warm_command"].append(ms(t0))
        t0 = time.monotonic()
        rest_code(session, made["sandbox_id"])
        out["warm_rest_code"].append(ms(t0))
    sbx.kill()
    rest(session, "DELETE", f"/v1/sandboxes/{made['sandbox_id']}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
