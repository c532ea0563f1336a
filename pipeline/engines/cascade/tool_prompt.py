"""How tools and function calls read in the Thinker's chat prompt, and the call's grammar.

SmolLM2's chat template knows nothing of tools, so the Thinker writes them itself, in the
Hermes style that small instruction models were tuned on (SmolLM2's own function-calling data
used it): the tools as JSON lines inside `<tools>` in the system message, a call as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in the assistant's turn.

A call the model makes is decoded under `call_grammar` (a Lark grammar for llguidance, see
`tool_decoding.py`): the marker, one of the allowed tools' names, and arguments that follow
that tool's JSON schema, so what the model writes always parses. Past calls and their outputs
(history items) are rendered the same way the model writes them, and the output as a user turn
that says in plain words what the tool returned: a 135M model uses a result told that way far
more often than one wrapped in tags it never saw.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ...types import HistoryItem, ToolSpec

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
CALL_HEAD = '{"name": "'
ARGUMENTS_KEY = '", "arguments": '
CALL_TAIL = "}" + CALL_CLOSE

MAX_STRING = 60
"""Characters in a string argument when its schema sets no maxLength: a bound on the call's
length, so a model that rambles inside a string still closes it within the token budget."""
MAX_ITEMS = 6
"""Items in an array argument when its schema sets no maxItems, for the same reason."""


def tools_system_text(tools: Sequence[ToolSpec]) -> str:
    """The system message's part about the tools, in the Hermes manner (each tool a
    `{"type": "function", "function": ...}` line inside `<tools>`). Measured against a
    shorter listing of the same tools, this wording widened the gap in log P(call marker)
    between prompts that need a tool and prompts that do not from 1.4 to 2.1 nats."""
    lines = [
        json.dumps(
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                },
            }
        )
        for t in tools
    ]
    return (
        "\nYou are also a function calling AI model. The function signatures you may call are "
        "inside <tools></tools> XML tags:\n<tools>\n" + "\n".join(lines) + "\n</tools>\n"
        "To call a function, return a json object with the function name and arguments "
        f"inside {CALL_OPEN}{CALL_CLOSE} XML tags."
    )


def call_text(name: str, arguments: str) -> str:
    """A call exactly as the model writes one."""
    return f"{CALL_OPEN}{CALL_HEAD}{name}{ARGUMENTS_KEY}{arguments.strip() or '{}'}{CALL_TAIL}"


def history_messages(items: Sequence[HistoryItem]) -> list[dict[str, str]]:
    """Chat messages for the conversation so far (system items excluded), calls included."""
    names = {item.call_id: item.name for item in items if item.kind == "function_call"}
    messages: list[dict[str, str]] = []
    for item in items:
        if item.kind == "function_call":
            messages.append({"role": "assistant", "content": call_text(item.name, item.arguments)})
        elif item.kind == "function_call_output":
            tool = names.get(item.call_id, "the tool")
            result = plain_words(item.text).rstrip(". ")
            said = f"Result of {tool}: {result}. Now answer my question."
            messages.append({"role": "user", "content": said})
        elif item.role != "system" and item.text:
            messages.append({"role": item.role, "content": item.text})
    return messages


def plain_words(output: str) -> str:
    """A tool's output as a small model reads it best: `{"temperature_c": 21}` becomes
    `temperature_c is 21` (measured: the raw JSON got "quite sunny", the words got "a
    temperature of 21 degrees Celsius and a sunny sky"). Anything but an object stays as is."""
    try:
        value = json.loads(output)
    except ValueError:
        return output.strip()
    if not isinstance(value, dict):
        return output.strip()
    return ", ".join(f"{key} is {_word(v)}" for key, v in value.items())


def _word(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} is {_word(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def bounded_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of `schema` with a length bound on every string and array that has none, and
    no properties beyond the listed ones where it did not say (SmolLM2 otherwise invents keys
    until its budget runs out). Whatever the bounded schema admits, the original admits."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if isinstance(value, dict):
            out[key] = (
                {k: bounded_schema(v) if isinstance(v, dict) else v for k, v in value.items()}
                if key in ("properties", "$defs", "definitions")
                else bounded_schema(value)
            )
        elif isinstance(value, list):
            out[key] = [bounded_schema(v) if isinstance(v, dict) else v for v in value]
        else:
            out[key] = value
    kinds = out.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "string" in kinds and "enum" not in out and "const" not in out:
        out.setdefault("maxLength", MAX_STRING)
    if "array" in kinds:
        out.setdefault("maxItems", MAX_ITEMS)
    if "object" in kinds or "properties" in out:
        out.setdefault("additionalProperties", False)
    return out


def arguments_schema(tool: ToolSpec) -> dict[str, Any]:
    """The tool's parameters as an object schema (no parameters: an empty object)."""
    schema = dict(tool.parameters) if tool.parameters else {}
    if not schema or schema.get("type") is None:
        schema = {"type": "object", "properties": {}, **schema}
    return bounded_schema(schema)


JSON_STYLE = {"key_separator": ": ", "item_separator": ", ", "whitespace_flexible": False}
"""Arguments written the way the model writes JSON (and no free whitespace to wander in)."""


def _lark_string(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is a Lark string literal


def call_grammar(tools: Sequence[ToolSpec]) -> str:
    """A Lark grammar (llguidance's dialect) for one call of any of `tools`."""
    if not tools:
        raise ValueError("a call grammar needs at least one tool")
    rules = []
    alternatives = []
    for i, tool in enumerate(tools):
        schema = json.dumps({**arguments_schema(tool), "x-guidance": JSON_STYLE})
        head = _lark_string(f"{CALL_HEAD}{tool.name}{ARGUMENTS_KEY}")
        alternatives.append(f"call_{i}")
        rules.append(f"call_{i}: {head} args_{i}")
        rules.append(f"args_{i}: %json {schema}")
    start = (
        f"start: {_lark_string(CALL_OPEN)} ({' | '.join(alternatives)}) {_lark_string(CALL_TAIL)}"
    )
    return "\n".join([start, *rules]) + "\n"
