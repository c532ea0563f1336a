"""The chat completion body the OpenAI-compatible Thinker sends: the session's
`parallel_tool_calls: false` goes with the tools to the model server."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.engines.openai_chat.chat_messages import request_body
from pipeline.types import PipelineRequest, ToolSpec

WEATHER = ToolSpec("get_weather", "The weather in a city.", {"type": "object"})


def body(**fields: Any) -> dict[str, Any]:
    request = PipelineRequest("r", np.zeros(0, np.int16), text="Hi.", **fields)
    return request_body(request, [], model="m", max_tokens=64, sampling={})


def test_parallel_tool_calls_off_is_sent_with_the_tools() -> None:
    assert body(tools=(WEATHER,), parallel_tool_calls=False)["parallel_tool_calls"] is False
    assert "parallel_tool_calls" not in body(tools=(WEATHER,))  # the server's default: on
    assert "parallel_tool_calls" not in body(parallel_tool_calls=False)  # no tools, no calls
