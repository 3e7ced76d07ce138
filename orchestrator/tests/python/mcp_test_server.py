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

With MCP_TEST_LEAKY=<header value> (a value the node sends as `X-Team`), careless tools more,
which repeat the node's credentials in every place a server's words reach:
- leaky_listing(note): its title and description name the bearer token and the header value,
  its input schema holds them as a default, an example, a description and an extra keyword
  (named by the header value), its output schema too.
- echo_team(): the header value as text, JSON-escaped inside a text, percent-encoded, and as
  the bytes of an image (base64 on the wire).
- echo_team_structured(): a result built by hand: texts with the header value in `\\u` escapes,
  partly percent-encoded (lower-case hex), in a `data:` URL, in base64 at an odd offset inside
  a text, an embedded resource blob, and structuredContent holding it as a value, a key, a
  JSON-escaped text and a `blob` of base64 bytes.
- fail_team(): a tool error whose message repeats the header value.
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
    import base64
    from urllib.parse import quote

    from mcp.server.mcpserver.utilities.types import Image
    from mcp_types import BlobResourceContents, CallToolResult, EmbeddedResource, TextContent
    from pydantic import BaseModel, Field

    class Listed(BaseModel):
        team: str = Field(description=f"the team, {LEAKY}")

    @server.tool(
        title=f"Leaky {TOKEN}",
        description=f"Lists things. Send Authorization: Bearer {TOKEN} and X-Team: {LEAKY}.",
    )
    def leaky_listing(
        note: str = Field(
            default=TOKEN,
            examples=[LEAKY],
            description=f"team {LEAKY}",
            json_schema_extra={LEAKY: TOKEN, "x-token": f"Bearer {TOKEN}"},
        ),
    ) -> Listed:
        record("leaky_listing", {"note": note})
        return Listed(team="listed")

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    @server.tool()
    def echo_team_structured() -> CallToolResult:
        """Echoes what the node sent, structured."""
        record("echo_team_structured", {})
        unicode_escaped = LEAKY.replace("\\", "\\u005c").replace('"', "\\u0022")
        partly_percent = LEAKY.replace('"', "%22").replace("\\", "%5c")
        blob = b64(f"bytes {LEAKY} end".encode())
        return CallToolResult(
            content=[
                TextContent(type="text", text=f'{{"team": "{unicode_escaped}"}}'),
                TextContent(type="text", text=f"https://example.test/?team={partly_percent}&x=1"),
                TextContent(type="text", text=f"data:text/plain;base64,{b64(('xy' + LEAKY).encode())}"),
                TextContent(type="text", text=f"raw: {b64(('xy' + LEAKY + '!').encode())}."),
                EmbeddedResource(
                    type="resource",
                    resource=BlobResourceContents(uri="file:///team.bin", mime_type="application/octet-stream", blob=blob),
                ),
            ],
            structured_content={
                "team": LEAKY,
                LEAKY: {"nested": [f"x-team: {LEAKY}"]},
                "json": json.dumps({"team": LEAKY}),
                "blob": blob,
                "image": {"data": b64(b"\x89PNG" + LEAKY.encode()), "mimeType": "image/png"},
            },
        )

    @server.tool()
    def fail_team() -> str:
        """Fails with a message that repeats the header value."""
        record("fail_team", {})
        raise ToolError(f"team {LEAKY} is not allowed here; sent {json.dumps(LEAKY)}")

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
