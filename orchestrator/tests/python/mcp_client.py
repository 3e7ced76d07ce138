"""Drives the orchestrator's /mcp endpoint with the official MCP Python SDK (`mcp` on PyPI).

Usage: mcp_client.py BASE_URL API_KEY. Prints one JSON report on stdout for the Rust test
(tests/mcp.rs) to check: the tool list, a file written and read back and a command run in the
session's sandbox, a policy refusal, the session-less revision, and a request without a key.
"""

import asyncio
import json
import sys
import urllib.error
import urllib.request

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client


def dump(result):
    return json.loads(result.model_dump_json(by_alias=True, exclude_none=True))


async def with_session(url, key):
    report = {}
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                report["protocol_version"] = init.protocol_version
                tools = await session.list_tools()
                report["tools"] = [dump(t) for t in tools.tools]
                report["write"] = dump(await session.call_tool(
                    "fs.write", {"path": "/workspace/hello.txt", "content": "héllo from mcp ✓\n"}))
                report["read"] = dump(await session.call_tool(
                    "fs.read", {"path": "/workspace/hello.txt"}))
                report["run"] = dump(await session.call_tool(
                    "cmd.run", {"command": "cat /workspace/hello.txt"}))
                report["refused"] = dump(await session.call_tool(
                    "fs.read", {"path": "/etc/passwd"}))
    return report


async def without_session(url, key):
    """The session-less revision: server/discover, then calls carrying their version."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as session:
                found = await session.discover()
                tools = await session.list_tools()
                listed = await session.call_tool("aegis.runtime.list", {})
                return {
                    "discovered": dump(found),
                    "tool_count": len(tools.tools),
                    "runtime_list": dump(listed),
                }


def without_key(url):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "no-key", "version": "0"}}}).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return {"status": response.status}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "www_authenticate": e.headers.get("WWW-Authenticate")}


async def main():
    base, key = sys.argv[1], sys.argv[2]
    url = f"{base}/mcp"
    report = await with_session(url, key)
    try:
        report["sessionless"] = await without_session(url, key)
    except Exception as e:  # reported, and the Rust test says what failed
        report["sessionless"] = {"error": repr(e)}
    report["no_key"] = without_key(url)
    print(json.dumps(report))


asyncio.run(main())
