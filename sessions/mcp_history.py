"""MCP items as the model reads them, and the approved calls that have not run yet.

The model knows function calls, not MCP: an `mcp_call` is shown to it as the function call
it made and that call's output (the server's text, or its error), so a model that called an
MCP tool reads the result as it would a function's. A refused approval is shown as the call
and an output saying it was not run, so the model can tell the user. Listings and approval
requests are not in the prompt (the listed tools are offered as tools).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from pipeline.types import HistoryItem, PipelineRequest

from .events import ConversationItem

DECLINED = "The user declined this call of the tool; it was not run."
MCP_ROUNDS = 4
"""How many times one response lets the model write: its first answer, and after each
round of MCP calls, its answer with their results."""


def _call(item: ConversationItem, call_id: str, output: str) -> tuple[HistoryItem, ...]:
    return (
        HistoryItem(
            role="assistant",
            text="",
            item_id=item.id,
            kind="function_call",
            name=item.name,
            call_id=call_id,
            arguments=item.arguments,
        ),
        HistoryItem(
            role="user",
            text=output,
            item_id=f"{item.id}.output",
            kind="function_call_output",
            call_id=call_id,
        ),
    )


def call_output(item: ConversationItem) -> str:
    """What the model reads of a finished `mcp_call`."""
    if item.error is not None:
        return f"The tool failed: {item.error.get('message', 'unknown error')}"
    return item.text


def mcp_history(
    item: ConversationItem, requests: dict[str, ConversationItem]
) -> tuple[HistoryItem, ...]:
    """The prompt's items for one MCP item; `requests`: the approval requests by id."""
    if item.type == "mcp_call" and item.status != "in_progress":
        return _call(item, item.call_id or item.id, call_output(item))
    if item.type == "mcp_approval_response" and not item.approve:
        request = requests.get(item.approval_request_id)
        if request is not None:
            return _call(request, request.id, DECLINED)
    return ()


def pending_approved(items: Sequence[ConversationItem]) -> list[ConversationItem]:
    """The approval requests the client approved whose call has not run yet, in order."""
    ran = {item.approval_request_id for item in items if item.type == "mcp_call"}
    requests = {item.id: item for item in items if item.type == "mcp_approval_request"}
    approved = [
        item.approval_request_id
        for item in items
        if item.type == "mcp_approval_response" and item.approve
    ]
    return [requests[i] for i in dict.fromkeys(approved) if i in requests and i not in ran]


def follow_up(
    request: PipelineRequest, ran: Sequence[ConversationItem], heard: str, round_: int
) -> PipelineRequest:
    """The request that lets the model read the results of the MCP calls `ran`: the
    turn it answered (`heard`: its words, if it was spoken) joins the history, then the
    calls and their outputs; the tool choice is `auto` (a forced tool was called)."""
    history = list(request.history)
    said = request.text or heard
    if said:
        history.append(HistoryItem(role="user", text=said))
    for item in ran:
        history += _call(item, item.call_id or item.id, call_output(item))
    return replace(
        request,
        request_id=f"{request.request_id}.{round_}",
        audio=np.zeros(0, dtype=np.int16),
        text=None,
        transcript=None,
        streamed_turn="",
        history=tuple(history),
        tool_choice="auto",
    )
