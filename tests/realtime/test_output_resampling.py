"""The OpenAI WebSocket's output audio is resampled once, as one stream per response: a
response's 24 kHz speech written in many small, uneven pieces reaches a 16 kHz client as
the one-shot resample of the whole (no clicks at the pieces' boundaries), and after a
barge-in the next response starts clean (nothing the first left in the filter leaks in)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pytest
import soxr
from starlette.types import Message
from starlette.websockets import WebSocket

from pipeline.tasks import cancel_and_wait
from realtime.openai.client_events import AudioFormats
from realtime.openai.websocket import OpenAIRealtimeConnection
from sessions import SessionManager

SOURCE, CLIENT = 24_000, 16_000


class RecordingSocket:
    """A Starlette WebSocket over an ASGI channel that keeps what is sent."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        scope = {"type": "websocket", "path": "/v1/realtime", "headers": []}
        self.websocket = WebSocket(scope, self._receive, self._send)

    async def _receive(self) -> Message:
        return {"type": "websocket.connect"}

    async def _send(self, message: Message) -> None:
        if message["type"] == "websocket.send":
            self.sent.append(message["text"])

    def audio(self) -> npt.NDArray[np.int16]:
        deltas = [json.loads(m) for m in self.sent]
        pcm = b"".join(
            base64.b64decode(d["delta"])
            for d in deltas
            if d["type"] == "response.output_audio.delta"
        )
        return np.frombuffer(pcm, dtype="<i2")


@pytest.fixture
async def connection() -> AsyncIterator[tuple[OpenAIRealtimeConnection, RecordingSocket]]:
    socket = RecordingSocket()
    await socket.websocket.accept()
    formats = AudioFormats(output_rate=CLIENT)
    manager = cast(SessionManager, None)  # no session: only the connection's output is used
    conn = OpenAIRealtimeConnection(socket.websocket, manager, formats=formats)
    sender = asyncio.create_task(conn.run(), name="sender")
    try:
        yield conn, socket
    finally:
        conn.close()
        await cancel_and_wait(sender)


def speech(seconds: float, hz: float) -> npt.NDArray[np.int16]:
    """A gliding tone: every boundary artefact would show against it."""
    t = np.arange(int(SOURCE * seconds)) / SOURCE
    return (9000 * np.sin(2 * np.pi * (hz + 300 * t) * t)).astype(np.int16)


def uneven_pieces(pcm: npt.NDArray[np.int16]) -> list[npt.NDArray[np.int16]]:
    """Cut where a model's chunks might fall: 0.3 to 23 ms, never on a frame boundary."""
    cuts: list[npt.NDArray[np.int16]] = []
    at, sizes = 0, [24, 91, 240, 7, 553, 130, 48, 301]
    while at < len(pcm):
        size = sizes[len(cuts) % len(sizes)]
        cuts.append(pcm[at : at + size])
        at += size
    return cuts


def one_shot(pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
    whole = soxr.resample(pcm.astype(np.float32) / 32768, SOURCE, CLIENT)
    out: Any = np.clip(np.rint(whole * 32768), -32768, 32767).astype(np.int16)
    return cast(npt.NDArray[np.int16], out)


async def test_many_small_pieces_sound_as_one_resample_of_the_whole(
    connection: tuple[OpenAIRealtimeConnection, RecordingSocket],
) -> None:
    conn, socket = connection
    answer = speech(0.4, 220)
    for piece in uneven_pieces(answer):
        await conn.audio(piece, SOURCE)
    async with asyncio.timeout(5):
        await conn.drained()
    heard, expected = socket.audio(), one_shot(answer)
    assert len(heard) == len(expected)
    assert np.max(np.abs(heard.astype(np.int32) - expected)) <= 2  # rounding only


async def test_a_barge_ins_next_response_starts_clean(
    connection: tuple[OpenAIRealtimeConnection, RecordingSocket],
) -> None:
    conn, socket = connection
    conn.pause()  # the first answer is cut off before any of it went out
    for piece in uneven_pieces(speech(0.3, 440))[:5]:
        await conn.audio(piece, SOURCE)  # the filter now holds some of its look-ahead
    conn.clear()
    conn.resume()
    second = speech(0.3, 180)
    for piece in uneven_pieces(second):
        await conn.audio(piece, SOURCE)
    async with asyncio.timeout(5):
        await conn.drained()
    heard, expected = socket.audio(), one_shot(second)
    assert len(heard) == len(expected)
    assert np.max(np.abs(heard.astype(np.int32) - expected)) <= 2
