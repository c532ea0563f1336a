"""A raw WebSocket client for the JSON event protocols (OpenAI Realtime, the video chat
stream), as a test drives them: it sends events and keeps every event it read, so a test
can wait for one event and still check everything that came before it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Callable
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection

Event = dict[str, Any]


class RecordingClient:
    """`wait_s` is how long `wait_for` and `wait_type` wait unless told otherwise."""

    def __init__(self, ws: ClientConnection, wait_s: float = 15.0) -> None:
        self.ws = ws
        self.wait_s = wait_s
        self.events: list[Event] = []

    async def send(self, event: Event) -> None:
        await self.ws.send(json.dumps(event))

    async def next(self, within_s: float = 10.0) -> Event:
        async with asyncio.timeout(within_s):
            event: Event = json.loads(await self.ws.recv())
        self.events.append(event)
        return event

    async def wait_for(
        self, match: Callable[[Event], bool], within_s: float | None = None
    ) -> Event:
        """The next event that `match`es, keeping everything read on the way."""
        within_s = self.wait_s if within_s is None else within_s
        async with asyncio.timeout(within_s):
            while True:
                event = await self.next(within_s)
                if match(event):
                    return event

    async def wait_type(self, event_type: str, within_s: float | None = None) -> Event:
        return await self.wait_for(lambda e: e["type"] == event_type, within_s)

    async def until_quiet(self, quiet_s: float = 0.6) -> list[Event]:
        """Everything that arrives until nothing has for `quiet_s`."""
        got: list[Event] = []
        with contextlib.suppress(TimeoutError):
            while True:
                got.append(await self.next(quiet_s))
        return got

    async def read_to_the_end(self, within_s: float = 5) -> None:
        """Read until the server closes the connection (ConnectionClosed)."""
        async with asyncio.timeout(within_s):
            while True:
                await self.next(within_s)

    async def append(self, pcm: np.ndarray, chunk_ms: int = 100, rate: int = 24_000) -> None:
        """`pcm` as input_audio_buffer.append events of `chunk_ms` each."""
        step = rate * chunk_ms // 1000
        for start in range(0, len(pcm), step):
            chunk = pcm[start : start + step].astype("<i2").tobytes()
            audio = base64.b64encode(chunk).decode("ascii")
            await self.send({"type": "input_audio_buffer.append", "audio": audio})

    async def ask(self, pcm: np.ndarray, chunk_ms: int = 1000) -> None:
        """A manual turn: the audio, committed, and a response asked for."""
        await self.append(pcm, chunk_ms)
        await self.send({"type": "input_audio_buffer.commit"})
        await self.send({"type": "response.create"})

    def audio_ms(self, response_id: str, rate: int = 24_000) -> float:
        """How much answer audio (PCM16) this client has read for one response."""
        samples = sum(
            len(base64.b64decode(e["delta"])) // 2
            for e in self.events
            if e["type"] == "response.output_audio.delta" and e["response_id"] == response_id
        )
        return samples * 1000 / rate
