"""A SIP call's media end to end on loopback: a Python RTP peer against a real session.

The peer is what a phone would be: it sends espeak-ng speech as 20 ms mu-law packets at
the pace of a microphone, and records every packet Parley sends back with its arrival
time. The session runs the fake engine (tests/fakes/fake_engine.py), whose answer is a
tone: heard on the peer's side as RTP audio that is not silence.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from aiortc.rtp import RtcpPacket, RtcpSrPacket

from loadtest.speech import silence, speak, trim_silence
from realtime import g711
from realtime.openai.server_events import to_wire
from realtime.transports.sip.dtmf import event_payload
from realtime.transports.sip.handler import Answer, IncomingCall, Rejection
from realtime.transports.sip.media_calls import SipCallNotFound, SipMediaCalls
from realtime.transports.sip.pending_calls import Accept, Decision, Refer, Reject
from realtime.transports.sip.rtp import RtpSender, parse
from realtime.transports.sip.sdp_audio import parse_offer
from sessions import SessionConfig, SessionManager
from sessions.events import Event
from tests.fakes.fake_engine import FakeEngine

RATE = 8000
PACKET = 160
LOUD = 500  # RMS of a packet that is not silence


@dataclass
class Received:
    at: float
    sequence: int
    timestamp: int
    payload_type: int
    rms: float


class Peer(asyncio.DatagramProtocol):
    """The caller's phone: sends mu-law RTP, records what comes back."""

    def __init__(self) -> None:
        self.sender = RtpSender(payload_type=0)
        self.received: list[Received] = []
        self.rtcp: list[bytes] = []
        self.transport: asyncio.DatagramTransport | None = None
        self.target: tuple[str, int] = ("127.0.0.1", 0)
        self.speech_sent_at: list[float] = []

    def datagram_received(self, data: bytes, addr: Any) -> None:
        packet = parse(data)
        if packet is None:
            return
        pcm = g711.ulaw_decode(packet.payload).astype(np.float64)
        rms = float(np.sqrt(np.mean(pcm**2))) if len(pcm) else 0.0
        self.received.append(
            Received(
                time.monotonic(),
                packet.sequence_number,
                packet.timestamp,
                packet.payload_type,
                rms,
            )
        )

    def loud(self, since: float = 0.0) -> list[Received]:
        return [r for r in self.received if r.rms > LOUD and r.at >= since]

    async def say(self, pcm: np.ndarray) -> None:
        """`pcm` (8 kHz) as 20 ms packets at real-time pace."""
        assert self.transport is not None
        start = time.monotonic()
        self.speech_sent_at.append(start)
        for n, offset in enumerate(range(0, len(pcm), PACKET)):
            frame = pcm[offset : offset + PACKET]
            if len(frame) < PACKET:
                frame = np.concatenate([frame, np.zeros(PACKET - len(frame), np.int16)])
            packet = self.sender.packet(g711.ulaw_encode(frame), PACKET)
            self.transport.sendto(packet, self.target)
            await asyncio.sleep(max(0.0, start + (n + 1) * 0.02 - time.monotonic()))

    def digit(self, event: int, timestamp: int) -> None:
        """One key press: start, two updates, the end packet three times."""
        assert self.transport is not None
        for end, duration in [(False, 160), (False, 320), (False, 480)] + [(True, 640)] * 3:
            packet = self.sender.packet(event_payload(event, end, duration), 0, payload_type=101)
            # all packets of one event carry its start timestamp
            raw = bytearray(packet)
            raw[4:8] = timestamp.to_bytes(4, "big")
            self.transport.sendto(bytes(raw), self.target)


@dataclass
class Listener:
    """A sideband-like listener on the call's events."""

    events: list[Event] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    posts: list[str] = field(default_factory=list)
    """The call's own playout news (output_audio_buffer.*)."""

    def event(self, event: Event) -> None:
        self.events.append(event)

    def post(self, message: dict[str, Any], *, after_audio: bool = False) -> None:
        self.posts.append(message["type"])

    def call_ended(self, reason: str) -> None:
        self.ended.append(reason)

    def types(self) -> list[str]:
        return [e.type for e in self.events]

    async def wait_for(self, kind: str, timeout: float = 15.0, count: int = 1) -> None:
        async with asyncio.timeout(timeout):
            while self.types().count(kind) < count:
                await asyncio.sleep(0.01)


def offer_sdp(port: int, media: str = "0 8 101", direction: str = "sendrecv") -> str:
    return (
        "v=0\r\no=peer 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
        f"m=audio {port} RTP/AVP {media}\r\na=rtpmap:101 telephone-event/8000\r\n"
        f"a=ptime:20\r\na={direction}\r\n"
    )


