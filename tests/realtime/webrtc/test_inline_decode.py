"""The caller's audio is decoded on the event loop: the server's audio receiver decodes in
`put()`, the session hears the caller, and hanging up ends aiortc's idle decoder thread."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from starlette.applications import Starlette

from loadtest.speech import silence, speak, trim_silence
from loadtest.webrtc_client import Caller
from realtime.transports.webrtc.audio_jitter import AudioJitterBuffer
from realtime.transports.webrtc.inline_decode import InlineDecoder
from web.app import Services

from ..apps import fake_app


@pytest.fixture
async def app(tmp_path: Path, redis_url: str) -> AsyncIterator[Starlette]:
    async with fake_app(tmp_path, redis_url, "audio_ms: 600", max_sessions=2) as running:
        yield running


def decoder_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "audio-decoder")


async def test_the_callers_audio_is_decoded_inline_and_heard(
    http: httpx.AsyncClient, app: Starlette
) -> None:
    before = decoder_threads()
    caller = Caller(http)
    try:
        assert (await caller.connect()).status_code == 201
        services: Services = app.state.services
        assert services.running is not None and caller.call_id is not None
        call = services.running.calls.get(caller.call_id)
        caller.mic.say(np.concatenate([silence(200), trim_silence(speak("Hello there."))]))
        await caller.wait_for(lambda e: e["type"] == "input_audio_buffer.speech_started", 10)
        (receiver,) = [t.receiver for t in call.pc.getTransceivers() if t.kind == "audio"]
        inline = receiver._RTCRtpReceiver__decoder_queue  # type: ignore[attr-defined]
        assert isinstance(inline, InlineDecoder)
        assert inline.decoded > 10
        # the server's receive buffer hands each packet over as it comes (audio_jitter.py)
        jitter = receiver._RTCRtpReceiver__jitter_buffer  # type: ignore[attr-defined]
        assert isinstance(jitter, AudioJitterBuffer) and jitter.lost == 0
        # The caller's own (idle too: it decodes inline as well) and the server's, until the
        # hang-up.
        assert decoder_threads() == before + 2
    finally:
        await caller.close()
    await services.running.calls.hangup(call.call_id)
    assert decoder_threads() == before
