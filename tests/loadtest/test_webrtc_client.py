"""The load-test caller's cheap paths: its microphone sends Opus encoded once per
utterance (silence: one cached 3-byte packet), and it decodes what it hears on the loop;
end to end, a call through the fake engine still hears its answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import av
import httpx
import numpy as np
import pytest
from starlette.applications import Starlette

from loadtest import caller_opus
from loadtest.speech import silence, speak, trim_silence
from loadtest.webrtc_client import FRAME, RATE, Caller, Microphone, rms
from realtime.transports.webrtc.inline_decode import InlineDecoder
from realtime.transports.webrtc.opus_out import silent_packet
from tests.realtime.apps import asgi_client, fake_app


def decode(packets: list[bytes]) -> np.ndarray:
    """Opus packets -> mono float PCM at 48 kHz (FFmpeg's decoder, as a server would)."""
    codec = av.CodecContext.create("opus", "r")
    assert isinstance(codec, av.AudioCodecContext)
    codec.sample_rate, codec.layout = RATE, "mono"
    out = []
    for i, data in enumerate(packets):
        for frame in codec.decode(caller_opus.packet(data, i * FRAME)):
            out.append(frame.to_ndarray()[0])
    return np.concatenate(out) * 32768


def test_an_utterance_is_encoded_once_and_decodes_to_itself() -> None:
    speech = trim_silence(speak("Hello there."))
    packets = caller_opus.utterance_packets(speech)
    assert caller_opus.utterance_packets(speech.copy()) is packets  # cached by content
    assert len(packets) == -(-len(speech) * 3 // FRAME)
    sent = caller_opus.to_48k(speech).astype(np.float64)
    heard = decode(list(packets))
    # Opus delays by its look-ahead (6.5 ms): align, then compare.
    n = len(sent) - FRAME
    lag = max(range(FRAME), key=lambda lag: float(np.dot(heard[lag : lag + n], sent[:n])))
    assert np.corrcoef(sent[:n], heard[lag : lag + n])[0, 1] > 0.9


def test_silence_is_libopus_3_byte_packet_and_decodes_to_silence() -> None:
    packet = silent_packet()
    assert len(packet) == 3 and silent_packet() is packet
    assert float(np.abs(decode([packet] * 10)).max()) < 1


async def test_the_microphone_sends_packets_speech_then_silence() -> None:
    mic = Microphone()
    first = await mic.recv()
    assert isinstance(first, av.AudioFrame)  # PCM until Opus is negotiated
    mic.encode_opus()
    speech = trim_silence(speak("Hi."))
    mic.say(speech)
    expected = caller_opus.utterance_packets(speech)
    sent = [await mic.recv() for _ in range(len(expected) + 2)]
    packets = [p for p in sent if isinstance(p, av.Packet)]
    assert packets == sent
    assert [bytes(p) for p in packets[: len(expected)]] == list(expected)
    assert [bytes(p) for p in packets[len(expected) :]] == [silent_packet()] * 2
    assert [p.pts for p in packets] == [FRAME * (i + 1) for i in range(len(sent))]
    assert len(mic.speech_started_at) == 1
    mic.stop()


def test_rms_of_a_decoded_frame() -> None:
    pcm = np.tile(np.array([[300, -300]], dtype=np.int16), (1, FRAME))
    frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="stereo")
    assert rms(frame) == pytest.approx(300)
    mono = np.full((1, FRAME), 0.5, np.float32)
    planar = av.AudioFrame.from_ndarray(mono, format="fltp", layout="mono")
    assert rms(planar) == pytest.approx(0.5)


@pytest.fixture
async def app(tmp_path: Path, redis_url: str) -> AsyncIterator[Starlette]:
    async with fake_app(tmp_path, redis_url, "audio_ms: 600", max_sessions=2) as running:
        yield running


@pytest.fixture
async def http(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(app) as client:
        yield client


async def test_a_call_sends_opus_decodes_inline_and_hears_its_answer(
    http: httpx.AsyncClient,
) -> None:
    caller = Caller(http)
    try:
        assert (await caller.connect()).status_code == 201
        (receiver,) = [t.receiver for t in caller.pc.getTransceivers() if t.kind == "audio"]
        inline = receiver._RTCRtpReceiver__decoder_queue  # type: ignore[attr-defined]
        assert isinstance(inline, InlineDecoder)
        caller.mic.say(np.concatenate([silence(200), trim_silence(speak("Hello there."))]))
        await caller.wait_for(lambda e: e["type"] == "output_audio_buffer.started", 15)
        await caller.wait_for(lambda e: e["type"] == "output_audio_buffer.stopped", 15)
        assert caller.loud_since(caller.mic.speech_started_at[0])
        assert inline.decoded > 10
    finally:
        await caller.close()
