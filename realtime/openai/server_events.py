"""Session events -> OpenAI Realtime (GA) server events, as JSON-ready dicts.

Every transport that speaks OpenAI Realtime sends the same JSON: the WebRTC data channel
(`oai-events`) and the WebSocket API. The mapping lives here once so they cannot drift apart. Each
event carries `event_id` and `type`; ids are the session's own, so a resumed connection
replaying the event log sends the same ids again.

Where OpenAI has no field for something Parley knows (the resume token, the video cache,
timings), it goes under a `parley` key or into `usage`, which OpenAI clients ignore.
Parley's own event types (session.state_changed, .expiring, .closed) go only to a client
that opted in (`session.parley.extra_events`): an OpenAI client validating events, as the
Agents SDK does, rejects types it does not know.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any, Literal

from pydantic import BaseModel

from pipeline.types import Logprobs
from sessions import SessionConfig, TurnDetectionConfig, event_to_dict
from sessions.config import truncation_object
from sessions.events import (
    CLIENT_ERRORS,
    AudioBufferCleared,
    AudioBufferCommitted,
    ConversationItem,
    ConversationItemCreated,
    ConversationItemDeleted,
    ConversationItemRetrieved,
    ConversationItemTruncated,
    DtmfReceived,
    ErrorEvent,
    Event,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    InputAudioTimeoutTriggered,
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    InputTranscriptionFailed,
    OutputAudioDelta,
    OutputAudioTranscriptDelta,
    OutputTextDelta,
    ResponseCreated,
    ResponseDone,
    ResponseUsage,
    SessionClosed,
    SessionCreated,
    SessionExpiring,
    SessionStateChanged,
    SessionUpdated,
    SpeechStarted,
    SpeechStopped,
    new_id,
)

from .client_events import AudioFormats, format_object
from .mcp_events import mcp_event_body, mcp_item_object
from .transcription_session import transcription_session_object

CONVERSATION_ID = "conv_default"
"""Each session has one conversation; OpenAI names it in every in-conversation response."""
AudioMode = Literal["omit", "base64"]

_CANCEL_REASONS = {
    "barge_in": "turn_detected",
    "superseded": "turn_detected",
    "client_cancelled": "client_cancelled",
    "client_closed": "client_cancelled",
}
"""The session's cancel reasons that OpenAI's words name: speech cut the answer off or a new
turn replaced it (`turn_detected`), the client cancelled it or closed the session
(`client_cancelled`). Any other end (the session's idle timeout or maximum duration, a
dropped connection, a server shutdown) is nobody's cancel: the response is `incomplete`,
with the real reason under `parley`, since OpenAI's `reason` names only its own four and
strict clients (the Agents SDK) validate it."""

PARLEY_EVENTS = (SessionStateChanged, SessionExpiring, SessionClosed)
"""Parley's own server events (no such event in OpenAI's API): sent only to a client that
opted in with `session.parley.extra_events`, as an OpenAI client may reject unknown types."""


def to_wire(
    event: Event,
    *,
    audio: AudioMode = "base64",
    formats: AudioFormats | None = None,
    extra_events: bool = False,
) -> dict[str, Any] | None:
    """The GA JSON of `event`, or None when this transport does not send it.

    Parley's own events (`PARLEY_EVENTS`) go out only with `extra_events` (the client
    opted in); everything else is an event of OpenAI's GA API.

    `audio="omit"` drops `response.output_audio.delta` (WebRTC: audio goes on the media
    track). `formats` are the connection's audio formats, shown in the session object;
    the default is PCM at the session's rates. A G.711 connection encodes the audio
    itself and builds the delta with `output_audio_delta`.
    """
    body: dict[str, Any]
    match event:
        case SessionCreated():
            session = session_object(
                event.config,
                session_id=event.session_id,
                formats=formats,
                resume_token=event.resume_token,
            )
            body = {"session": session}
        case SessionUpdated():
            body = {"session": session_object(event.config, event.session_id, formats=formats)}
        case SpeechStarted():
            body = {"audio_start_ms": event.audio_start_ms, "item_id": event.item_id}
        case SpeechStopped():
            body = {"audio_end_ms": event.audio_end_ms, "item_id": event.item_id}
        case AudioBufferCommitted():
            body = {"item_id": event.item_id, "previous_item_id": event.previous_item_id}
        case AudioBufferCleared():
            body = {}
        case DtmfReceived():
            body = {"event": event.digit, "received_at": event.received_at}
        case ConversationItemCreated():
            body = {"previous_item_id": event.previous_item_id, "item": item_object(event.item)}
        case ConversationItemTruncated():
            body = {
                "item_id": event.item_id,
                "content_index": event.content_index,
                "audio_end_ms": event.audio_end_ms,
            }
        case InputTranscriptionCompleted():
            body = {"item_id": event.item_id, "content_index": 0, "transcript": event.transcript}
            body |= logprobs_field(event.logprobs)
        case InputTranscriptionDelta():
            body = {"item_id": event.item_id, "content_index": 0, "delta": event.delta}
            body |= logprobs_field(event.logprobs)
        case InputTranscriptionFailed():
            error = {
                "type": "transcription_error",
                "code": "transcription_failed",
                "message": event.message,
                "param": None,
            }
            body = {"item_id": event.item_id, "content_index": 0, "error": error}
        case InputAudioTimeoutTriggered():
            body = {
                "item_id": event.item_id,
                "audio_start_ms": event.audio_start_ms,
                "audio_end_ms": event.audio_end_ms,
            }
        case ConversationItemRetrieved():
            body = {"item": item_object(event.item)}
        case FunctionCallArgumentsDelta():
            body = {
                "response_id": event.response_id,
                "item_id": event.item_id,
                "output_index": 0,
                "call_id": event.call_id,
                "delta": event.delta,
            }
        case FunctionCallArgumentsDone():
            body = {
                "response_id": event.response_id,
                "item_id": event.item.id,
                "output_index": 0,
                "call_id": event.item.call_id,
                "name": event.item.name,
                "arguments": event.item.arguments,
            }
        case ResponseCreated():
            body = {"response": _response(event, "in_progress", None, [], None)}
        case OutputTextDelta() | OutputAudioTranscriptDelta():
            body = _part_fields(event.response_id, event.item_id) | {"delta": event.delta}
        case OutputAudioDelta():
            return None if audio == "omit" else output_audio_delta(event, event.pcm)
        case ResponseDone():
            body = {"response": _done_response(event)}
        case ErrorEvent():
            body = {"error": _error(event)}
        case ConversationItemDeleted():
            body = {"item_id": event.item_id}
        case _ if (mcp := mcp_event_body(event)) is not None:
            body = mcp
        case _:  # Parley's own events (session.state_changed, .expiring, .closed)
            return event_to_dict(event) if extra_events else None
    return {"type": event.type, "event_id": event.event_id, **body}


def logprobs_field(logprobs: Logprobs | None) -> dict[str, Any]:
    """`logprobs` of a transcription's delta or completed event: OpenAI's
    `LogProbProperties` for each token, for a session that includes them; no key (the SDK's
    field is optional) when it did not ask or the recogniser has none."""
    if logprobs is None:
        return {}
    tokens = [{"token": t.token, "logprob": t.logprob, "bytes": list(t.utf8)} for t in logprobs]
    return {"logprobs": tokens}


def transcription_usage(audio_ms: int) -> dict[str, Any]:
    """`usage` of `...input_audio_transcription.completed`: OpenAI's duration form (Parley
    counts no tokens), the seconds of the user's audio that were transcribed."""
    return {"type": "duration", "seconds": audio_ms / 1000}


