"""The outbound track per negotiated codec: an Opus call gets the track's own packets, a
PCMU call gets frames (aiortc encodes them); the caller hears the answer either way, and
the caller's audio is decoded inline whatever its codec."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from aiortc import RTCRtpSender, RTCSessionDescription
from starlette.applications import Starlette

from loadtest.speech import silence, speak, trim_silence
from loadtest.webrtc_client import Caller
from realtime.transports.webrtc.inline_decode import InlineDecoder
from web.app import Services

from ..apps import fake_app


@pytest.fixture
async def app(tmp_path: Path, redis_url: str) -> AsyncIterator[Starlette]:
    async with fake_app(
        tmp_path, redis_url, "audio_ms: 1500, realtime_factor: 4.0", max_sessions=2
    ) as running:
        yield running


def prefer(caller: Caller, mime: str) -> None:
    """Offer only `mime` for audio (set on the transceiver just before the offer)."""
    create_offer = caller.pc.createOffer

    async def offer() -> RTCSessionDescription:
        for transceiver in caller.pc.getTransceivers():
            if transceiver.kind == "audio":
                codecs = RTCRtpSender.getCapabilities("audio").codecs
                transceiver.setCodecPreferences([c for c in codecs if c.mimeType == mime])
        return await create_offer()

    caller.pc.createOffer = offer  # type: ignore[method-assign]


@pytest.mark.parametrize(("mime", "opus"), [("audio/opus", True), ("audio/PCMU", False)])
async def test_the_answer_is_heard_whatever_the_codec(
    http: httpx.AsyncClient, app: Starlette, mime: str, opus: bool
) -> None:
    caller = Caller(http)
    prefer(caller, mime)
    try:
        assert (await caller.connect()).status_code == 201
        services: Services = app.state.services
        assert services.running is not None and caller.call_id is not None
        call = services.running.calls.get(caller.call_id)
        assert (call.track._opus is not None) is opus
        caller.mic.say(np.concatenate([silence(300), trim_silence(speak("Hello there."))]))
        await caller.wait_for(lambda e: e["type"] == "output_audio_buffer.started", 20)
        await caller.wait_for(lambda e: e["type"] == "output_audio_buffer.stopped", 15)
        assert len(caller.loud_since(0)) > 30  # over half a second of audible answer
        (receiver,) = [t.receiver for t in call.pc.getTransceivers() if t.kind == "audio"]
        assert isinstance(receiver._RTCRtpReceiver__decoder_queue, InlineDecoder)  # type: ignore[attr-defined]
    finally:
        await caller.close()
