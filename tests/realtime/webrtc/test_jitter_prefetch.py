"""The caller's audio reaches the session one frame after it arrives, not four: the
server's audio jitter buffer has no prefetch, and still puts packets back in order."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtp import RtpPacket
from starlette.applications import Starlette

from loadtest.speech import silence, speak, trim_silence
from loadtest.webrtc_client import Caller
from web.app import Services

from ..apps import fake_app


def packet(seq: int) -> RtpPacket:
    """A 20 ms Opus packet as the receiver hands it to the buffer (depayloaded: `_data`)."""
    rtp = RtpPacket(payload_type=111, sequence_number=seq, timestamp=960 * seq, payload=b"x")
    rtp._data = b"x"  # type: ignore[attr-defined]
    return rtp


def released(buffer: JitterBuffer, seqs: list[int]) -> list[int | None]:
    """For each packet added in turn: the sequence number of the frame that came out."""
    out: list[int | None] = []
    for seq in seqs:
        _, frame = buffer.add(packet(seq))
        out.append(None if frame is None else frame.timestamp // 960)
    return out


def test_without_prefetch_a_frame_comes_out_with_the_next_packet() -> None:
    assert released(JitterBuffer(capacity=16, prefetch=4), [1, 2, 3, 4, 5, 6]) == [
        *[None] * 4,
        1,
        2,
    ]
    assert released(JitterBuffer(capacity=16, prefetch=0), [1, 2, 3, 4]) == [None, 1, 2, 3]


def test_without_prefetch_reordered_packets_still_come_out_in_order() -> None:
    buffer = JitterBuffer(capacity=16, prefetch=0)
    assert released(buffer, [1, 3, 2, 4]) == [None, None, 1, 2]
    assert released(buffer, [5]) == [3]


@pytest.fixture
async def app(tmp_path: Path, redis_url: str) -> AsyncIterator[Starlette]:
    async with fake_app(tmp_path, redis_url, "audio_ms: 600", max_sessions=2) as running:
        yield running


async def test_a_calls_audio_receiver_has_no_prefetch(
    http: httpx.AsyncClient, app: Starlette
) -> None:
    caller = Caller(http)
    try:
        assert (await caller.connect()).status_code == 201
        services: Services = app.state.services
        assert services.running is not None and caller.call_id is not None
        call = services.running.calls.get(caller.call_id)
        caller.mic.say(np.concatenate([silence(200), trim_silence(speak("Hello there."))]))
        await caller.wait_for(lambda e: e["type"] == "input_audio_buffer.speech_started", 10)
        (receiver,) = [t.receiver for t in call.pc.getTransceivers() if t.kind == "audio"]
        assert receiver._RTCRtpReceiver__jitter_buffer._prefetch == 0  # type: ignore[attr-defined]
    finally:
        await caller.close()
    await services.running.calls.hangup(call.call_id)
