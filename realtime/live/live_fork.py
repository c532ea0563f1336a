"""Forking a stored GPT-Live session: a new session that begins where the stored one ended.

A fork (`client.live.forks.connect(session_id=...)` over a WebSocket, or
`client.live.sessions.fork(id, transport={"type": "webrtc", ...})`) is a new live session,
served exactly as one started from scratch (live_accept.py, live_webrtc_call.py): its
configuration is the stored session's (live_store.py) with the fork's overrides applied,
and its `input` is the stored conversation, so the model's next answer knows what was said.
The stored session is left as it was.

The overrides are GPT-Live's, strict (an unknown field is an error naming it):
`store` (omitted: inherited), `delegation` (only when the stored session delegates to
`responses`; its type cannot change: the acknowledgement delay and the Responses settings
are merged over the stored ones), `audio.format` (WebSocket forks only; WebRTC negotiates
Opus) and `client` (WebRTC forks only: the page's data-channel permissions). The model,
voice and instructions are the stored session's.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from .live_config import (
    LiveAudio,
    LiveAudioFormat,
    LiveClient,
    LiveConfigError,
    LiveContentPart,
    LiveDelegation,
    LiveInitialItem,
    LiveSessionConfig,
)
from .live_store import StoredSession


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ForkAudio(_Strict):
    format: LiveAudioFormat | None = None


class ForkDelegation(_Strict):
    type: str
    acknowledgement_delay_ms: int | None = None
    responses: dict[str, Any] | None = None


class ForkOverrides(_Strict):
    """The SDK's `ForkSessionConfig` / `MediaSessionForkConfigParam`, field for field."""

    audio: ForkAudio | None = None
    client: LiveClient | None = None
    delegation: ForkDelegation | None = None
    store: bool | None = None


def parse_fork(body: Any, *, webrtc: bool) -> ForkOverrides:
    """The fork's `session` (None or absent: `{}`); LiveConfigError naming the field."""
    try:
        overrides = ForkOverrides.model_validate({} if body is None else body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in ("session", *first["loc"]))
        code = "unknown_parameter" if first["type"] == "extra_forbidden" else "invalid_value"
        raise LiveConfigError(f"{where}: {first['msg']}", code, where) from exc
    if webrtc and overrides.audio is not None:
        why = "a WebRTC fork negotiates its audio format: omit session.audio"
        raise LiveConfigError(why, "unknown_parameter", "session.audio")
    if not webrtc and overrides.client is not None:
        why = "session.client is for a WebRTC fork's page, not a WebSocket fork"
        raise LiveConfigError(why, "unknown_parameter", "session.client")
    return overrides


def forked(stored: StoredSession, overrides: ForkOverrides, *, webrtc: bool) -> LiveSessionConfig:
    """The new session's configuration: the stored one, its history as `input`, the
    overrides applied. (Built with `model_copy`: the stored history may be longer than a
    client's `input` may be, up to live_store.MAX_ITEMS, and was checked when it was said.)"""
    live = stored.live
    voice = live.audio.output if live.audio is not None else None
    if webrtc:
        audio = LiveAudio(output=voice) if voice is not None else None
        client = overrides.client or live.client
    else:
        fmt = overrides.audio.format if overrides.audio is not None else None
        audio = LiveAudio(format=fmt or live.format, output=voice)
        client = None
    history = [
        LiveInitialItem(
            role=role,
            content=[
                LiveContentPart(
                    type="output_text" if role == "assistant" else "input_text", text=text
                )
            ],
        )
        for role, text in stored.history
    ]
    update: dict[str, Any] = {
        "audio": audio,
        "client": client,
        "input": history or None,
        "delegation": _delegation(live.delegation, overrides.delegation),
    }
    if overrides.store is not None:
        update["store"] = overrides.store
    return live.model_copy(update=update)


def _delegation(
    stored: LiveDelegation | None, override: ForkDelegation | None
) -> LiveDelegation | None:
    if override is None:
        return stored
    if stored is None or stored.type != "responses" or override.type != "responses":
        why = "a fork may update only a stored session's `responses` delegation"
        raise LiveConfigError(why, "invalid_value", "session.delegation.type")
    responses = {**(stored.responses or {}), **(override.responses or {})}
    delay = override.acknowledgement_delay_ms
    if delay is None:
        delay = stored.acknowledgement_delay_ms
    return LiveDelegation(type="responses", acknowledgement_delay_ms=delay, responses=responses)