def output_audio_delta(event: OutputAudioDelta, payload: bytes) -> dict[str, Any]:
    """`response.output_audio.delta` carrying `payload`: the PCM16, or its G.711 coding."""
    return {
        "type": event.type,
        "event_id": event.event_id,
        **_part_fields(event.response_id, event.item_id),
        "delta": base64.b64encode(payload).decode("ascii"),
    }


def output_audio_buffer_event(
    kind: Literal["started", "stopped", "cleared"], response_id: str | None
) -> dict[str, Any]:
    """WebRTC only: the transport's own playout news (OpenAI sends these on WebRTC too)."""
    return {
        "type": f"output_audio_buffer.{kind}",
        "event_id": new_id("evt"),
        "response_id": response_id,
    }


def session_object(
    config: SessionConfig,
    session_id: str | None = None,
    *,
    formats: AudioFormats | None = None,
    resume_token: str | None = None,
) -> dict[str, Any]:
    """The GA `realtime.session` object for `config`; no `id` before the session exists.
    A transcription session's is OpenAI's `realtime.transcription_session`."""
    if config.type == "transcription":
        return transcription_session_object(
            config, session_id, formats=formats, resume_token=resume_token
        )
    formats = formats or AudioFormats.for_config(config)
    td = config.turn_detection
    parley: dict[str, Any] = {
        "video": config.video.model_dump(mode="json"),
        "min_speech_ms": td.min_speech_ms if td is not None else None,
        "interruption_deadline_ms": td.interruption_deadline_ms if td is not None else None,
        "max_audio_seconds": config.max_audio_seconds,
        "output_sample_rate": config.output_sample_rate,
        "extra_events": config.extra_events,
    }
    if resume_token is not None:
        parley["resume_token"] = resume_token
    session: dict[str, Any] = {"type": "realtime", "object": "realtime.session"}
    if session_id is not None:
        session["id"] = session_id
    noise = config.noise_reduction
    transcription = config.input_transcription
    session |= {
        "model": config.model,
        "instructions": config.instructions,
        "output_modalities": list(config.output_modalities),
        "audio": {
            "input": {
                "format": format_object(formats.input, formats.input_rate),
                "noise_reduction": noise.model_dump(exclude_none=True) if noise else None,
                "transcription": (
                    transcription.model_dump(exclude_none=True) if transcription else None
                ),
                "turn_detection": _turn_detection(td),
            },
            "output": {
                "format": format_object(formats.output, formats.output_rate),
                "voice": config.voice,
                "speed": config.speed,
            },
        },
        "tools": [tool.model_dump(mode="json") for tool in config.tools]
        + [server.wire() for server in config.mcp_tools],
        "tool_choice": _tool_choice(config.tool_choice),
        "max_output_tokens": config.max_output_tokens or "inf",
        "truncation": truncation_object(config.truncation),
        "include": list(config.include) or None,
        "parallel_tool_calls": config.parallel_tool_calls,
        "prompt": None,
        "reasoning": config.reasoning.model_dump(exclude_none=True) if config.reasoning else None,
        "tracing": (
            config.tracing.model_dump(exclude_none=True)
            if isinstance(config.tracing, BaseModel)
            else config.tracing
        ),
        "parley": parley,
    }
    return session


