"""Tools for the Qwen3-Omni Thinker: how they read in its prompt, and its calls read back.

Qwen3 models are tuned on one tool format (their chat template's): the tools as JSON lines
inside `<tools>` in the system message, a call as `<tool_call>\\n{"name": ..., "arguments":
{...}}\\n</tool_call>` in the assistant's turn, and a tool's output as a user turn inside
`<tool_response>`. This module writes that format and reads a reply's calls out of its
streamed text (`CallParser`).

Unlike the cascade's (`cascade/tool_decoding.py`), this Thinker's decoding is not held to the
schemas yet (a mask would have to go into its batched step's sampling), nor can it force a
call: `required` and a named tool only narrow what the prompt lists. A call whose JSON does
not parse is passed on as text rather than as a call the client could not run.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence

from ...types import HistoryItem, TextDelta, ToolCallDelta, ToolSpec

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


def tools_text(tools: Sequence[ToolSpec]) -> str:
    """The system message's part about the tools, in the format of Qwen3's template."""
    lines = "\n".join(
        json.dumps(
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters or {"type": "object", "properties": {}},
                },
            }
        )
        for t in tools
    )
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"The function signatures are within <tools></tools> XML tags:\n<tools>\n{lines}\n"
        "</tools>\n\nFor each function call, return a json object with the function name and "
        f"arguments within {OPEN}{CLOSE} XML tags:\n"
        f'{OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CLOSE}'
    )


def offered(tools: Sequence[ToolSpec], choice: str) -> tuple[ToolSpec, ...]:
    """The tools a turn lists: none for tool_choice none, only the named one for a name."""
    if choice == "none":
        return ()
    if choice in ("auto", "required"):
        return tuple(tools)
    return tuple(t for t in tools if t.name == choice)


def history_turn(item: HistoryItem) -> tuple[str, str]:
    """A history item as (role, text), calls and outputs in Qwen3's own format."""
    if item.kind == "function_call":
        try:
            arguments = json.loads(item.arguments or "{}")
        except ValueError:
            arguments = item.arguments  # as the client recorded it
        call = {"name": item.name, "arguments": arguments}
        return "assistant", f"{OPEN}\n{json.dumps(call)}\n{CLOSE}"
    if item.kind == "function_call_output":
        return "user", f"<tool_response>\n{item.text}\n</tool_response>"
    return item.role, item.text


class CallParser:
    """Streamed reply text in; spoken text and calls out, in order.

    Text that might be the start of `<tool_call>` is held back until the next piece says
    whether it is; a call is sent whole (one delta, done) once its closing tag arrives."""

    def __init__(self) -> None:
        self._pending = ""
        self._in_call = False

    def feed(self, text: str) -> list[TextDelta | ToolCallDelta]:
        self._pending += text
        out: list[TextDelta | ToolCallDelta] = []
        while True:
            if self._in_call:
                end = self._pending.find(CLOSE)
                if end < 0:
                    return out
                body, self._pending = self._pending[:end], self._pending[end + len(CLOSE) :]
                self._in_call = False
                out.append(_call(body))
                continue
            start = self._pending.find(OPEN)
            if start >= 0:
                if start:
                    out.append(TextDelta(text=self._pending[:start]))
                self._pending = self._pending[start + len(OPEN) :]
                self._in_call = True
                continue
            keep = _partial_open(self._pending)
            ready = self._pending[: len(self._pending) - keep]
            if ready:
                out.append(TextDelta(text=ready))
            self._pending = self._pending[len(ready) :]
            return out

    def finish(self) -> list[TextDelta | ToolCallDelta]:
        """At the reply's end: what is still held back, as text (an unclosed call too)."""
        rest = (OPEN if self._in_call else "") + self._pending
        self._pending, self._in_call = "", False
        return [TextDelta(text=rest)] if rest else []


def _partial_open(text: str) -> int:
    """How many trailing characters of `text` could begin the call marker."""
    for size in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-size:]):
            return size
    return 0


def _call(body: str) -> TextDelta | ToolCallDelta:
    try:
        call = json.loads(body)
    except ValueError:
        call = None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return TextDelta(text=f"{OPEN}{body}{CLOSE}")
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return TextDelta(text=f"{OPEN}{body}{CLOSE}")
    if not isinstance(arguments, dict):
        return TextDelta(text=f"{OPEN}{body}{CLOSE}")
    call_id = f"call_{uuid.uuid4().hex[:24]}"
    return ToolCallDelta(call_id, call["name"], json.dumps(arguments), done=True)
