"""An external MCP server for the tests of `mcp_servers` (tests/suite/mcp_external.rs).

Usage: mcp_test_server.py TOKEN. Serves Streamable HTTP at /mcp on 127.0.0.1, on a port the
kernel picks; prints `PORT <n>` once the socket listens (connections made from then on wait in
the backlog until the server accepts them). Every request must carry `Authorization: Bearer
TOKEN` (401 otherwise), so the test sees that the node sends the credential it reads from its
environment. Every tool call is appended to the file named by MCP_TEST_CALLS, one JSON line, so
the test can tell what reached the server and what did not.

With MCP_TEST_MODE=json-stateless it answers with plain JSON and keeps no session.

Tools, written with the official Python SDK (`mcp` 2.x, MCPServer):
- add(a, b): the sum, as text.
- shout(text): the text in upper case.
- big(n): a text of n characters ("x" repeated), to test the result cap.
- fail(): a tool error (isError) with a message.
- leak(): a tool error whose message repeats the bearer token.
- slow(seconds): answers after that long, to test the call timeout.

With MCP_TEST_LEAKY=<header value> (a value the node sends as `X-Team`), two careless tools
more, which repeat the node's credentials in every place a server's words reach:
- leaky_listing(note): its description names the bearer token and the header value, its
  input schema holds them as a default, an example and a property name.
- echo_team(): the header value as text, JSON-escaped inside a text, percent-encoded, and as
  the bytes of an image (base64 on the wire).
"""

import asyncio
import json
import os
import socket
import sys

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from starlette.responses import JSONResponse

TOKEN = sys.argv[1]
CALLS = os.environ.get("MCP_TEST_CALLS")

server = MCPServer("test-tools", log_level="WARNING")


def record(tool, arguments):
    if CALLS:
        with open(CALLS, "a", encoding="utf-8") as f:
            f.write(json.dumps({"tool": tool, "arguments": arguments}) + "\n")


@server.tool()
def add(a: int, b: int) -> str:
    """Adds two integers."""
    record("add", {"a": a, "b": b})
    return str(a + b)


@server.tool()
def shout(text: str) -> str:
    """Returns the text in upper case."""
    record("shout", {"text": text})
    return text.upper()


@server.tool()
def big(n: int) -> str:
    """Returns n characters."""
    record("big", {"n": n})
    return "x" * n


@server.tool()
def fail() -> str:
    """Always fails."""
    record("fail", {})
    raise ToolError("the test tool failed on purpose")


@server.tool()
def leak() -> str:
    """Fails with a message that repeats the credential (as a careless server might)."""
    record("leak", {})
    raise ToolError(f"rejected request with Authorization: Bearer {TOKEN}")


@server.tool()
async def slow(seconds: float) -> str:
    """Answers after `seconds`."""
    record("slow", {"seconds": seconds})
    await asyncio.sleep(seconds)
    return "late"


LEAKY = os.environ.get("MCP_TEST_LEAKY")
if LEAKY:
    from urllib.parse import quote

    from mcp.server.mcpserver.utilities.types import Image
    from pydantic import Field

    @server.tool(description=f"Lists things. Send Authorization: Bearer {TOKEN} and X-Team: {LEAKY}.")
    def leaky_listing(
        note: str = Field(default=TOKEN, examples=[LEAKY], description=f"team {LEAKY}"),
    ) -> str:
        record("leaky_listing", {"note": note})
        return "listed"

    @server.tool()
    def echo_team() -> list:
        """Echoes what the node sent."""
        record("echo_team", {})
        return [
            f"team={LEAKY}",
            json.dumps({"team": LEAKY}),
            f"q={quote(LEAKY, safe='')}",
            Image(data=f"bytes {LEAKY} end".encode(), format="png"),
        ]


def with_token(app):
    """Refuses every request without the expected bearer token."""

    async def guarded(scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization") != f"Bearer {TOKEN}".encode():
                await JSONResponse({"error": "unauthorized"}, status_code=401)(scope, receive, send)
                return
        await app(scope, receive, send)

    return guarded


async def main():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    # MCP_TEST_MODE=json-stateless: plain JSON answers and no session (the other shape of the
    # transport); default: SSE answers within a session.
    plain = os.environ.get("MCP_TEST_MODE") == "json-stateless"
    app = with_token(server.streamable_http_app(json_response=plain, stateless_http=plain))
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])


asyncio.run(main())
