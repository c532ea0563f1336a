"""A real aiortc caller for tests and load tests: a microphone, a camera, an ear.

It calls Parley the way OpenAI's browser guide calls OpenAI: data channel `oai-events`,
offer POSTed to /v1/realtime/calls, answer applied. Everything it hears is timestamped.

A bench runs tens of callers on the server's cores, so a caller is made cheap: its
microphone sends pre-encoded Opus (caller_opus.py) and its audio is decoded on the loop
(realtime/transports/webrtc/inline_decode.py), not in a thread per call.
"""

from __future__ import annotations

import asyncio
import fractions
import json
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import av
import httpx
import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from av.stream import Stream

from pipeline.tasks import TaskSet
from realtime.transports.webrtc.inline_decode import decode_inline
from realtime.transports.webrtc.opus_out import silent_packet
from realtime.transports.webrtc.outbound import sends_opus

from . import caller_opus

RATE = 48_000
FRAME = 960
LOUD = 300.0


def rms(frame: av.AudioFrame) -> float:
    """Root mean square of a decoded frame's samples (all channels), in PCM16 units."""
    if frame.format.name != "s16":  # aiortc's decoders give packed s16; anything else
        pcm = frame.to_ndarray().astype(np.float64)
        return float(np.sqrt(np.mean(pcm**2)))
    count = frame.samples * frame.layout.nb_channels
    if not count:
        return 0.0
    samples = np.frombuffer(memoryview(frame.planes[0]), dtype=np.int16, count=count)
    values = samples.astype(np.float32)
    return float(np.sqrt(np.dot(values, values) / count))