@pytest.fixture
async def peer() -> AsyncIterator[Peer]:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_datagram_endpoint(Peer, local_addr=("127.0.0.1", 0))
    protocol.transport = transport
    yield protocol
    transport.close()


@pytest.fixture
async def calls(manager: SessionManager) -> AsyncIterator[tuple[SipMediaCalls, list[str]]]:
    hung_up: list[str] = []

    async def hangup(call_id: str) -> None:
        hung_up.append(call_id)

    handler = SipMediaCalls(manager, hangup, host="127.0.0.1")
    yield handler, hung_up
    await handler.close()


async def answer_call(handler: SipMediaCalls, peer: Peer, call_id: str = "c1") -> Listener:
    assert peer.transport is not None
    port = peer.transport.get_extra_info("sockname")[1]
    result = await handler.invite(
        IncomingCall(call_id=call_id, source=("127.0.0.1", 5060), sdp=offer_sdp(port))
    )
    assert isinstance(result, Answer)
    ours = parse_offer(result.sdp)
    assert ours.address == "127.0.0.1" and ours.payload_types == [0, 101]
    peer.target = (ours.address, ours.port)
    listener = Listener()
    assert handler.get(call_id).listen(listener)
    await handler.confirmed(call_id)
    return listener


def question() -> np.ndarray:
    return np.concatenate(
        [trim_silence(speak("What is the capital of France?", rate=RATE)), silence(900, RATE)]
    )


async def test_a_call_is_heard_answered_paced_and_barged_in(
    calls: tuple[SipMediaCalls, list[str]], peer: Peer, engine: FakeEngine
) -> None:
    handler, hung_up = calls
    engine.audio_ms = 4_000
    listener = await answer_call(handler, peer)
    call = handler.get("c1")
    await peer.say(question())
    await listener.wait_for("input_audio_buffer.speech_started")
    await listener.wait_for("input_audio_buffer.committed")
    await listener.wait_for("response.created")
    async with asyncio.timeout(5):
        while len(peer.loud()) < 25:  # half a second of the answer heard
            await asyncio.sleep(0.02)
    # The answer comes back as 20 ms mu-law packets, numbered and paced.
    answer = peer.loud()
    assert all(r.payload_type == 0 for r in answer)
    window = [r for r in peer.received if r.at >= answer[0].at]
    seqs = [r.sequence for r in window]
    assert seqs == [(seqs[0] + i) & 0xFFFF for i in range(len(seqs))]
    assert {(b.timestamp - a.timestamp) & 0xFFFFFFFF for a, b in itertools.pairwise(window)} == {
        160
    }
    gaps = [b.at - a.at for a, b in itertools.pairwise(window)]
    assert 0.018 <= statistics.median(gaps) <= 0.022
    # Barge-in: speak over the answer; its audio stops at the next packet after the clear.
    interruption = np.concatenate(
        [trim_silence(speak("Stop, stop, wait a moment please.", rate=RATE)), silence(600, RATE)]
    )
    await peer.say(interruption)
    await listener.wait_for("conversation.item.truncated")
    assert call.cleared_at
    assert listener.posts[:2] == ["output_audio_buffer.started", "output_audio_buffer.stopped"]
    assert "output_audio_buffer.cleared" in listener.posts
    cleared = call.cleared_at[0]
    old = [r for r in peer.loud(peer.speech_sent_at[1]) if r.at < cleared + 0.5]
    last_old = old[-1].at if old else peer.speech_sent_at[1]
    clear_ms = (last_old - cleared) * 1000
    stop_ms = (last_old - peer.speech_sent_at[1]) * 1000
    print(
        f"barge-in: last answer packet {clear_ms:.0f} ms after the clear, "
        f"{stop_ms:.0f} ms after the caller began speaking; late packets "
        f"{call.rtp.late_packets}/{call.rtp.packets_sent}"
    )
    assert clear_ms < 100
    assert stop_ms < 400  # the detector needs a few frames to hear the speech begin
    assert call.rtp.late_packets <= call.rtp.packets_sent // 20  # a busy 2-core CI machine
    # The session closing itself hangs the call up with a BYE.
    await call.session.close("test") if call.session else None
    async with asyncio.timeout(5):
        while not hung_up:
            await asyncio.sleep(0.01)
    assert hung_up == ["c1"] and len(handler) == 0
    assert listener.ended


