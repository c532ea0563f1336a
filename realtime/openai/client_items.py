"""Conversation items a client sends (`conversation.item.create`), as OpenAI defines them.

Three item types: a `message` (role user, system or assistant, of content parts), a
`function_call` (a call the model made, replayed by a client that keeps its own history),
a `function_call_output` (what the client's code returned for a call), and an
`mcp_approval_response` (the client's answer to an `mcp_approval_request`). Parts:
`input_text`, `input_image` (an inline JPEG or PNG data URL) and `input_audio` (base64 in
the connection's input format) for the user; `input_text` for the system; `output_text`
(beta `text`) and `output_audio` (its `transcript`) for the assistant.

The item becomes one session `ConversationItem`, with the client's `id` when it gave one.
Images go to the session's frame cache (the next answer sees them); audio is the user's
speech, heard by the next answer like a committed turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sessions import ConversationItem

from .wire_values import ProtocolError, decode_base64, image_bytes

MAX_ITEM_ID = 64

_ROLE_PARTS = {
    "user": ("input_text", "input_image", "input_audio"),
    "system": ("input_text",),
    "assistant": ("output_text", "text", "output_audio", "audio"),
}


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    type: Literal[
        "input_text", "input_image", "input_audio", "output_text", "text", "output_audio", "audio"
    ]
    text: str | None = None
    image_url: str | None = None
    audio: str | None = None
    transcript: str | None = None

    @model_validator(mode="after")
    def _has_payload(self) -> ContentPart:
        needed = {
            "input_text": "text",
            "output_text": "text",
            "text": "text",
            "input_image": "image_url",
            "input_audio": "audio",
        }.get(self.type)
        if needed is not None and getattr(self, needed) is None:
            raise ValueError(f"an {self.type} part needs '{needed}'")
        return self


class ItemSpec(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    id: str | None = Field(default=None, min_length=1, max_length=MAX_ITEM_ID)
    type: Literal["message", "function_call", "function_call_output", "mcp_approval_response"] = (
        "message"
    )
    role: Literal["user", "system", "assistant"] | None = None
    content: list[ContentPart] | None = None
    call_id: str | None = Field(default=None, min_length=1, max_length=MAX_ITEM_ID)
    name: str | None = None
    arguments: str | None = None
    output: str | None = None
    status: str | None = None
    approval_request_id: str | None = Field(default=None, min_length=1, max_length=MAX_ITEM_ID)
    approve: bool | None = None
    reason: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> ItemSpec:
        needs = {
            "message": ("role", "content"),
            "function_call": ("call_id", "name", "arguments"),
            "function_call_output": ("call_id", "output"),
            "mcp_approval_response": ("approval_request_id", "approve"),
        }[self.type]
        for field in needs:
            if getattr(self, field) is None:
                raise ValueError(f"a {self.type} item needs '{field}'")
        if self.type == "message" and not self.content:
            raise ValueError("a message needs at least one content part")
        return self


@dataclass(frozen=True, slots=True)
class ClientItem:
    """What one client item becomes: the conversation item, and the media it carried."""

    item: ConversationItem | None
    """None for a user message of images only: they go to the frame cache, no item."""
    images: tuple[bytes, ...] = ()
    audio: bytes | None = None
    """User speech (base64-decoded, in the connection's input format)."""


def client_item(spec: ItemSpec, event_id: str | None) -> ClientItem:
    """`spec` -> the session's item and media; ProtocolError names what cannot be used."""
    if spec.type == "function_call":
        call = ConversationItem(
            role="assistant",
            type="function_call",
            call_id=spec.call_id or "",
            name=spec.name or "",
            arguments=spec.arguments or "",
        )
        return ClientItem(_with_id(call, spec.id))
    if spec.type == "mcp_approval_response":
        answer = ConversationItem(
            role="user",
            type="mcp_approval_response",
            approval_request_id=spec.approval_request_id or "",
            approve=bool(spec.approve),
            text=spec.reason or "",
        )
        return ClientItem(_with_id(answer, spec.id))
    if spec.type == "function_call_output":
        output = ConversationItem(
            role="user",
            type="function_call_output",
            call_id=spec.call_id or "",
            text=spec.output or "",
        )
        return ClientItem(_with_id(output, spec.id))
    role = spec.role or "user"
    allowed = _ROLE_PARTS[role]
    texts: list[str] = []
    images: list[bytes] = []
    audio: bytes | None = None
    spoken = False
    for index, part in enumerate(spec.content or []):
        param = f"item.content[{index}]"
        if part.type not in allowed:
            raise ProtocolError(
                "invalid_value",
                f"a {role} message takes {', '.join(allowed)} parts, not {part.type!r}",
                event_id,
                f"{param}.type",
            )
        if part.type == "input_image":
            images.append(image_bytes(part.image_url or "", f"{param}.image_url"))
        elif part.type == "input_audio":
            if audio is not None:
                raise ProtocolError(
                    "invalid_value", "a message takes one input_audio part", event_id, param
                )
            audio = decode_base64(part.audio or "", f"{param}.audio")
            if part.transcript:
                texts.append(part.transcript)
        elif part.type in ("output_audio", "audio"):
            spoken = True
            texts.append(part.transcript or "")
        else:
            texts.append(part.text or "")
    text = "\n".join(t for t in texts if t)
    if role == "user" and audio is None and not text:
        return ClientItem(None, tuple(images))  # images only: context for the next answer
    item = ConversationItem(
        role=role,
        text=text,
        has_audio=audio is not None or spoken,
    )
    return ClientItem(_with_id(item, spec.id), tuple(images), audio)


def _with_id(item: ConversationItem, item_id: str | None) -> ConversationItem:
    """The client's own id, when it gave one (OpenAI keeps it; so do clients' histories)."""
    if item_id:
        item.id = item_id
    return item
