"""A small MCP server for the MCP tests: streamable HTTP on 127.0.0.1:<argv[1]>/mcp.

`get_weather(city)` answers a fixed forecast; `broken_weather(city)` raises, as a tool whose
backend is down does; `slow_weather(city)` takes a minute."""

from __future__ import annotations

import asyncio
import sys

from mcp.server.mcpserver import MCPServer

FORECAST = "Sunny and 21 degrees"

server = MCPServer("weather")


@server.tool()
def get_weather(city: str) -> str:
    """Get the current weather in a city"""
    return f"{FORECAST} in {city}."


@server.tool()
def broken_weather(city: str) -> str:
    """Get the weather from the old service"""
    raise RuntimeError("the forecast service is down")


@server.tool()
async def slow_weather(city: str) -> str:
    """Get the weather from the slow service"""
    await asyncio.sleep(60)
    return f"{FORECAST} in {city}."


if __name__ == "__main__":
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
