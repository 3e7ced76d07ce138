"""Two keys create E2B sandboxes through E2B's own Python SDK, unmodified, while the node keeps
a warm pool of the template: each must get exactly its own env vars, metadata and timeout.

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_KEY_A, E2B_KEY_B (E2B-form keys).
Prints one JSON report on stdout; the Rust test (tests/suite/e2b_pool.rs) judges it.
"""

import json
import os
import time

from e2b import Sandbox


def made(key, who, timeout):
    t0 = time.monotonic()
    sbx = Sandbox.create(
        "base", timeout=timeout, metadata={"owner": who}, envs={"WHO": who}, api_key=key
    )
    out = sbx.commands.run("echo $WHO:$HOME")
    first_output_ms = int((time.monotonic() - t0) * 1000)
    info = sbx.get_info()
    return {
        "id": sbx.sandbox_id,
        "stdout": out.stdout.strip(),
        "metadata": info.metadata,
        "first_output_ms": first_output_ms,
    }


def main():
    report = {
        "a": made(os.environ["E2B_KEY_A"], "a", 120),
        "b": made(os.environ["E2B_KEY_B"], "b", 240),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