async def test_digits_arrive_once_each(calls: tuple[SipMediaCalls, list[str]], peer: Peer) -> None:
    handler, hung_up = calls
    listener = await answer_call(handler, peer)
    peer.digit(1, 1000)
    peer.digit(11, 5000)
    peer.digit(1, 9000)
    await listener.wait_for("input_audio_buffer.dtmf_event_received", count=3, timeout=5)
    await asyncio.sleep(0.1)
    digits = [
        getattr(e, "digit", "") for e in listener.events if e.type.endswith("dtmf_event_received")
    ]
    assert digits == ["1", "#", "1"]
    dtmf = next(e for e in listener.events if e.type.endswith("dtmf_event_received"))
    wire = to_wire(dtmf)
    assert wire is not None
    assert wire["type"] == "input_audio_buffer.dtmf_event_received"
    assert wire["event"] == "1" and abs(wire["received_at"] - time.time()) < 5
    await handler.ended("c1", "bye")
    assert len(handler) == 0 and hung_up == []  # the caller hung up: no BYE back
    await handler.ended("c1", "bye")  # idempotent


async def test_silence_flows_before_the_answer_and_to_the_sdp_address_first(
    calls: tuple[SipMediaCalls, list[str]], peer: Peer
) -> None:
    handler, _ = calls
    await answer_call(handler, peer)
    await asyncio.sleep(0.25)
    assert len(peer.received) >= 8  # silence packets keep the stream alive
    assert not peer.loud()
    await handler.ended("c1", "bye")


async def test_hold_stops_sending_and_resume_restarts(
    calls: tuple[SipMediaCalls, list[str]], peer: Peer
) -> None:
    handler, _ = calls
    listener = await answer_call(handler, peer)
    assert peer.transport is not None
    port = peer.transport.get_extra_info("sockname")[1]
    held = await handler.reinvite("c1", offer_sdp(port, direction="sendonly"))
    assert isinstance(held, Answer) and "a=recvonly" in held.sdp.splitlines()
    await asyncio.sleep(0.05)
    count = len(peer.received)
    await peer.say(trim_silence(speak("This is the hold music.", rate=RATE)))
    assert len(peer.received) == count  # nothing sent while held...
    assert "input_audio_buffer.speech_started" not in listener.types()  # ...or heard
    resumed = await handler.reinvite("c1", offer_sdp(port))
    assert isinstance(resumed, Answer) and "a=sendrecv" in resumed.sdp.splitlines()
    await asyncio.sleep(0.2)
    assert len(peer.received) >= count + 5
    assert await handler.reinvite("nope", offer_sdp(port)) == Rejection(
        481, "Call/Transaction Does Not Exist"
    )
    await handler.ended("c1", "bye")


async def test_refusals_cost_no_session(
    calls: tuple[SipMediaCalls, list[str]], peer: Peer, manager: SessionManager
) -> None:
    handler, _ = calls
    no_codec = IncomingCall("c2", ("127.0.0.1", 5060), offer_sdp(4000, media="9 96"))
    assert await handler.invite(no_codec) == Rejection(488, "Not Acceptable Here")
    garbage = IncomingCall("c3", ("127.0.0.1", 5060), "v=0\r\nnonsense")
    assert (await handler.invite(garbage)).status == 488  # type: ignore[union-attr]
    assert len(manager) == 0 and len(handler) == 0


async def test_busy_at_the_session_limit(
    calls: tuple[SipMediaCalls, list[str]], peer: Peer, manager: SessionManager
) -> None:
    handler, _ = calls
    for n in range(manager.max_sessions):
        await answer_call(handler, peer, f"full{n}")
    busy = IncomingCall("extra", ("127.0.0.1", 5060), offer_sdp(4000))
    assert await handler.invite(busy) == Rejection(486, "Busy Here")
    assert len(handler) == manager.max_sessions
    await handler.close()
    assert len(handler) == 0 and len(manager) == 0


async def test_cancel_while_answering(
    calls: tuple[SipMediaCalls, list[str]], peer: Peer, manager: SessionManager
) -> None:
    handler, hung_up = calls
    invite = asyncio.create_task(
        handler.invite(IncomingCall("c4", ("127.0.0.1", 5060), offer_sdp(4000)))
    )
    await asyncio.sleep(0)  # the invite is under way
    await handler.ended("c4", "cancel")
    assert await invite == Rejection(487, "Request Terminated")
    assert len(handler) == 0 and hung_up == []
    async with asyncio.timeout(2):
        while len(manager):
            await asyncio.sleep(0.01)


async def test_a_clear_silences_the_next_packet(
    calls: tuple[SipMediaCalls, list[str]], peer: Peer
) -> None:
    """The transport's part of a barge-in, without the detector: audio queued in the call's
    playout stops at the next 20 ms packet after `clear()`."""
    handler, _ = calls
    await answer_call(handler, peer)
    call = handler.get("c1")
    t = np.arange(24_000) / 24_000
    tone = (8000 * np.sin(2 * np.pi * 300 * t)).astype(np.int16)
    await call.audio(tone, 24_000)  # a second of answer
    async with asyncio.timeout(2):
        while len(peer.loud()) < 10:
            await asyncio.sleep(0.005)
    call.clear()
    cleared = call.cleared_at[-1]
    await asyncio.sleep(0.2)
    after = peer.loud(cleared)
    last_ms = (after[-1].at - cleared) * 1000 if after else 0.0
    print(f"clear: {len(after)} loud packets after it, the last {last_ms:.1f} ms after")
    assert len(after) <= 1  # a packet already on its way
    assert not after or after[-1].at - cleared < 0.025
    assert call.playout.queued_ms == 0
    await handler.ended("c1", "bye")


