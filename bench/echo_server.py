#!/usr/bin/env python3
"""A bare MCP server with one tool, ``echo``: the ceiling that bench/run.py compares Prickle with.

It runs on the same stack as Prickle: the SDK's low-level ``Server``, a stateful
``StreamableHTTPSessionManager`` in SSE mode behind ``StreamableHTTPASGIApp``, a Starlette
``Route("/mcp")`` whose endpoint is an ASGI class instance, the manager entered in the
Starlette lifespan, and uvicorn (log level warning, one worker). It checks no credential,
touches no database and guards no Host header: it is what the stack costs by itself.

    python bench/echo_server.py PORT       # serves http://127.0.0.1:PORT/mcp

uvicorn binds 127.0.0.1:PORT itself (so its sockets get TCP_NODELAY, as asyncio gives any
socket it creates for TCP); the port accepts connections once the lifespan has started.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import mcp_types
import uvicorn
from mcp.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.routing import Route

ECHO_SCHEMA = {
    "type": "object",
    "properties": {"project": {"type": "string"}, "body": {"type": "string"}},
    "required": ["body"],
}
ECHO_TOOL = mcp_types.Tool(name="echo", description="Return the body it was given.", input_schema=ECHO_SCHEMA,
                           output_schema={"type": "object", "properties": {"body": {"type": "string"}}})


async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
    return mcp_types.ListToolsResult(tools=[ECHO_TOOL])


async def call_tool(ctx: Any, params: mcp_types.CallToolRequestParams) -> mcp_types.CallToolResult:
    body = str((params.arguments or {}).get("body", ""))
    return mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=body)],
                                    structured_content={"body": body})


class _Endpoint:
    """``/mcp`` as an ASGI class instance, the way Prickle mounts its transport (minus the token check)."""

    def __init__(self, transport: Any):
        self.transport = transport

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        await self.transport(scope, receive, send)


def create_app() -> Starlette:
    server = Server("echo", version="1", on_list_tools=list_tools, on_call_tool=call_tool,
                    get_tool_input_schema=lambda name: ECHO_SCHEMA if name == "echo" else None)
    manager = StreamableHTTPSessionManager(app=server, json_response=False, stateless=False)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        async with manager.run():
            yield

    endpoint = _Endpoint(StreamableHTTPASGIApp(manager))
    return Starlette(routes=[Route("/mcp", endpoint=endpoint, methods=["GET", "POST", "DELETE"])], lifespan=lifespan)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python bench/echo_server.py PORT")
    uvicorn.run(create_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", lifespan="on",
                workers=1, timeout_graceful_shutdown=3)


if __name__ == "__main__":
    main()