def item_object(item: ConversationItem) -> dict[str, Any]:
    """A GA `realtime.item`: a message with one content part, as the session knows it, a
    function call, or a function call's output (MCP's items: mcp_events.py)."""
    if item.type.startswith("mcp_"):
        return mcp_item_object(item)
    if item.type == "function_call":
        return {
            "id": item.id,
            "object": "realtime.item",
            "type": "function_call",
            "status": item.status,
            "call_id": item.call_id,
            "name": item.name,
            "arguments": item.arguments,
        }
    if item.type == "function_call_output":
        return {
            "id": item.id,
            "object": "realtime.item",
            "type": "function_call_output",
            "status": item.status,
            "call_id": item.call_id,
            "output": item.text,
        }
    part: dict[str, Any]
    if item.role != "assistant":
        if item.has_audio:  # the transcript arrives later, with ...transcription.completed
            part = {"type": "input_audio", "transcript": item.text or None}
        else:
            part = {"type": "input_text", "text": item.text}
    elif item.has_audio:
        part = {"type": "output_audio", "transcript": item.text}
    else:
        part = {"type": "output_text", "text": item.text}
    return {
        "id": item.id,
        "object": "realtime.item",
        "type": "message",
        "status": item.status,
        "role": item.role,
        "content": [part],
    }