async def test_symmetric_rtp_and_rtcp_sender_reports(manager: SessionManager, peer: Peer) -> None:
    """Packets go to the SDP's address until the caller's own arrive, then to their source;
    a sender report goes to the RTCP port next to the SDP's RTP port."""
    loop = asyncio.get_running_loop()
    rtcp_in: asyncio.Queue[bytes] = asyncio.Queue()

    class Rtcp(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: Any) -> None:
            rtcp_in.put_nowait(data)

    rtcp, _ = await loop.create_datagram_endpoint(Rtcp, local_addr=("127.0.0.1", 0))
    try:

        async def hangup(call_id: str) -> None:
            pass

        handler = SipMediaCalls(manager, hangup, rtcp_interval_s=0.1)
        sdp_port = rtcp.get_extra_info("sockname")[1] - 1  # nothing listens there
        result = await handler.invite(IncomingCall("c5", ("127.0.0.1", 5060), offer_sdp(sdp_port)))
        assert isinstance(result, Answer)
        ours = parse_offer(result.sdp)
        peer.target = (ours.address, ours.port)
        await handler.confirmed("c5")
        (report,) = RtcpPacket.parse(await asyncio.wait_for(rtcp_in.get(), 2))
        assert isinstance(report, RtcpSrPacket) and report.sender_info.packet_count > 0
        await asyncio.sleep(0.1)
        assert peer.received == []  # our RTP went to the SDP's port
        await peer.say(silence(20, RATE))
        await asyncio.sleep(0.1)
        assert len(peer.received) >= 3  # latched onto where the caller's packet came from
        await handler.close()
    finally:
        rtcp.close()


@dataclass
class ScriptedGate:
    """OpenAI's flow with the app's decision given up front."""

    decision: Decision
    asked: list[str] = field(default_factory=list)

    async def decide(self, call: IncomingCall) -> Decision:
        self.asked.append(call.call_id)
        return self.decision


async def test_an_accepted_call_is_found_by_the_apps_id_and_hung_up_with_a_bye(
    manager: SessionManager, peer: Peer
) -> None:
    hung_up: list[str] = []

    async def hangup(call_id: str) -> None:
        hung_up.append(call_id)

    config = SessionConfig.parse({"instructions": "You answer the phone."})
    gate = ScriptedGate(Accept(call_id="rtc_app1", config=config))
    handler = SipMediaCalls(manager, hangup, gate=gate)
    try:
        listener = await answer_call(handler, peer, "sip-1")
        call = handler.get("rtc_app1")
        assert call is handler.get("sip-1") and call.app_call_id == "rtc_app1"
        assert call.session is not None
        assert call.session.config.instructions == "You answer the phone."
        await handler.hangup("rtc_app1")
        assert hung_up == ["sip-1"] and len(handler) == 0 and listener.ended
        with pytest.raises(SipCallNotFound):
            handler.get("rtc_app1")
    finally:
        await handler.close()


@pytest.mark.parametrize(
    ("decision", "status"),
    [(Reject(486, "busy"), 486), (Reject(), 603), (Refer("sip:desk@example.com"), 302)],
)
async def test_a_call_the_app_turns_away_costs_no_session(
    manager: SessionManager, decision: Decision, status: int
) -> None:
    async def hangup(call_id: str) -> None:
        pass

    handler = SipMediaCalls(manager, hangup, gate=ScriptedGate(decision))
    result = await handler.invite(IncomingCall("sip-2", ("127.0.0.1", 5060), offer_sdp(4000)))
    assert isinstance(result, Rejection) and result.status == status
    assert result.contact == ("sip:desk@example.com" if status == 302 else "")
    assert len(manager) == 0 and len(handler) == 0


async def test_no_common_codec_is_refused_before_the_app_is_asked(manager: SessionManager) -> None:
    async def hangup(call_id: str) -> None:
        pass

    gate = ScriptedGate(Reject())
    handler = SipMediaCalls(manager, hangup, gate=gate)
    result = await handler.invite(IncomingCall("sip-3", ("127.0.0.1", 5060), offer_sdp(4000, "9")))
    assert result == Rejection(488, "Not Acceptable Here") and gate.asked == []
