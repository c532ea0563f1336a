"""MCP's items and events, as OpenAI Realtime names them.

The items are `ConversationItem`s (so the history stores and replays them like any other):
- `mcp_list_tools`: `server_label`, and the listed `tools` (OpenAI's `{name, description,
  input_schema, annotations}`);
- `mcp_call`: `server_label`, `name`, `arguments`, `call_id` (Parley's own, for the prompt),
  the output as `text` or the failure as `error`, and `approval_request_id` if it waited;
- `mcp_approval_request`: `server_label`, `name`, `arguments` (the call asked for);
- `mcp_approval_response`: `approval_request_id`, `approve`, the reason (if any) as `text`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .events import ConversationItem, Event


def mcp_call_item(server_label: str, name: str, call_id: str) -> ConversationItem:
    return ConversationItem(
        role="assistant",
        type="mcp_call",
        status="in_progress",
        server_label=server_label,
        name=name,
        call_id=call_id,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class McpListToolsInProgress(Event):
    type: ClassVar[str] = "mcp_list_tools.in_progress"
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class McpListToolsCompleted(Event):
    type: ClassVar[str] = "mcp_list_tools.completed"
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class McpListToolsFailed(Event):
    """OpenAI's event names only the item; the reason follows in an `error` event."""

    type: ClassVar[str] = "mcp_list_tools.failed"
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class McpCallArgumentsDelta(Event):
    type: ClassVar[str] = "response.mcp_call_arguments.delta"
    response_id: str
    item_id: str
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class McpCallArgumentsDone(Event):
    type: ClassVar[str] = "response.mcp_call_arguments.done"
    response_id: str
    item_id: str
    arguments: str


@dataclass(frozen=True, slots=True, kw_only=True)
class McpCallInProgress(Event):
    type: ClassVar[str] = "response.mcp_call.in_progress"
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class McpCallCompleted(Event):
    """The call answered: its item (with the output) is done too."""

    type: ClassVar[str] = "response.mcp_call.completed"
    item: ConversationItem


@dataclass(frozen=True, slots=True, kw_only=True)
class McpCallFailed(Event):
    """The call failed: its item carries the error, and is done too."""

    type: ClassVar[str] = "response.mcp_call.failed"
    item: ConversationItem


MCP_CALL_ENDS = (McpCallCompleted, McpCallFailed)
MCP_CALL_STEPS = (McpCallArgumentsDelta, McpCallArgumentsDone, McpCallInProgress)
MCP_EVENTS = (
    McpListToolsInProgress,
    McpListToolsCompleted,
    McpListToolsFailed,
    *MCP_CALL_STEPS,
    *MCP_CALL_ENDS,
)
