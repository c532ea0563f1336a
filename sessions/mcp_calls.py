"""The MCP calls of one response.

When the model calls a listed MCP tool, the call is an output item of the response as in
OpenAI's API: an `mcp_call` item announced with its first arguments
(`response.output_item.added`), `response.mcp_call_arguments.delta` / `.done`, then
`response.mcp_call.in_progress` while Parley calls the server (bounded by the deadline),
and `response.mcp_call.completed` with the output in the item, or `.failed` with the
error in it. The finished call joins the conversation, and the response goes on: the model
reads the result and speaks it in the same response (response.py).

A call that needs approval is not made: it ends as an `mcp_approval_request` item. The
client answers with an `mcp_approval_response` item and `response.create`; that response
first runs each approved call (an `mcp_call` item with its `approval_request_id`), then
the model speaks. A refused call is never made; the model reads that it was refused.

A barge-in or a response.cancel cancels the response's task, and with it the call in
flight (its HTTP request is closed); the item ends `incomplete` in response.done.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

from pipeline.types import ToolCallDelta

from .config import ToolConfig
from .events import ConversationItem, ConversationItemCreated, Event, new_id
from .history import History
from .mcp_client import McpError, call_tool
from .mcp_config import McpToolConfig
from .mcp_events import (
    McpCallArgumentsDelta,
    McpCallArgumentsDone,
    McpCallCompleted,
    McpCallFailed,
    McpCallInProgress,
    mcp_call_item,
)
from .mcp_history import pending_approved
from .mcp_tools import McpTools


class McpCalls:
    def __init__(
        self,
        tools: McpTools,
        response_id: str,
        history: History,
        emit: Callable[[Event], None],
        previous_id: Callable[[], Awaitable[str | None]],
        outputs: list[ConversationItem],
        functions: tuple[ToolConfig, ...],
        in_conversation: bool,
    ) -> None:
        """`outputs`: the response's output items after its message (its `calls`), which
        these calls join; `functions`: the response's function tools (their names win)."""
        self._tools = tools
        self._response_id = response_id
        self._history = history
        self._emit = emit
        self._previous_id = previous_id
        self._outputs = outputs
        self._functions = functions
        self._in_conversation = in_conversation
        self._streaming: dict[str, tuple[McpToolConfig, ConversationItem, bool]] = {}
        """call_id -> the call the model is writing: its server, item, and whether it waits
        for approval."""
        self._ready: list[tuple[McpToolConfig, ConversationItem]] = []
        self.ran: list[ConversationItem] = []
        """The calls run since the model last wrote (what it has not read yet)."""

    def handles(self, name: str) -> bool:
        return self._tools.server_of(name, self._functions) is not None

    async def on_delta(self, chunk: ToolCallDelta) -> None:
        entry = self._streaming.get(chunk.call_id)
        if entry is None:
            server = self._tools.server_of(chunk.name, self._functions)
            assert server is not None  # handles() said so
            waits = server.needs_approval(chunk.name, self._tools.read_only(chunk.name))
            if waits:
                item = ConversationItem(
                    id=new_id("mcpr"),
                    role="assistant",
                    type="mcp_approval_request",
                    server_label=server.server_label,
                    name=chunk.name,
                )
            else:
                item = mcp_call_item(server.server_label, chunk.name, chunk.call_id)
                await self._announce(item)
            entry = self._streaming[chunk.call_id] = (server, item, waits)
        server, item, waits = entry
        if chunk.arguments:
            item.arguments += chunk.arguments
            if not waits:
                self._emit(
                    McpCallArgumentsDelta(
                        response_id=self._response_id, item_id=item.id, delta=chunk.arguments
                    )
                )
        if not chunk.done:
            return
        del self._streaming[chunk.call_id]
        if waits:  # announced whole, done with the response
            await self._announce(item)
            if self._in_conversation:
                await self._history.append(item)
            return
        self._emit(
            McpCallArgumentsDone(
                response_id=self._response_id, item_id=item.id, arguments=item.arguments
            )
        )
        self._ready.append((server, item))

    async def _announce(self, item: ConversationItem) -> None:
        self._outputs.append(item)
        previous = await self._previous_id()
        self._emit(
            ConversationItemCreated(
                item=replace(item), previous_item_id=previous, response_id=self._response_id
            )
        )

    async def run_ready(self) -> None:
        """Run the calls the model finished writing, one after the other."""
        ready, self._ready = self._ready, []
        for server, item in ready:
            await self._run(server, item)

    async def run_approved(self) -> None:
        """Before the model writes: run the calls the client approved since."""
        items = await self._history.items()
        for request in pending_approved(items):
            server = self._tools.server(request.server_label)
            item = mcp_call_item(request.server_label, request.name, new_id("call"))
            item.approval_request_id = request.id
            item.arguments = request.arguments
            await self._announce(item)
            if server is None:  # the server was removed from the session since
                item.error = {"type": "http_error", "code": 404, "message": "no such MCP server"}
                await self._end(item, failed=True)
                continue
            for event in (
                McpCallArgumentsDelta(
                    response_id=self._response_id, item_id=item.id, delta=item.arguments
                ),
                McpCallArgumentsDone(
                    response_id=self._response_id, item_id=item.id, arguments=item.arguments
                ),
            ):
                self._emit(event)
            await self._run(server, item)
        self.ran = []  # in the history now: the request the model writes from has them

    async def _run(self, server: McpToolConfig, item: ConversationItem) -> None:
        self._emit(McpCallInProgress(item_id=item.id))
        try:
            item.text = await call_tool(server, item.name, item.arguments, self._tools.deadline_s)
        except McpError as exc:
            item.error = exc.wire()
            await self._end(item, failed=True)
        else:
            await self._end(item, failed=False)

    async def _end(self, item: ConversationItem, *, failed: bool) -> None:
        item.status = "completed"
        if self._in_conversation:
            await self._history.append(item)
        self.ran.append(item)
        event = McpCallFailed if failed else McpCallCompleted
        self._emit(event(item=replace(item)))
