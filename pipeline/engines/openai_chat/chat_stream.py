"""One streamed chat completion from an OpenAI-compatible server, as Parley's chunks.

The server answers `stream: true` with server-sent events: `data: {chunk}` lines, then
`data: [DONE]`. Each chunk's `choices[0].delta` carries the next `content` and the next
pieces of `tool_calls` (by `index`: the first piece of a call has its `id` and its
function's `name`, every piece a bit of its `arguments`); with `stream_options.include_usage`
the last chunk has the request's `usage` and no choices.

Every way it can fail ends in a `ChatStreamError` whose message a client can read: the
connection refused, an HTTP error status (with the server's own message when it gave one),
nothing received for `stall_s` (the server stuck or gone), a chunk that is not JSON, an
`error` object in the stream, a stream that ends without `[DONE]`. Closing the iterator
(a barge-in, a cancel) closes the response, and so the connection: vLLM aborts a request
whose client went away, so the model stops generating.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import httpx

from ...types import TextDelta, ToolCallDelta

ERROR_BODY_BYTES = 2048
"""How much of an error answer's body is read for its message."""


class ChatStreamError(Exception):
    """The model server did not give the answer: why, in words."""


class ChatStreamStalled(ChatStreamError):
    """The server took the request and then sent nothing for the stall timeout: it may still
    answer `/models` while its generation is wedged."""


async def chat_chunks(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    *,
    headers: dict[str, str],
    connect_s: float,
    stall_s: float,
) -> AsyncGenerator[dict[str, Any], None]:
    """The stream's chunks (parsed), until `[DONE]`; ChatStreamError on any failure."""
    timeout = httpx.Timeout(stall_s, connect=connect_s)
    try:
        async with client.stream("POST", url, json=body, headers=headers, timeout=timeout) as got:
            if got.status_code >= 400:
                raise ChatStreamError(await _refusal(got))
            async for line in got.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank lines between events, comments, `event:` and `id:` fields
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                try:
                    chunk = json.loads(data)
                except ValueError:
                    raise ChatStreamError(
                        f"the model server sent a chunk that is not JSON: {data[:80]!r}"
                    ) from None
                if not isinstance(chunk, dict):
                    raise ChatStreamError(
                        f"the model server sent a chunk that is no object: {data[:80]!r}"
                    )
                if isinstance(chunk.get("error"), dict | str):
                    raise ChatStreamError(f"the model server failed the answer: {_said(chunk)}")
                yield chunk
            raise ChatStreamError("the model server ended the stream before it was done")
    except httpx.ConnectError as exc:
        raise ChatStreamError(f"the model server at {url} cannot be reached: {exc}") from None
    except httpx.ReadTimeout:
        raise ChatStreamStalled(
            f"the model server at {url} sent nothing for {stall_s:g} s"
        ) from None
    except httpx.TimeoutException:
        raise ChatStreamError(f"the model server at {url} sent nothing for {stall_s:g} s") from None
    except httpx.RemoteProtocolError as exc:  # a server that died or dropped the connection
        raise ChatStreamError(
            f"the model server at {url} closed the connection mid-answer: {exc}"
        ) from None
    except httpx.HTTPError as exc:
        raise ChatStreamError(f"the model server's connection failed: {exc!r}") from None


async def _refusal(response: httpx.Response) -> str:
    raw = b""
    async for piece in response.aiter_bytes():
        raw += piece
        if len(raw) >= ERROR_BODY_BYTES:
            break
    said = ""
    try:
        said = _said(json.loads(raw))
    except ValueError:
        said = raw[:200].decode("utf-8", "replace").strip()
    status = f"{response.status_code} {response.reason_phrase}".strip()
    return f"the model server answered {status}" + (f": {said}" if said else "")


def _said(body: Any) -> str:
    """The message in an OpenAI-shaped error body (`{"error": {"message": ...}}`)."""
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            return str(error.get("message") or error.get("type") or "")[:300]
        if isinstance(error, str):
            return error[:300]
        if isinstance(body.get("message"), str):
            return str(body["message"])[:300]
    return ""


@dataclass
class _Call:
    call_id: str
    name: str
    said: bool = False
    """Some of its arguments came."""


@dataclass
class ChatDeltas:
    """A stream's chunks as Parley's: text deltas, and function calls piece by piece, each
    call ending (`done`) before the next begins, as the session takes them."""

    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    _calls: dict[int, _Call] = field(default_factory=dict)
    _open: int | None = None

    def feed(self, chunk: dict[str, Any]) -> list[TextDelta | ToolCallDelta]:
        out: list[TextDelta | ToolCallDelta] = []
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices") or []
        if not isinstance(choices, list) or not choices:
            return out
        choice = choices[0] if isinstance(choices[0], dict) else {}
        delta = choice.get("delta") or {}
        if isinstance(delta, dict):
            text = delta.get("content")
            if isinstance(text, str) and text:
                out.append(TextDelta(text=text))
            for piece in delta.get("tool_calls") or []:
                if isinstance(piece, dict):
                    out += self._call_piece(piece)
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
        return out

    def _call_piece(self, piece: dict[str, Any]) -> list[ToolCallDelta]:
        index = int(piece.get("index", 0))
        function = piece.get("function") or {}
        out: list[ToolCallDelta] = []
        call = self._calls.get(index)
        if call is None:
            name = str(function.get("name") or "")
            if not name:
                raise ChatStreamError("the model server began a tool call without its name")
            out += self._close_open()
            call = self._calls[index] = _Call(str(piece.get("id") or f"call_{index}"), name)
            self._open = index
        elif self._open != index:
            raise ChatStreamError("the model server interleaved the pieces of two tool calls")
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            call.said = True
            out.append(ToolCallDelta(call.call_id, call.name, arguments))
        return out

    def _close_open(self) -> list[ToolCallDelta]:
        if self._open is None:
            return []
        call = self._calls[self._open]
        self._open = None
        rest = "" if call.said else "{}"  # a call with no arguments: an empty object
        return [ToolCallDelta(call.call_id, call.name, rest, done=True)]

    def finish(self) -> list[ToolCallDelta]:
        """The end of the stream: the call still open is complete."""
        return self._close_open()
