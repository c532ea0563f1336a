"""MCP's session events and items -> OpenAI Realtime (GA) JSON.

The item shapes are the SDK's `RealtimeMcpListTools`, `RealtimeMcpToolCall`,
`RealtimeMcpApprovalRequest` and `RealtimeMcpApprovalResponse`; the events carry
`output_index` 0 here, and `GAExpander` (ga_events.py) puts in the item's place in the
response. A session's MCP tools are echoed in `session.tools` after its function tools,
with the authorization redacted.
"""

from __future__ import annotations

from typing import Any

from sessions.events import ConversationItem, Event
from sessions.mcp_events import (
    McpCallArgumentsDelta,
    McpCallArgumentsDone,
    McpCallCompleted,
    McpCallFailed,
    McpCallInProgress,
    McpListToolsCompleted,
    McpListToolsFailed,
    McpListToolsInProgress,
)


def mcp_item_object(item: ConversationItem) -> dict[str, Any]:
    """A GA `realtime.item` of one of the four MCP types."""
    body: dict[str, Any] = {"id": item.id, "object": "realtime.item", "type": item.type}
    if item.type == "mcp_list_tools":
        body |= {"server_label": item.server_label, "tools": item.tools or []}
    elif item.type == "mcp_call":
        body |= {
            "server_label": item.server_label,
            "name": item.name,
            "arguments": item.arguments,
            "approval_request_id": item.approval_request_id or None,
            "output": item.text if item.status == "completed" and item.error is None else None,
            "error": item.error,
            "status": item.status,  # not in the SDK's type (extra fields are kept): what ended
        }
    elif item.type == "mcp_approval_request":
        body |= {"server_label": item.server_label, "name": item.name, "arguments": item.arguments}
    else:
        body |= {
            "approval_request_id": item.approval_request_id,
            "approve": item.approve,
            "reason": item.text or None,
        }
    return body


def mcp_event_body(event: Event) -> dict[str, Any] | None:
    """The GA fields of an MCP event (without `type` and `event_id`); None for another."""
    match event:
        case McpListToolsInProgress() | McpListToolsCompleted() | McpListToolsFailed():
            return {"item_id": event.item_id}
        case McpCallArgumentsDelta():
            where = {"response_id": event.response_id, "item_id": event.item_id}
            return where | {"output_index": 0, "delta": event.delta}
        case McpCallArgumentsDone():
            where = {"response_id": event.response_id, "item_id": event.item_id}
            return where | {"output_index": 0, "arguments": event.arguments}
        case McpCallInProgress():
            return {"item_id": event.item_id, "output_index": 0}
        case McpCallCompleted() | McpCallFailed():
            return {"item_id": event.item.id, "output_index": 0}
    return None
