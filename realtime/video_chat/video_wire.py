"""The video chat stream as vLLM-Omni's own server writes it, for clients that did not opt in.

Parley's mapping (video_mapping.py) makes the full messages: ids, codes, statuses, done
messages for every answer. A client written for vLLM-Omni checks the exact keys and the
order of its server, so `VllmOmniWire` reshapes each message as it goes out (at send time:
only there is the order of text and audio final):

- Each message keeps only vLLM-Omni's keys (`KEYS`); Parley's own (`session.created`)
  are not sent.
- `response.text.done` comes before an answer's first audio delta, with the text sent so
  far; later text deltas still go out, as from vLLM-Omni (its thinker can run ahead of
  the audio). At the end of an answer the done text is sent only if it was not yet.
- `response.audio.done` only for an answer that sent audio.
- A cancelled answer (a newer query cut it off) ends without done messages.
- A session that ends by itself says so in an `error` and sends no `session.done` (that
  answers `video.done` only). The idle timeout and a failed answer are told in
  vLLM-Omni's words ("Idle timeout", "Query processing failed").
- JSON as Starlette's `send_json` writes it (compact, UTF-8 as is).
"""

from __future__ import annotations

import json

from ..transports.websocket.sender import Message

KEYS: dict[str, tuple[str, ...]] = {
    "response.start": (),
    "response.text.delta": ("delta",),
    "response.text.done": ("text",),
    "response.audio.delta": ("data", "format"),
    "response.audio.done": (),
    "session.done": (),
    "pong": (),
    "error": ("message",),
}
"""Every message vLLM-Omni's server sends, with its keys besides `type`."""

VLLM_OMNI_ERRORS = {
    "idle_timeout": "Idle timeout",
    "response_failed": "Query processing failed",
}
"""Errors of the session's own (by code), as vLLM-Omni words them."""

CLIENT_ENDS = frozenset({None, "client", "client_done", "client_closed", "client_gone"})
"""`session.done` reasons that answer the client (the others: the session ended itself)."""


def encode(message: Message) -> str:
    """One message as JSON text, byte for byte as Starlette's `send_json` writes it."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False)


class VllmOmniWire:
    """Parley's video chat messages -> vLLM-Omni's, for one connection, in send order."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._text_done = False
        self._audio = False

    def shape(self, message: Message) -> list[Message]:
        """What goes out for `message`: nothing, it alone, or a text done before it."""
        kind = message.get("type")
        if not isinstance(kind, str) or kind not in KEYS:
            return []
        out = {"type": kind, **{key: message[key] for key in KEYS[kind] if key in message}}
        match kind:
            case "response.start":
                self._text, self._text_done, self._audio = [], False, False
            case "response.text.delta":
                self._text.append(str(message.get("delta", "")))
            case "response.audio.delta":
                self._audio = True
                return [*self._finish_text(), out]
            case "response.text.done":
                return [] if message.get("status") == "cancelled" else self._finish_text()
            case "response.audio.done":
                cancelled = message.get("status") == "cancelled"
                return [out] if self._audio and not cancelled else []
            case "session.done":
                return [out] if message.get("reason") in CLIENT_ENDS else []
            case "error":
                out["message"] = VLLM_OMNI_ERRORS.get(str(message.get("code")), out["message"])
        return [out]

    def _finish_text(self) -> list[Message]:
        """The answer's `response.text.done`, once."""
        if self._text_done:
            return []
        self._text_done = True
        return [{"type": "response.text.done", "text": "".join(self._text)}]