def _tool_choice(choice: str) -> str | dict[str, str]:
    """A mode as it is; a tool's name as OpenAI's forced-function object."""
    if choice in ("auto", "none", "required"):
        return choice
    return {"type": "function", "name": choice}


def _turn_detection(td: TurnDetectionConfig | None) -> dict[str, Any] | None:
    """As the client set it: semantic_vad shows only OpenAI's semantic_vad fields (its
    silence window follows eagerness); min_speech_ms and interruption_deadline_ms are under
    `parley`; Parley's `interruption` is shown only when it is not OpenAI's meaning
    (`adaptive`), so a client that never set it sees OpenAI's fields alone."""
    if td is None:
        return None
    extension = {"interruption"} if td.interruption != "always" else set()
    if td.type == "semantic_vad":
        shown = {"type", "eagerness", "create_response", "interrupt_response"}
        return td.model_dump(include=shown | extension)
    exclude = {"min_speech_ms", "eagerness", "interruption", "interruption_deadline_ms"} - extension
    if td.idle_timeout_ms is None:
        exclude.add("idle_timeout_ms")
    return td.model_dump(exclude=exclude)


def _part_fields(response_id: str, item_id: str) -> dict[str, Any]:
    """Where a delta belongs: Parley answers with one item of one content part."""
    return {"response_id": response_id, "item_id": item_id, "output_index": 0, "content_index": 0}


def _response(
    event: ResponseCreated | ResponseDone,
    status: str,
    status_details: dict[str, Any] | None,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    return {
        "id": event.response_id,
        "object": "realtime.response",
        "status": status,
        "status_details": status_details,
        "output": output,
        "conversation_id": CONVERSATION_ID if event.in_conversation else None,
        "output_modalities": ["audio"] if event.audio_output else ["text"],
        "max_output_tokens": event.max_output_tokens or "inf",
        "usage": usage,
        "metadata": event.metadata,
    }


def _done_response(event: ResponseDone) -> dict[str, Any]:
    details: dict[str, Any] | None = None
    status: str = event.status
    if event.status == "cancelled":
        reason = _CANCEL_REASONS.get(event.reason)
        if reason is None:  # the server cut it short: say so, and why, in Parley's words
            status = "incomplete"
        details = {"type": status, "reason": reason, "parley": {"reason": event.reason}}
    elif event.status == "failed":
        code = event.error_code or "response_failed"
        details = {
            "type": "failed",
            "error": {
                "type": CLIENT_ERRORS.get(code, "server_error"),
                "code": code,
                "message": event.reason,
            },
        }
    output = [item_object(event.item)] if event.item is not None else []
    output += [item_object(call) for call in event.calls]
    return _response(event, status, details, output, usage_object(event.usage))


def usage_object(usage: ResponseUsage) -> dict[str, Any]:
    """OpenAI's token counts, estimated (Parley's engines do not report tokens): audio at
    ten tokens a second, text at four characters a token. What Parley measures (audio,
    text, latencies) is under `parley`."""
    audio_in = -(-usage.input_audio_ms // 100)
    text_in = -(-usage.input_text_chars // 4)
    audio_out = -(-usage.output_audio_ms // 100)
    text_out = -(-usage.output_text_chars // 4)
    return {
        "total_tokens": audio_in + text_in + audio_out + text_out,
        "input_tokens": audio_in + text_in,
        "output_tokens": audio_out + text_out,
        "input_token_details": {
            "text_tokens": text_in,
            "audio_tokens": audio_in,
            "image_tokens": 0,
            "cached_tokens": 0,
        },
        "output_token_details": {"text_tokens": text_out, "audio_tokens": audio_out},
        "parley": dataclasses.asdict(usage),
    }


def _error(event: ErrorEvent) -> dict[str, Any]:
    return {
        "type": event.error_type,
        "code": event.code,
        "message": event.message,
        "param": event.param,
        "event_id": event.client_event_id,
    }
