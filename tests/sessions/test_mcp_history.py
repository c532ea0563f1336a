"""What the model reads of MCP items, and which approved calls are still to run."""

from __future__ import annotations

import numpy as np

from pipeline.types import PipelineRequest
from sessions.events import ConversationItem
from sessions.mcp_events import mcp_call_item
from sessions.mcp_history import DECLINED, follow_up, pending_approved
from sessions.request_builder import prompt_history


def request_item(item_id: str) -> ConversationItem:
    return ConversationItem(
        id=item_id,
        role="assistant",
        type="mcp_approval_request",
        server_label="w",
        name="get_weather",
        arguments='{"city": "Paris"}',
    )


def answer(request_id: str, approve: bool) -> ConversationItem:
    return ConversationItem(
        role="user", type="mcp_approval_response", approval_request_id=request_id, approve=approve
    )


def test_a_call_reads_as_a_function_call_and_its_output() -> None:
    call = mcp_call_item("w", "get_weather", "call_1")
    call.arguments, call.text, call.status = '{"city": "Paris"}', "Sunny", "completed"
    failed = mcp_call_item("w", "get_weather", "call_2")
    failed.status, failed.error = "completed", {"type": "tool_execution_error", "message": "down"}
    listing = ConversationItem(role="assistant", type="mcp_list_tools", server_label="w", tools=[])
    prompt = prompt_history([ConversationItem(role="user", text="Weather?"), listing, call, failed])
    assert [(h.kind, h.text) for h in prompt] == [
        ("message", "Weather?"),
        ("function_call", ""),
        ("function_call_output", "Sunny"),
        ("function_call", ""),
        ("function_call_output", "The tool failed: down"),
    ]
    assert prompt[1].name == "get_weather" and prompt[1].call_id == prompt[2].call_id == "call_1"


def test_a_refused_call_reads_as_declined_and_an_approved_one_waits_to_run() -> None:
    refused, approved = request_item("mcpr_1"), request_item("mcpr_2")
    items = [refused, answer("mcpr_1", False), approved, answer("mcpr_2", True)]
    prompt = prompt_history(items)
    assert [(h.kind, h.text) for h in prompt] == [
        ("function_call", ""),
        ("function_call_output", DECLINED),
    ]
    assert pending_approved(items) == [approved]
    ran = mcp_call_item("w", "get_weather", "call_3")
    ran.approval_request_id, ran.status = "mcpr_2", "completed"
    assert pending_approved([*items, ran]) == []


def test_the_follow_up_request_reads_the_results_and_chooses_freely() -> None:
    first = PipelineRequest("r", np.ones(160, dtype=np.int16), tool_choice="get_weather")
    call = mcp_call_item("w", "get_weather", "call_1")
    call.text, call.status = "Sunny", "completed"
    again = follow_up(first, [call], "What is the weather?", 1)
    assert again.request_id == "r.1" and again.tool_choice == "auto" and len(again.audio) == 0
    assert [(h.kind, h.text) for h in again.history] == [
        ("message", "What is the weather?"),
        ("function_call", ""),
        ("function_call_output", "Sunny"),
    ]
