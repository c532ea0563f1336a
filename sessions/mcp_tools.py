"""A session's MCP servers: what each lists, and the tasks that list them.

When `session.update` (or the session's creation) brings an MCP tool, its server is
listed in a task of the session's own: `mcp_list_tools.in_progress`, then the listing
as an `mcp_list_tools` conversation item and `mcp_list_tools.completed`, or
`mcp_list_tools.failed` and an `error` with the reason (the session goes on; the server
offers nothing until a later `session.update` lists it again). The listed tools are
offered to the model beside the function tools, under their own names (a function tool
of the same name wins), each described with its server's `server_description` if it has
one. A server dropped or changed by an update has its listing forgotten
and, if it is still being listed, that listing cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from pipeline.tasks import TaskSet

from .config import ToolConfig
from .events import ConversationItem, ConversationItemCreated, ErrorEvent, Event
from .history import History
from .mcp_client import McpError, McpTool, list_tools
from .mcp_config import MCP_DEADLINE_S, McpToolConfig
from .mcp_events import McpListToolsCompleted, McpListToolsFailed, McpListToolsInProgress

log = logging.getLogger("parley.sessions.mcp")


class McpTools:
    def __init__(
        self,
        session_id: str,
        history: History,
        emit: Callable[[Event], None],
        deadline_s: float = MCP_DEADLINE_S,
    ) -> None:
        self._session_id = session_id
        self._history = history
        self._emit = emit
        self.deadline_s = deadline_s
        self._tasks = TaskSet(f"{session_id}:mcp")
        self._servers: dict[str, McpToolConfig] = {}
        self._listings: dict[str, asyncio.Task[None]] = {}
        self._listed: dict[str, tuple[McpToolConfig, list[McpTool]]] = {}
        """Tool name -> its server and what that server listed (in listing order)."""

    def reconfigure(self, servers: tuple[McpToolConfig, ...]) -> None:
        """List each new or changed server; forget those no longer configured."""
        wanted = {server.server_label: server for server in servers}
        for label, old in list(self._servers.items()):
            if wanted.get(label) != old:
                self._forget(label)
        for label, server in wanted.items():
            if label not in self._servers:
                self._servers[label] = server
                self._listings[label] = self._tasks.create_task(
                    self._list(server), name=f"{self._session_id}:mcp:{label}"
                )

    def _forget(self, label: str) -> None:
        del self._servers[label]
        task = self._listings.pop(label, None)
        if task is not None:
            task.cancel()  # the TaskSet awaits it
        for name, (server, _) in list(self._listed.items()):
            if server.server_label == label:
                del self._listed[name]

    async def _list(self, server: McpToolConfig) -> None:
        item = ConversationItem(role="assistant", type="mcp_list_tools")
        item.server_label = server.server_label
        self._emit(McpListToolsInProgress(item_id=item.id))
        try:
            tools = await list_tools(server, self.deadline_s)
        except McpError as exc:
            log.warning("session %s: MCP server %s: %s", self._session_id, server.server_label, exc)
            self._emit(McpListToolsFailed(item_id=item.id))
            self._emit(
                ErrorEvent(
                    code="mcp_list_tools_failed",
                    message=f"MCP server {server.server_label!r}: {exc}",
                    error_type="server_error",
                )
            )
            return
        finally:  # this listing's entry, unless an update replaced it with a new one
            if self._listings.get(server.server_label) is asyncio.current_task():
                del self._listings[server.server_label]
        item.tools = [tool.wire() for tool in tools]
        for tool in tools:
            self._listed.setdefault(tool.name, (server, tools))
        previous = None
        try:
            previous = await self._history.last_id()
            await self._history.append(item)
        except Exception as exc:  # the store is down: the tools are offered all the same
            log.warning("session %s: the MCP listing was not stored: %r", self._session_id, exc)
        self._emit(ConversationItemCreated(item=item, previous_item_id=previous))
        self._emit(McpListToolsCompleted(item_id=item.id))

    def tool_configs(self, functions: tuple[ToolConfig, ...]) -> tuple[ToolConfig, ...]:
        """The listed tools as the model is offered them, but those named as one of
        `functions` (whose names win)."""
        taken = {tool.name for tool in functions}
        offered: list[ToolConfig] = []
        for name, (server, tools) in self._listed.items():
            if name in taken:
                continue
            tool = next(t for t in tools if t.name == name)
            description = tool.description
            if server.server_description:  # OpenAI's context for the model on the server
                about = f"server {server.server_label}: {server.server_description}"
                description = f"{description} ({about})" if description else about
            try:
                offered.append(
                    ToolConfig(name=name, description=description, parameters=tool.input_schema)
                )
            except ValueError:  # a name or schema OpenAI's function tools cannot carry
                log.info(
                    "session %s: MCP tool %s of %s not offered",
                    self._session_id,
                    name,
                    server.server_label,
                )
        return tuple(offered)

    def server_of(self, name: str, functions: tuple[ToolConfig, ...] = ()) -> McpToolConfig | None:
        """The server a call of `name` goes to; None for a function tool."""
        if any(tool.name == name for tool in functions):
            return None
        entry = self._listed.get(name)
        return entry[0] if entry is not None else None

    def server(self, label: str) -> McpToolConfig | None:
        return self._servers.get(label)

    def read_only(self, name: str) -> bool:
        entry = self._listed.get(name)
        return entry is not None and any(t.name == name and t.read_only for t in entry[1])

    async def close(self) -> None:
        """Cancel and await the listings still running. Idempotent."""
        await self._tasks.close()
