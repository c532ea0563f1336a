"""Tools, tool choice and `response.create`'s options, read as OpenAI defines them.

`session.update` and `response.create` both carry `tools` and `tool_choice`, so both are
read here. A tool is OpenAI's function tool, `{"type": "function", "name", "description",
"parameters"}` (the Chat Completions nesting under `function` is accepted too), and in
the session an MCP server's `{"type": "mcp", ...}` (session_fields.py checks each key of a
session's tools); other tool types are not supported and each is an error naming it, while
the tools next to it still apply. `tool_choice` is `auto`, `none`, `required` or
`{"type": "function", "name": ...}`.

`response.create`'s `response` object becomes `ResponseOptions`: `instructions`,
`output_modalities`, `metadata` (at most 16 string pairs, echoed in response.created and
.done), `conversation` (`auto`, or `none` for an out-of-band answer), `input` (the answer's
own items), `max_output_tokens`, `tools`, `tool_choice`, and `audio.output.voice`/`speed`.
Unlike `session.update`, a bad value fails the whole `response.create`: half a response is
not what the client asked for.
"""

from __future__ import annotations

from typing import Any, cast

from pydantic import ValidationError

from sessions import ConversationItem, ResponseOptions, ToolConfig

from .client_items import ItemSpec, client_item
from .session_fields import checked_tool
from .wire_values import ProtocolError

_MAX_METADATA_PAIRS = 16
"""OpenAI's limit on `metadata`: 16 pairs, keys up to 64 characters, values up to 512."""
_MAX_TOKENS = 4_096


def tool_configs(
    raw: list[dict[str, Any]],
    param: str,
    event_id: str | None,
    mcp: list[dict[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], list[ProtocolError]]:
    """OpenAI tool objects -> the session's tool settings, and an error per tool left out;
    MCP servers go to `mcp` where it is given (session.tools)."""
    tools: list[dict[str, Any]] = []
    errors: list[ProtocolError] = []
    for index, given in enumerate(raw):
        where = f"{param}[{index}]"
        tool: dict[str, Any] | None = given
        if mcp is not None:  # the session's: each key has its fate (session_fields.py)
            tool, refused = checked_tool(given, where, event_id)
            errors += refused
        if tool is None:
            continue
        kind = tool.get("type", "function")
        nested = tool.get("function")
        body: dict[str, Any] = nested if isinstance(nested, dict) else tool
        if kind == "mcp" and mcp is not None:
            mcp.append(tool)
            continue
        if kind != "function":
            errors.append(
                ProtocolError(
                    "unsupported",
                    f"tool type {kind!r} is not supported here; Parley calls function "
                    "tools, and MCP servers given in session.tools",
                    event_id,
                    f"{where}.type",
                )
            )
            continue
        name = body.get("name")
        if not isinstance(name, str):
            errors.append(
                ProtocolError(
                    "missing_required_parameter", "a function tool needs a 'name'", event_id, where
                )
            )
            continue
        entry: dict[str, Any] = {"type": "function", "name": name}
        for key in ("description", "parameters"):
            if body.get(key) is not None:
                entry[key] = body[key]
        tools.append(entry)
    return tools, errors


def tool_choice_value(raw: object, param: str, event_id: str | None) -> str:
    """`auto` / `none` / `required`, or the name of the function to call."""
    if isinstance(raw, str) and raw in ("auto", "none", "required"):
        return raw
    if (
        isinstance(raw, dict)
        and raw.get("type") in ("function", "mcp")
        and isinstance(raw.get("name"), str)
    ):
        return cast(str, raw["name"])
    if isinstance(raw, dict) and isinstance(raw.get("function"), dict):
        name = raw["function"].get("name")
        if isinstance(name, str):
            return name
    raise ProtocolError(
        "invalid_value",
        "tool_choice is 'auto', 'none', 'required' or {\"type\": \"function\", \"name\": ...}",
        event_id,
        param,
    )


def max_tokens_value(raw: object, param: str, event_id: str | None) -> int | None:
    """An integer 1-4096, or "inf" (None: no cap beyond the engine's)."""
    if raw == "inf":
        return None
    if isinstance(raw, int) and not isinstance(raw, bool) and 1 <= raw <= _MAX_TOKENS:
        return raw
    raise ProtocolError(
        "invalid_value",
        f'max_output_tokens is an integer from 1 to {_MAX_TOKENS}, or "inf"; got {raw!r}',
        event_id,
        param,
    )


def metadata_value(raw: object, event_id: str | None) -> dict[str, str] | None:
    """`response.metadata`, checked as OpenAI declares it: at most 16 string pairs."""
    if raw is None:
        return None
    if (
        not isinstance(raw, dict)
        or len(raw) > _MAX_METADATA_PAIRS
        or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in raw.items()
        )
    ):
        raise ProtocolError(
            "invalid_value",
            "response.metadata must be an object of at most 16 string pairs (keys up to 64 "
            "characters, values up to 512)",
            event_id,
            param="response.metadata",
        )
    return dict(raw)


