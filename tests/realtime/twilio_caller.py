"""A Twilio-format caller for the Media Streams tests: it speaks Twilio's side of a
bidirectional stream and plays the answer the way Twilio does.

It sends `connected`, `start`, 20 ms mu-law `media`, `dtmf` and `stop` as Twilio's docs
show them. What Parley sends is queued and "played" in real time by a player task
(optionally held back at first, as a jitter buffer or a slow network would): each `mark`
is echoed when the audio before it has been played, and `clear` drops the queue and
echoes the marks still in it at once, as Twilio does.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import time
from typing import Any

import numpy as np
import numpy.typing as npt
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from realtime.g711 import ulaw_encode

RATE = 8_000
FRAME = RATE // 50  # 20 ms


class TwilioCaller:
    def __init__(self, ws: ClientConnection, stream_sid: str = "MZ0001") -> None:
        self.ws = ws
        self.stream_sid = stream_sid
        self.received: list[dict[str, Any]] = []
        """Every message from Parley, in order."""
        self.media_ms = 0.0
        self.media_times: list[float] = []
        self.played_ms = 0.0
        self.echoed: list[tuple[str, float]] = []
        """Marks echoed after playing, with the played position then."""
        self.clears: list[tuple[float, float]] = []
        """At each `clear`: (played ms, the position of the last mark echoed)."""
        self.echo_marks = True
        """False: a caller that never echoes marks."""
        self.play_from = 0.0
        """Monotonic time before which nothing plays (a held buffer)."""
        self._queue: collections.deque[tuple[str, float | str]] = collections.deque()
        self._seq = 0
        self._chunk = 0
        self._closed = asyncio.Event()
        self._tasks = [
            asyncio.create_task(self._read(), name="caller:read"),
            asyncio.create_task(self._play(), name="caller:play"),
        ]

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- Twilio's messages ---------------------------------------------------------------

    async def send(self, body: dict[str, Any]) -> None:
        self._seq += 1
        await self.ws.send(json.dumps({**body, "sequenceNumber": str(self._seq)}))

    async def connect(self, token: str | None = None) -> None:
        await self.send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        params = {"caller": "+15550100"} | ({"token": token} if token else {})
        await self.send(
            {
                "event": "start",
                "streamSid": self.stream_sid,
                "start": {
                    "accountSid": "AC0001",
                    "streamSid": self.stream_sid,
                    "callSid": "CA0001",
                    "tracks": ["inbound"],
                    "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
                    "customParameters": params,
                },
            }
        )

    async def say(self, pcm: npt.NDArray[np.int16]) -> None:
        """`pcm` (8 kHz) as 20 ms media messages, at once (the session times audio by its
        samples, not by the clock)."""
        for start in range(0, len(pcm) - FRAME + 1, FRAME):
            self._chunk += 1
            payload = base64.b64encode(ulaw_encode(pcm[start : start + FRAME])).decode()
            media = {
                "track": "inbound",
                "chunk": str(self._chunk),
                "timestamp": str(self._chunk * 20),
                "payload": payload,
            }
            await self.send({"event": "media", "streamSid": self.stream_sid, "media": media})

    async def dtmf(self, digit: str) -> None:
        body = {"track": "inbound_track", "digit": digit}
        await self.send({"event": "dtmf", "streamSid": self.stream_sid, "dtmf": body})

    async def stop(self) -> None:
        stop = {"accountSid": "AC0001", "callSid": "CA0001"}
        await self.send({"event": "stop", "streamSid": self.stream_sid, "stop": stop})

    # --- what Parley sends ---------------------------------------------------------------

    def of(self, event: str) -> list[dict[str, Any]]:
        return [m for m in self.received if m["event"] == event]

    async def closed(self, within_s: float = 5) -> None:
        async with asyncio.timeout(within_s):
            await self._closed.wait()

    async def wait(self, condition: Any, within_s: float = 15) -> None:
        async with asyncio.timeout(within_s):
            while not condition():
                await asyncio.sleep(0.01)

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                body = json.loads(raw)
                self.received.append(body)
                assert body["streamSid"] == self.stream_sid
                match body["event"]:
                    case "media":
                        ms = len(base64.b64decode(body["media"]["payload"])) / RATE * 1000
                        self.media_ms += ms
                        self.media_times.append(time.monotonic())
                        self._queue.append(("media", ms))
                    case "mark":
                        self._queue.append(("mark", body["mark"]["name"]))
                    case "clear":
                        last = self.echoed[-1][1] if self.echoed else 0.0
                        self.clears.append((self.played_ms, last))
                        dropped = [name for kind, name in self._queue if kind == "mark"]
                        self._queue.clear()
                        for name in dropped:
                            await self._echo(str(name))
        except ConnectionClosed:
            pass
        finally:
            self._closed.set()

    async def _echo(self, name: str) -> None:
        if not self.echo_marks:
            return
        with contextlib.suppress(ConnectionClosed):
            await self.send({"event": "mark", "streamSid": self.stream_sid, "mark": {"name": name}})

    async def _play(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            budget = (now - last) * 1000 if now >= self.play_from else 0.0
            last = now
            while self._queue:
                kind, value = self._queue[0]
                if kind == "mark":
                    self._queue.popleft()
                    self.echoed.append((str(value), self.played_ms))
                    await self._echo(str(value))
                    continue
                if budget <= 0:
                    break
                step = min(budget, float(value))
                budget -= step
                self.played_ms += step
                if step < float(value):
                    self._queue[0] = (kind, float(value) - step)
                else:
                    self._queue.popleft()
