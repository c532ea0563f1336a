"""Parley as an MCP client: one server's tools listed, one tool called.

Each listing and each call opens its own streamable-HTTP connection (the official `mcp`
SDK) and closes it: a session holds no connection to a server between calls, so there is
nothing to keep alive, reconnect or leak when the session ends. Every operation runs under
a deadline (`MCP_DEADLINE_S`); a failure becomes `McpError` with OpenAI's error shape for
an `mcp_call` item (`http_error`, `protocol_error` or `tool_execution_error`), and never
stops the session.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from mcp import ClientSession

from .mcp_config import MCP_DEADLINE_S, McpToolConfig

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class McpTool:
    """A tool a server lists, as OpenAI's `mcp_list_tools` item shows it."""

    name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool = False

    def wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            "annotations": {"read_only": self.read_only},
        }


class McpError(Exception):
    """A listing or a call that failed; `kind` and `code` are OpenAI's error object's."""

    def __init__(self, kind: str, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.kind = kind
        self.code = code

    def wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"type": self.kind, "message": str(self)}
        if self.kind != "tool_execution_error":
            body["code"] = self.code
        return body


@asynccontextmanager
async def _connected(config: McpToolConfig) -> AsyncIterator[ClientSession]:
    # Imported here: the MCP SDK takes ~0.4 s to import and only a session with an MCP
    # tool needs it (a GPU host's offline bundle does not carry it).
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    http = create_mcp_http_client(headers=config.http_headers())
    async with (
        http,
        streamable_http_client(config.server_url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def _bounded(
    config: McpToolConfig, work: Callable[[McpToolConfig], Awaitable[T]], deadline_s: float
) -> T:
    try:
        async with asyncio.timeout(deadline_s):
            return await work(config)
    except TimeoutError:
        raise McpError(
            "http_error", f"the MCP server did not answer within {deadline_s:g} s", 504
        ) from None
    except McpError:
        raise
    except Exception as exc:  # connection refused, bad status, bad JSON-RPC: the server's fault
        raise McpError(
            "http_error", f"could not reach the MCP server: {_reason(exc)}", 502
        ) from None


def _reason(exc: BaseException) -> str:
    """The innermost cause: anyio wraps a transport error in task groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def list_tools(config: McpToolConfig, deadline_s: float = MCP_DEADLINE_S) -> list[McpTool]:
    """The server's tools that `allowed_tools` lets through."""

    async def work(config: McpToolConfig) -> list[McpTool]:
        async with _connected(config) as session:
            result = await session.list_tools()
        tools: list[McpTool] = []
        for tool in result.tools:
            hints = tool.annotations
            read_only = bool(hints is not None and hints.read_only_hint)
            if config.allows(tool.name, read_only):
                schema = dict(tool.input_schema or {"type": "object"})
                tools.append(McpTool(tool.name, tool.description or "", schema, read_only))
        return tools

    return await _bounded(config, work, deadline_s)


async def call_tool(
    config: McpToolConfig, name: str, arguments: str, deadline_s: float = MCP_DEADLINE_S
) -> str:
    """The tool's text output; McpError if the call failed (the tool's own error is a
    `tool_execution_error`)."""
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        raise McpError("protocol_error", f"the arguments are not JSON: {exc}", -32602) from None
    if not isinstance(args, dict):
        raise McpError("protocol_error", "the arguments are not a JSON object", -32602)

    async def work(config: McpToolConfig) -> str:
        async with _connected(config) as session:
            result = await session.call_tool(name, args)
        content = getattr(result, "content", None) or []
        text = "\n".join(str(getattr(part, "text", "")) for part in content).strip()
        if getattr(result, "is_error", False):
            raise McpError("tool_execution_error", text or "the tool failed")
        return text

    return await _bounded(config, work, deadline_s)
