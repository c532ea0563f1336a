"""A turn as an OpenAI chat-completions request: messages, tools, sampling.

The conversation goes out as the model server expects any chat: the session's instructions
as the first system message, then the history in order (the user's words and the
assistant's, the assistant's function calls as `tool_calls`, their outputs as `tool`
messages, the session's notes as system messages where they were added), then the turn:
the user's words (typed, and what was heard), and the turn's camera frames as images where
the model takes them.

Prefix caching is the model server's session KV: vLLM reuses the KV of any prompt prefix it
has seen. So a session's request must begin, byte for byte, as its previous one did: the
messages are rendered from the history alone (nothing per request, no timestamps, no
trimming that shifts with each turn), in the same order, with the tools listed in the same
order, and the same JSON for the same arguments. What a turn adds comes at the end.
"""

from __future__ import annotations

import base64
from typing import Any

from ...types import HistoryItem, PipelineRequest, ToolSpec, VideoFrame

DEFAULT_INSTRUCTIONS = "You are a helpful voice assistant. Answer in one or two short sentences."
SPEAK_FIRST = "(The user is waiting for you to speak.)"
"""The user turn of a request that has none (response.create with instructions only)."""

Message = dict[str, Any]


def chat_messages(
    request: PipelineRequest,
    user_text: str,
    *,
    images: bool = False,
    default_instructions: str = DEFAULT_INSTRUCTIONS,
) -> list[Message]:
    """The request's conversation and turn as chat messages."""
    instructions = request.instructions.strip() or default_instructions
    messages: list[Message] = [{"role": "system", "content": instructions}]
    messages += history_messages(request.history)
    content: list[Message] = []
    if user_text.strip():
        content.append({"type": "text", "text": user_text.strip()})
    if images:
        content += [image_part(frame) for frame in request.frames]
    if not content and (len(messages) == 1 or messages[-1]["role"] not in ("user", "tool")):
        content.append({"type": "text", "text": SPEAK_FIRST})
    if content:
        only_text = len(content) == 1 and content[0]["type"] == "text"
        messages.append({"role": "user", "content": content[0]["text"] if only_text else content})
    return messages


def history_messages(items: tuple[HistoryItem, ...]) -> list[Message]:
    """The history in order; consecutive calls of one answer share its assistant message."""
    messages: list[Message] = []
    for item in items:
        if item.kind == "function_call":
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments or "{}"},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif item.kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text})
        elif item.text:
            messages.append({"role": item.role, "content": item.text})
    return messages


def image_part(frame: VideoFrame) -> Message:
    kind = "png" if frame.image.startswith(b"\x89PNG") else "jpeg"
    data = base64.b64encode(frame.image).decode("ascii")
    return {"type": "image_url", "image_url": {"url": f"data:image/{kind};base64,{data}"}}


def tool_list(tools: tuple[ToolSpec, ...], strict: bool = False) -> list[Message]:
    """The tools as the request lists them; `strict`: ask the server to hold the arguments
    to each tool's schema (vLLM 0.32 otherwise answered a named call of `get_weather(city)`
    with the bare `"Paris"`; OpenAI's own API refuses `strict` for a schema that does not
    require every property)."""
    listed: list[Message] = []
    for tool in tools:
        function: Message = {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters or {"type": "object", "properties": {}},
        }
        if strict:
            function["strict"] = True
        listed.append({"type": "function", "function": function})
    return listed


def tool_choice(choice: str, tools: tuple[ToolSpec, ...]) -> str | Message:
    if choice in ("auto", "none", "required"):
        return choice
    if any(tool.name == choice for tool in tools):
        return {"type": "function", "function": {"name": choice}}
    raise ValueError(f"tool_choice {choice!r} names none of the tools")


def request_body(
    request: PipelineRequest,
    messages: list[Message],
    *,
    model: str,
    max_tokens: int,
    sampling: dict[str, Any],
    strict_tools: bool = False,
) -> dict[str, Any]:
    """The `/v1/chat/completions` body: streamed, with the usage in the last chunk."""
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": min(max_tokens, request.max_output_tokens or max_tokens),
        **sampling,
    }
    choice = request.tool_choice or "auto"
    if request.tools and choice != "none":
        body["tools"] = tool_list(request.tools, strict_tools)
        body["tool_choice"] = tool_choice(choice, request.tools)
        if not request.parallel_tool_calls:
            body["parallel_tool_calls"] = False
    return body
