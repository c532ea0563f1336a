"""The fate of each field of OpenAI's session object that is not a turn, an audio format
or the transcription: nothing a client sends is dropped unseen.

Each field is honoured (it changes what the session does, and `session.updated` echoes it
as it took effect), refused (an `error` naming its full path, `param` `session.prompt`;
the rest of the update applies), or, where OpenAI itself makes it a hint about OpenAI's own
platform or a model Parley does not have, accepted and echoed as sent with the docs saying
it changes nothing (docs/protocols/session-settings.md#what-each-field-does). A key that is
not a field of OpenAI's session object (GA or beta) is refused as `unknown_parameter`, as
OpenAI refuses it, except under `parley` (Parley's own).

- `model`: echoed as named; the session's pipeline answers whatever is named (every OpenAI
  client names one: refusing the name would refuse the client).
- `parallel_tool_calls`: honoured (`false`: at most one call a round of the model's
  writing, sessions/response.py).
- `prompt`: refused unless null: a stored prompt template lives on OpenAI's platform.
- `reasoning.effort`: echoed; Parley's engines do not reason before answering, so any
  effort's bound on reasoning holds.
- `tracing`: echoed; traces go to OpenAI's dashboard, which Parley does not feed.
- `audio.output.voice` as `{"id": ...}` (a custom voice): refused; a name is honoured.
- MCP tools: `connector_id`, `tunnel_id`, `defer_loading: true` and `allowed_callers`
  without `direct` are refused and the tool left out (it would be another tool without
  them); a `tool_choice` naming an MCP tool is refused (its tools are not known when the
  settings are checked; `response.create` can force one).
- beta's `temperature` and `client_secret`: accepted and ignored (GA has neither).
"""

from __future__ import annotations

from typing import Any

from sessions.mcp_config import McpToolConfig

from .session_spec import OpenObject, ParleyExtras, SessionSpec
from .wire_values import ProtocolError

REASONING_EFFORTS = ("minimal", "low", "medium", "high", "xhigh")
_TRACING_KEYS = ("group_id", "metadata", "workflow_name")
_FUNCTION_KEYS = frozenset({"type", "name", "description", "parameters", "function"})
"""A function tool's keys (`function`: the Chat Completions nesting, accepted too)."""
_MCP_KEYS = frozenset(McpToolConfig.model_fields)
_NOT_SERVED = {
    "connector_id": "OpenAI's hosted connectors are not served here; give the MCP "
    "server's server_url",
    "tunnel_id": "OpenAI's Secure MCP Tunnel is not served here; give a server_url "
    "Parley can reach",
}

_REFUSED = frozenset(_NOT_SERVED)


def unknown_parameters(spec: SessionSpec, eid: str | None) -> list[ProtocolError]:
    """An `unknown_parameter` error for each key of the session object (at any depth)
    that OpenAI's session object does not have; `parley` holds Parley's own keys."""
    return _unknown(spec, "session", eid)


def _unknown(node: OpenObject, path: str, eid: str | None) -> list[ProtocolError]:
    errors = [unknown(f"{path}.{key}", eid) for key in node.model_extra or {}]
    for name in type(node).model_fields:
        child = getattr(node, name)
        if isinstance(child, OpenObject) and not isinstance(child, ParleyExtras):
            errors += _unknown(child, f"{path}.{name}", eid)
    return errors


def unknown(param: str, eid: str | None) -> ProtocolError:
    return ProtocolError("unknown_parameter", f"Unknown parameter: '{param}'.", eid, param)


def fields_patch(spec: SessionSpec, eid: str | None) -> tuple[dict[str, Any], list[ProtocolError]]:
    """The patch that the model, the voice and speed, the tool-call and the advisory
    fields make, and an error for each value refused."""
    patch: dict[str, Any] = {}
    errors: list[ProtocolError] = []
    given = spec.model_fields_set
    if spec.model is not None:
        patch["model"] = spec.model
    if spec.parallel_tool_calls is not None:
        patch["parallel_tool_calls"] = spec.parallel_tool_calls
    if spec.prompt is not None:
        errors.append(
            ProtocolError(
                "invalid_value",
                "stored prompts live on OpenAI's platform and are not served here; send "
                "the prompt's text as session.instructions",
                eid,
                "session.prompt",
            )
        )
    for name, check in (("reasoning", _reasoning), ("tracing", _tracing)):
        if name in given:
            try:
                patch[name] = check(getattr(spec, name), eid)
            except ProtocolError as exc:
                errors.append(exc)
    output = spec.audio.output if spec.audio is not None else None
    voice = output.voice if output is not None and output.voice is not None else spec.voice
    if isinstance(voice, dict):
        errors.append(
            ProtocolError(
                "invalid_value",
                "custom voices (an object with an id) are OpenAI's and are not served here; "
                "name one of Parley's voices",
                eid,
                "session.audio.output.voice",
            )
        )
    elif voice is not None:
        patch["voice"] = voice
    speed = output.speed if output is not None and output.speed is not None else spec.speed
    if speed is not None:
        patch["speed"] = speed
    return patch, errors


def _reasoning(value: Any, eid: str | None) -> dict[str, Any] | None:
    param = "session.reasoning"
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProtocolError("invalid_type", f"'{param}' must be an object", eid, param)
    for key in value:
        if key != "effort":
            raise unknown(f"{param}.{key}", eid)
    effort = value.get("effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise ProtocolError(
            "invalid_value",
            f"unknown reasoning effort {effort!r}; use {', '.join(REASONING_EFFORTS)}",
            eid,
            f"{param}.effort",
        )
    return {"effort": effort}


