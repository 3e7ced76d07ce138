"""The streaming form of cmd.run on /mcp, through the official MCP Python SDK (`mcp` on PyPI):
progress notifications carrying output, asked for with the SDK's own `progress_callback`.

Usage: mcp_streaming.py BASE_URL API_KEY KEY_WITHOUT_CMD_RUN. Prints one JSON report on stdout
for the Rust test (tests/suite/streaming.rs) to check:

- `streamed`: a command that prints `one`, waits until /workspace/go exists, then prints `two`
  and `three`. The marker is written (by another call of the same session) from the progress
  callback that received `one`, so the command can only end after a chunk arrived: the chunks
  in order, whether the marker was written before the call answered, and the answer.
- `plain`: the same command without a progress callback (the answer to compare with).
- `capped`: a command over its output cap, streamed.
- `refused`: a command outside the allowlist, with a progress callback: no progress.
- `cancelled`: a command that prints forever, cancelled by the client after its first chunk;
  then `ps` from inside the sandbox, polled until the command is gone (or 30 s).
- `without_tool`: a key whose context does not grant cmd.run, with a progress callback.
"""

import asyncio
import contextlib
import json
import sys

import anyio
import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

WAITS = "echo one; while [ ! -e /workspace/go ]; do sleep 0.1; done; echo two >&2; echo three"
TICKS = "echo started; while true; do echo tick-tock; sleep 0.2; done"
MANY = "i=0; while [ $i -lt 50 ]; do echo line-$i; i=$((i+1)); done"


def dump(result):
    return json.loads(result.model_dump_json(by_alias=True, exclude_none=True))


def sh(script, **extra):
    return {"command": "sh", "args": ["-c", script], **extra}


@contextlib.asynccontextmanager
async def opened(url, key):
    """An initialized MCP session with `key`."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=90) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


async def streamed(session):
    chunks = []
    state = {"marker_before_answer": False}

    async def progress(value, total, message):
        chunks.append({"progress": value, "message": message})
        if message == "one\n" and not state["marker_before_answer"]:
            written = await session.call_tool("fs.write", {"path": "/workspace/go", "content": ""})
            state["marker_before_answer"] = not written.is_error and "answer" not in state
            state["marker"] = dump(written)

    answer = await session.call_tool("cmd.run", sh(WAITS), progress_callback=progress)
    state["answer"] = True
    return {"chunks": chunks, "marker_before_answer": state["marker_before_answer"],
            "marker": state.get("marker"), "result": dump(answer)}


async def capped(session):
    chunks = []

    async def progress(value, total, message):
        chunks.append({"progress": value, "message": message})

    answer = await session.call_tool(
        "cmd.run", sh(MANY, max_output_bytes=64), progress_callback=progress)
    plain = await session.call_tool("cmd.run", sh(MANY, max_output_bytes=64))
    return {"chunks": chunks, "result": dump(answer), "plain": dump(plain)}


async def refused(session):
    chunks = []

    async def progress(value, total, message):
        chunks.append(message)

    answer = await session.call_tool(
        "cmd.run", {"command": "rm -rf /workspace"}, progress_callback=progress)
    plain = await session.call_tool("cmd.run", {"command": "rm -rf /workspace"})
    return {"chunks": chunks, "result": dump(answer), "plain": dump(plain)}


async def cancelled(session):
    first = anyio.Event()

    async def progress(value, total, message):
        first.set()

    async with anyio.create_task_group() as group:
        async def run():
            await session.call_tool("cmd.run", sh(TICKS), progress_callback=progress)

        group.start_soon(run)
        with anyio.fail_after(60):
            await first.wait()
        group.cancel_scope.cancel()
    seen = []
    for _ in range(150):
        ps = dump(await session.call_tool("cmd.run", {"command": "ps -o pid,args"}))
        seen = [l for l in ps["structuredContent"]["stdout"].splitlines() if "tick-tock" in l]
        if not seen:
            break
        await anyio.sleep(0.2)
    return {"got_a_chunk": first.is_set(), "still_running": seen}


async def without_tool(url, key):
    chunks = []

    async def progress(value, total, message):
        chunks.append(message)

    async with opened(url, key) as session:
        answer = await session.call_tool("cmd.run", sh(WAITS), progress_callback=progress)
        return {"chunks": chunks, "result": dump(answer)}


async def main():
    base, key, other = sys.argv[1], sys.argv[2], sys.argv[3]
    url = f"{base}/mcp"
    report = {}
    async with opened(url, key) as session:
        report["streamed"] = await streamed(session)
        report["plain"] = dump(await session.call_tool("cmd.run", sh(WAITS)))
        report["capped"] = await capped(session)
        report["refused"] = await refused(session)
        report["cancelled"] = await cancelled(session)
    report["without_tool"] = await without_tool(url, other)
    print(json.dumps(report))


asyncio.run(main())
