"""A whole SIP call: sipp dials the user agent server, which answers through SipMediaCalls
with a real session (the fake engine). sipp streams a spoken question as RTP
(`rtp_stream`, espeak-ng at 8 kHz mu-law) and plays RFC 4733 key presses from its own
pcaps; the session hears the question (speech, a committed turn, a transcript), the answer
goes back as RTP audio that is not silence, the digits arrive once each, and a BYE ends it.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from loadtest.speech import silence, speak, trim_silence
from realtime import g711
from realtime.transports.sip.media_calls import SipMediaCalls
from realtime.transports.sip.uas import SipServer
from sessions import SessionManager

from .support import SCENARIOS, T1, free_udp_port, requires_sipp
from .test_media_call import Listener

pytestmark = requires_sipp

DTMF_PCAP = Path("/usr/share/sip-tester/dtmf_2833_5.pcap")
"""sipp's own recording of key 5 (Debian's sip-tester ships 0-9)."""


def mulaw_wav(pcm: np.ndarray) -> bytes:
    """8 kHz mono mu-law in a WAV (format 7), as sipp's rtp_stream plays it."""
    data = g711.ulaw_encode(pcm)
    fmt = struct.pack("<HHIIHHH", 7, 1, 8000, 8000, 1, 8, 0)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"fact" + struct.pack("<II", 4, len(data)) + b"data" + struct.pack("<I", len(data))
    return b"RIFF" + struct.pack("<I", len(body) + len(data)) + body + data


def scenario(tmp: Path) -> Path:
    """sipp's `call` scenario with the media in the middle: the question, a wait for the
    answer, key 5."""
    question = np.concatenate(
        [trim_silence(speak("What is the capital of France?", rate=8000)), silence(1000, 8000)]
    )
    (tmp / "question.wav").write_bytes(mulaw_wav(question))
    media = (
        '<nop><action><exec rtp_stream="question.wav,1,0"/></action></nop>\n'
        '  <pause milliseconds="7000"/>\n'
        f'  <nop><action><exec play_pcap_audio="{DTMF_PCAP}"/></action></nop>\n'
        '  <pause milliseconds="1500"/>\n'
    )
    text = (SCENARIOS / "call.xml").read_text()
    text = text.replace('<pause milliseconds="200"/>', media)
    path = tmp / "media_call.xml"
    path.write_text(text)
    return path


@pytest.fixture
async def sip(manager: SessionManager) -> AsyncIterator[tuple[SipServer, SipMediaCalls]]:
    server: SipServer | None = None

    async def hangup(call_id: str) -> None:
        if server is not None:
            await server.hangup(call_id)

    calls = SipMediaCalls(manager, hangup, host="127.0.0.1")
    server = SipServer(calls, host="127.0.0.1", port=0, t1=T1)
    await server.start()
    try:
        yield server, calls
    finally:
        await server.close()
        await calls.close()


@pytest.mark.slow
@pytest.mark.skipif(not DTMF_PCAP.exists(), reason="sipp's DTMF pcaps are not installed")
async def test_sipp_call_is_heard_answered_and_gets_digits(
    sip: tuple[SipServer, SipMediaCalls], tmp_path: Path
) -> None:
    server, calls = sip
    path = scenario(tmp_path)
    process = await asyncio.create_subprocess_exec(
        *["sipp", f"127.0.0.1:{server.port}", "-sf", str(path), "-i", "127.0.0.1"],
        *["-p", str(free_udp_port()), "-mp", str(free_udp_port()), "-m", "1", "-nostdin"],
        *["-timeout", "30s", "-timeout_error", "-trace_err", "-error_file", "err.log"],
        cwd=tmp_path,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    listener = Listener()
    async with asyncio.timeout(5):
        while not len(calls):
            await asyncio.sleep(0.01)
    (call,) = [calls.get(call_id) for call_id in list(server.calls)]
    assert call.listen(listener)
    _, stderr = await process.communicate()
    errors = (
        (tmp_path / "err.log").read_text(errors="replace")
        if (tmp_path / "err.log").exists()
        else ""
    )
    assert process.returncode == 0, stderr.decode(errors="replace") + errors
    types = listener.types()
    for expected in (
        "input_audio_buffer.speech_started",
        "input_audio_buffer.committed",
        "conversation.item.input_audio_transcription.completed",
        "response.created",
        "input_audio_buffer.dtmf_event_received",
    ):
        assert expected in types, expected
    digits = [
        getattr(e, "digit", "") for e in listener.events if e.type.endswith("dtmf_event_received")
    ]
    assert digits == ["5"]
    assert call.rtp.audible_packets > 25  # the answer went out as audio, not silence
    assert call.rtp.late_packets <= call.rtp.packets_sent // 20
    async with asyncio.timeout(5):
        while len(calls):
            await asyncio.sleep(0.01)
    assert listener.ended and not server.calls