def _tracing(value: Any, eid: str | None) -> str | dict[str, Any] | None:
    param = "session.tracing"
    if value is None:
        return None
    if value == "auto":
        return "auto"
    if not isinstance(value, dict):
        raise ProtocolError("invalid_value", "tracing is 'auto', an object or null", eid, param)
    for key, item in value.items():
        if key not in _TRACING_KEYS:
            raise unknown(f"{param}.{key}", eid)
        if key != "metadata" and item is not None and not isinstance(item, str):
            raise ProtocolError(
                "invalid_type", f"'{param}.{key}' must be a string", eid, f"{param}.{key}"
            )
    return dict(value)


def checked_tool(
    tool: dict[str, Any], where: str, eid: str | None
) -> tuple[dict[str, Any] | None, list[ProtocolError]]:
    """`tool` without its unknown keys (each an error), or None where a value it holds
    cannot be served (a connector, a tunnel, deferred loading, no direct caller): the
    tool is left out then, as it would be another tool without that value."""
    kind = tool.get("type", "function")
    known = _MCP_KEYS if kind == "mcp" else _FUNCTION_KEYS if kind == "function" else None
    if known is None:  # an unknown tool type: tool_configs refuses it by its type
        return tool, []
    errors = [unknown(f"{where}.{key}", eid) for key in tool if key not in known | _REFUSED]
    if kind == "mcp":
        refusal = _mcp_refusal(tool, where, eid)
        if refusal is not None:
            return None, [*errors, refusal]
    return {key: value for key, value in tool.items() if key in known}, errors


def _mcp_refusal(tool: dict[str, Any], where: str, eid: str | None) -> ProtocolError | None:
    for key, why in _NOT_SERVED.items():
        if tool.get(key) is not None:
            return ProtocolError("invalid_value", why, eid, f"{where}.{key}")
    if tool.get("defer_loading") is True:
        return ProtocolError(
            "invalid_value",
            "tool search is not served here: every MCP tool is loaded; leave "
            "defer_loading out or false",
            eid,
            f"{where}.defer_loading",
        )
    callers = tool.get("allowed_callers")
    if isinstance(callers, list) and "direct" not in callers:
        return ProtocolError(
            "invalid_value",
            "Parley's model calls MCP tools directly: allowed_callers must name 'direct'",
            eid,
            f"{where}.allowed_callers",
        )
    return None


def mcp_tool_choice(raw: object, eid: str | None) -> ProtocolError | None:
    """A session `tool_choice` naming an MCP tool: refused (see the module's docstring)."""
    if isinstance(raw, dict) and raw.get("type") == "mcp":
        return ProtocolError(
            "invalid_value",
            "session.tool_choice cannot name an MCP tool (its tools are listed after the "
            "settings are checked); force one with response.create's tool_choice",
            eid,
            "session.tool_choice",
        )
    return None


_CONVERSATION_ONLY: dict[str, tuple[str, ...]] = {
    "instructions": ("instructions",),
    "output_modalities": ("output_modalities",),
    "tools": ("tools", "mcp_tools"),
    "tool_choice": ("tool_choice",),
    "max_output_tokens": ("max_output_tokens",),
    "max_response_output_tokens": ("max_output_tokens",),
    "truncation": ("truncation",),
    "model": ("model",),
    "parallel_tool_calls": ("parallel_tool_calls",),
    "prompt": (),
    "reasoning": ("reasoning",),
    "tracing": ("tracing",),
    "voice": ("voice",),
    "speed": ("speed",),
    "temperature": (),
    "output_audio_format": ("output_sample_rate",),
}
"""The session object's fields that a transcription session does not have (OpenAI's
`realtime.transcription_session`), and the patch keys each makes."""


def not_in_transcription(
    spec: SessionSpec, patch: dict[str, Any], eid: str | None
) -> list[ProtocolError]:
    """In a transcription session: an `unknown_parameter` for each conversation field
    given, whose settings are taken out of `patch` (nothing there would use them), and an
    `invalid_value` for turn detection that would answer (`create_response: true`, ...)."""
    given = [name for name in _CONVERSATION_ONLY if name in spec.model_fields_set]
    errors = [unknown(f"session.{name}", eid) for name in given]
    dropped = [key for name in given for key in _CONVERSATION_ONLY[name]]
    if spec.audio is not None and "output" in spec.audio.model_fields_set:
        errors.append(unknown("session.audio.output", eid))
        dropped += ["voice", "speed", "output_sample_rate"]
    for key in dropped:
        patch.pop(key, None)
    td = patch.get("turn_detection")
    if isinstance(td, dict):
        audio_in = spec.audio.input if spec.audio is not None else None
        ga = audio_in is not None and "turn_detection" in audio_in.model_fields_set
        where = "session.audio.input.turn_detection" if ga else "session.turn_detection"
        for key, off in _NO_ANSWERS.items():
            if td.get(key, off) != off:
                errors.append(
                    ProtocolError(
                        "invalid_value",
                        f"a transcription session never answers: {key} can only be {off!r}",
                        eid,
                        f"{where}.{key}",
                    )
                )
                del td[key]
    return errors


_NO_ANSWERS: dict[str, bool | None] = {
    "create_response": False,
    "interrupt_response": False,
    "idle_timeout_ms": None,
}
"""Turn detection's settings about answers, as a transcription session has them (it never
answers, so nothing is created, interrupted or timed out after)."""