def response_options(raw: dict[str, Any] | None, event_id: str | None) -> ResponseOptions:
    """`response.create`'s `response` object -> ResponseOptions (ProtocolError if unusable)."""
    body = raw or {}
    options: dict[str, Any] = {"metadata": metadata_value(body.get("metadata"), event_id)}
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _type_error("response.instructions", "a string", event_id)
        options["instructions"] = instructions
    modalities = body.get("output_modalities", body.get("modalities"))
    if modalities is not None:
        if (
            not isinstance(modalities, list)
            or not modalities
            or any(m not in ("audio", "text") for m in modalities)
        ):
            raise ProtocolError(
                "invalid_value",
                "response.output_modalities is ['audio'] or ['text']",
                event_id,
                "response.output_modalities",
            )
        options["output_modalities"] = ("audio",) if "audio" in modalities else ("text",)
    conversation = body.get("conversation", "auto")
    if conversation not in ("auto", "none"):
        raise ProtocolError(
            "invalid_value",
            f"response.conversation is 'auto' or 'none', got {conversation!r}",
            event_id,
            "response.conversation",
        )
    options["in_conversation"] = conversation == "auto"
    if body.get("input") is not None:
        options["input"] = _input_items(body["input"], event_id)
    if "max_output_tokens" in body or "max_response_output_tokens" in body:
        cap = body.get("max_output_tokens", body.get("max_response_output_tokens"))
        options["max_output_tokens"] = max_tokens_value(cap, "response.max_output_tokens", event_id)
    if body.get("tools") is not None:
        if not isinstance(body["tools"], list):
            raise _type_error("response.tools", "an array", event_id)
        tools, errors = tool_configs(body["tools"], "response.tools", event_id)
        if errors:
            raise errors[0]
        options["tools"] = tuple(_tool(tool) for tool in tools)
    if body.get("tool_choice") is not None:
        options["tool_choice"] = tool_choice_value(
            body["tool_choice"], "response.tool_choice", event_id
        )
    output = (body.get("audio") or {}).get("output") or {}
    if isinstance(output.get("voice"), str):
        options["voice"] = output["voice"]
    if isinstance(output.get("speed"), int | float):
        options["speed"] = float(output["speed"])
    return ResponseOptions(**options)


def _tool(entry: dict[str, Any]) -> ToolConfig:
    try:
        return ToolConfig.model_validate(entry)
    except ValidationError as exc:
        problem = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        raise ProtocolError(
            "invalid_value", f"response.tools: {problem}", param="response.tools"
        ) from None


def _input_items(raw: object, event_id: str | None) -> tuple[ConversationItem, ...]:
    """The out-of-band answer's own context: items, or `{"type": "item_reference"}`s are
    not supported (the answer reads the conversation by default)."""
    if not isinstance(raw, list):
        raise _type_error("response.input", "an array", event_id)
    items: list[ConversationItem] = []
    for index, entry in enumerate(raw):
        param = f"response.input[{index}]"
        try:
            spec = ItemSpec.model_validate(entry)
        except ValidationError as exc:
            problem = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
            raise ProtocolError("invalid_value", f"{param}: {problem}", event_id, param) from None
        made = client_item(spec, event_id)
        if made.item is not None:
            items.append(made.item)
    return tuple(items)


def _type_error(param: str, kind: str, event_id: str | None) -> ProtocolError:
    return ProtocolError("invalid_type", f"'{param}' must be {kind}", event_id, param)
