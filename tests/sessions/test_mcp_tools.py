"""What the model is offered of an MCP server's listing: each tool under its own name,
described with the server's `server_description` when it has one. The listing itself is
stood in for (`list_tools`), so no server runs here (tests/realtime/test_mcp_tools.py runs
one)."""

from __future__ import annotations

import asyncio

import pytest

from sessions import mcp_tools
from sessions.config import ToolConfig
from sessions.events import ConversationItem, Event
from sessions.mcp_client import McpTool
from sessions.mcp_config import McpToolConfig
from sessions.mcp_tools import McpTools

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}


class _History:
    """The session's history, as much of it as a listing touches."""

    async def last_id(self) -> str | None:
        return None

    async def append(self, item: ConversationItem) -> None:
        return None


async def offered(
    monkeypatch: pytest.MonkeyPatch, server: McpToolConfig, *listed: McpTool
) -> tuple[ToolConfig, ...]:
    async def list_tools(config: McpToolConfig, deadline_s: float) -> list[McpTool]:
        return list(listed)

    monkeypatch.setattr(mcp_tools, "list_tools", list_tools)
    events: list[Event] = []
    tools = McpTools("sess_1", _History(), events.append)  # type: ignore[arg-type]
    try:
        tools.reconfigure((server,))
        async with asyncio.timeout(5):
            while not any(e.type == "mcp_list_tools.completed" for e in events):
                await asyncio.sleep(0)
        return tools.tool_configs(())
    finally:
        await tools.close()


async def test_the_servers_description_goes_with_each_of_its_tools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = McpToolConfig(
        server_label="weather",
        server_url="http://127.0.0.1:9/mcp",
        server_description="Forecasts for European cities",
    )
    got = await offered(
        monkeypatch,
        server,
        McpTool("get_weather", "The weather in a city.", SCHEMA),
        McpTool("get_alerts", "", SCHEMA),
    )
    assert [(tool.name, tool.description) for tool in got] == [
        ("get_weather", "The weather in a city. (server weather: Forecasts for European cities)"),
        ("get_alerts", "server weather: Forecasts for European cities"),
    ]


async def test_without_a_description_the_tools_are_offered_as_listed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = McpToolConfig(server_label="weather", server_url="http://127.0.0.1:9/mcp")
    (tool,) = await offered(monkeypatch, server, McpTool("get_weather", "Weather.", SCHEMA))
    assert tool.description == "Weather."