class Microphone(MediaStreamTrack):
    """What the caller says, in real time, 20 ms a frame; silence in between.

    Once `encode_opus()` is called (the call sends Opus), it hands aiortc ready Opus packets
    (see caller_opus.py: each utterance encoded once for every caller, silence one cached
    packet); before that, and for any other codec, PCM frames that aiortc encodes."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._queue = np.zeros(0, dtype=np.int16)
        self._pending: deque[np.ndarray] = deque()
        self._packets: deque[bytes] = deque()
        self._opus = False
        self._start: float | None = None
        self._pts = 0
        self._was_silent = True
        self.speech_started_at: list[float] = []

    def encode_opus(self) -> None:
        """Send Opus packets from now on (the call's sender negotiated Opus)."""
        self._opus = True

    def say(self, pcm16k: np.ndarray) -> None:
        """Queue speech (PCM16 mono 16 kHz); it goes out in real time after what is queued."""
        self._pending.append(pcm16k)

    async def recv(self) -> av.AudioFrame | av.Packet[Stream]:
        if self._start is None:
            self._start = time.monotonic()
        else:
            self._pts += FRAME
            await asyncio.sleep(max(0.0, self._start + self._pts / RATE - time.monotonic()))
        if self._opus:
            return self._next_packet()
        return self._next_frame()

    def _voiced(self, voiced: bool) -> None:
        if voiced and self._was_silent:
            self.speech_started_at.append(time.monotonic())
        self._was_silent = not voiced

    def _next_packet(self) -> av.Packet[Stream]:
        if not self._packets and len(self._queue):  # what PCM frames had yet to send
            self._packets.extend(caller_opus.utterance_packets(self._queue, RATE))
            self._queue = np.zeros(0, dtype=np.int16)
        if not self._packets and self._pending:
            self._packets.extend(caller_opus.utterance_packets(self._pending.popleft()))
        self._voiced(bool(self._packets))
        data = self._packets.popleft() if self._packets else silent_packet()
        return caller_opus.packet(data, self._pts)

    def _next_frame(self) -> av.AudioFrame:
        while self._pending:
            pcm = caller_opus.to_48k(self._pending.popleft())
            self._queue = np.concatenate([self._queue, pcm])
        chunk, self._queue = self._queue[:FRAME], self._queue[FRAME:]
        self._voiced(bool(len(chunk)))
        if len(chunk) < FRAME:
            chunk = np.concatenate([chunk, np.zeros(FRAME - len(chunk), dtype=np.int16)])
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = RATE, self._pts, fractions.Fraction(1, RATE)
        return frame


class Camera(MediaStreamTrack):
    """15 fps of a scene whose brightness keeps changing (a similar-frame filter keeps it),
    or, while `colour` is set, of that colour (RGB)."""

    kind = "video"

    def __init__(self) -> None:
        super().__init__()
        self._pts = 0
        self._count = 0
        self.colour: tuple[int, int, int] | None = None

    async def recv(self) -> av.VideoFrame:
        await asyncio.sleep(1 / 15)
        self._pts += 6000
        self._count += 1
        level = (self._count * 7) % 256
        pixels = np.full((120, 160, 3), self.colour or level, dtype=np.uint8)
        frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
        frame.pts, frame.time_base = self._pts, fractions.Fraction(1, 90_000)
        return frame


class Caller:
    def __init__(self, http: httpx.AsyncClient, camera: bool = False) -> None:
        self.http = http
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.mic = Microphone()
        self.camera = Camera() if camera else None
        self.events: list[dict[str, Any]] = []
        self.heard: list[tuple[float, float]] = []
        self.call_id: str | None = None
        self.session_id: str | None = None
        self._new_event = asyncio.Event()
        self._tasks = TaskSet("caller")
        self.channel = self.pc.createDataChannel("oai-events")
        self.channel.on("message", self._on_message)
        self.pc.on("track", self._on_track)

    def _on_message(self, message: str | bytes) -> None:
        self.events.append(json.loads(message))
        self._new_event.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            # Before its receiver starts (it starts once connected): decode on the loop,
            # without aiortc's thread per receiver and its two hand-offs per packet.
            for transceiver in self.pc.getTransceivers():
                if transceiver.receiver.track is track:
                    decode_inline(transceiver.receiver)
            self._tasks.create_task(self._listen(track))

    async def _listen(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            assert isinstance(frame, av.AudioFrame)
            self.heard.append((time.monotonic(), rms(frame)))

    async def connect(self, headers: dict[str, str] | None = None) -> httpx.Response:
        self.pc.addTrack(self.mic)
        if self.camera is not None:
            self.pc.addTrack(self.camera)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        response = await self.http.post(
            "/v1/realtime/calls",
            content=self.pc.localDescription.sdp,
            headers={"Content-Type": "application/sdp", **(headers or {})},
        )
        if response.status_code == 201:
            self.call_id = response.headers["location"].rsplit("/", 1)[1]
            await self.pc.setRemoteDescription(RTCSessionDescription(response.text, "answer"))
            if sends_opus(response.text):
                self.mic.encode_opus()
        return response

    async def offer(self) -> str:
        """The microphone on the peer connection, and its SDP offer (set as local)."""
        self.pc.addTrack(self.mic)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return str(self.pc.localDescription.sdp)

    async def answered(self, sdp: str) -> None:
        """The server's SDP answer applied; the microphone sends Opus if it was chosen."""
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp, "answer"))
        if sends_opus(sdp):
            self.mic.encode_opus()

    async def connect_live(
        self, session: dict[str, Any], headers: dict[str, str] | None = None
    ) -> httpx.Response:
        """GPT-Live's WebRTC start: the offer and the session config as JSON to
        `/v1/live/sessions`; `session_id` is the session's once answered (201)."""
        body = {"session": session, "transport": {"type": "webrtc", "sdp": await self.offer()}}
        response = await self.http.post("/v1/live/sessions", json=body, headers=headers or {})
        if response.status_code == 201:
            answer = response.json()
            self.session_id = answer["session"]["id"]
            await self.answered(answer["transport"]["sdp"])
        return response

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    async def wait_for(
        self, match: Callable[[dict[str, Any]], bool], within_s: float = 20
    ) -> dict[str, Any]:
        async with asyncio.timeout(within_s):
            seen = 0
            while True:
                for event in self.events[seen:]:
                    if match(event):
                        return event
                seen = len(self.events)
                self._new_event.clear()
                await self._new_event.wait()

    def count(self, event_type: str) -> int:
        return sum(1 for e in self.events if e["type"] == event_type)

    async def wait_count(self, event_type: str, n: int, within_s: float = 20) -> None:
        """Wait until `n` events of `event_type` have arrived in all."""
        seen = 0

        def nth(event: dict[str, Any]) -> bool:
            nonlocal seen
            if event["type"] == event_type:
                seen += 1
            return seen >= n

        if self.count(event_type) < n:
            await self.wait_for(nth, within_s)

    def loud_since(self, since: float) -> list[float]:
        return [t for t, level in self.heard if t >= since and level > LOUD]

    async def close(self) -> None:
        await self._tasks.close()
        await self.pc.close()
