"""Faults in a live WebRTC call: hostile datagrams, malformed RTP/RTCP from the peer, Opus
that does not decode, bursts and oversized messages on the data channel. The call and a
neighbouring call go on (each still answers a spoken question), the errors are counted on
/metrics, and the log holds a few lines, not one per bad packet.

Real aiortc callers over loopback (loadtest.webrtc_client). Malformed RTP and RTCP are
sent through the caller's own DTLS transport (aiortc's `_send_rtp`, which SRTP-protects
them), so they arrive authenticated: what a buggy or hostile client could send.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import re
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from aiortc.rtcdtlstransport import RTCDtlsTransport
from starlette.applications import Starlette

from loadtest.speech import silence, speak, trim_silence
from loadtest.webrtc_client import Caller
from realtime.error_throttle import DEFAULT_LIMIT
from realtime.slow_clients import TOO_SLOW
from realtime.transports.webrtc.call import MAX_MESSAGE_BYTES
from realtime.transports.webrtc.ice import IceSettings
from realtime.transports.webrtc.registry import CallRegistry, CallSetupError
from sessions.config import SessionConfig
from web.app import Services

from .apps import asgi_client, fake_app

UNDECODABLE_OPUS = b"\x03\x00"
"""A code-3 Opus packet that says it holds zero frames: libopus refuses it."""


@pytest.fixture
async def app(tmp_path: Path, redis_url: str) -> AsyncIterator[Starlette]:
    async with fake_app(
        tmp_path, redis_url, "audio_ms: 1000, realtime_factor: 4.0", max_sessions=4
    ) as running:
        yield running


@pytest.fixture
async def callers(http: httpx.AsyncClient) -> AsyncIterator[tuple[Caller, Caller, int]]:
    """The caller under test, its neighbour, and the server's ICE port of the first."""
    caller, neighbour = Caller(http), Caller(http)
    try:
        answer = await caller.connect()
        assert answer.status_code == 201, answer.text
        assert (await neighbour.connect()).status_code == 201
        for c in (caller, neighbour):
            await c.wait_for(lambda e: e["type"] == "session.created")
        yield caller, neighbour, server_port(answer.text)
    finally:
        await caller.close()
        await neighbour.close()


def server_port(answer: str) -> int:
    found = re.search(r"a=candidate:\S+ 1 udp \d+ 127\.0\.0\.1 (\d+) typ host", answer)
    assert found, answer
    return int(found.group(1))


def question() -> np.ndarray:
    return np.concatenate([silence(300), trim_silence(speak("What time is it?"))])


async def answers_a_question(caller: Caller) -> None:
    """Media in (the microphone), media and events out: the call works end to end."""
    done = caller.count("response.done")
    caller.mic.say(question())
    await caller.wait_count("response.done", done + 1, within_s=30)
    last = [e for e in caller.events if e["type"] == "response.done"][-1]
    assert last["response"]["status"] == "completed"


async def still_talks(caller: Caller, tag: str) -> None:
    """The data channel carries events both ways."""
    updated = caller.count("session.updated")
    caller.send({"type": "session.update", "session": {"type": "realtime", "instructions": tag}})
    await caller.wait_count("session.updated", updated + 1, within_s=10)


async def media_errors(http: httpx.AsyncClient) -> dict[str, float]:
    text = (await http.get("/metrics")).text
    pattern = r'parley_webrtc_media_errors_total\{kind="(\w+)"\} ([0-9.e+]+)'
    return {kind: float(value) for kind, value in re.findall(pattern, text)}


def warnings_from(caplog: pytest.LogCaptureFixture, *prefixes: str) -> list[str]:
    return [
        r.getMessage()[:120]
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith(prefixes)
    ]


def sender_transport(caller: Caller) -> RTCDtlsTransport:
    transport = caller.pc.getTransceivers()[0].sender.transport
    assert transport is not None and transport.state == "connected"
    return transport


def random_datagram(rng: random.Random) -> bytes:
    size = rng.choice([0, 1, 2, 12, 40, 300, 1200])
    if not size:
        return b""
    first = rng.choice([0, 1, 3, 17, 20, 22, 23, 63, 64, 100, 128, 144, 191, 200, 255])
    return bytes([first]) + rng.randbytes(size - 1)


@pytest.mark.slow
async def test_random_datagrams_at_a_calls_port_do_not_end_it(
    callers: tuple[Caller, Caller, int],
    http: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caller, neighbour, port = callers
    rng = random.Random(8)
    datagrams = [random_datagram(rng) for _ in range(2_000)]
    not_media = sum(1 for d in datagrams if not d or not (20 <= d[0] <= 63 or 128 <= d[0] <= 191))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as attacker:
        for index, datagram in enumerate(datagrams):
            attacker.sendto(datagram, ("127.0.0.1", port))
            if index % 50 == 0:
                await asyncio.sleep(0.005)
    await still_talks(caller, "after the datagrams")
    await answers_a_question(caller)
    await answers_a_question(neighbour)
    assert (await media_errors(http)).get("datagram", 0) >= not_media
    noise = warnings_from(caplog, "parley.realtime.webrtc", "aiortc", "asyncio")
    assert len(noise) <= 3, noise


def rtp_with_bad_audio_level(sequence: int, ssrc: int) -> bytes:
    """An RTP packet whose audio-level header extension element carries 2 bytes, not 1."""
    extension = struct.pack("!HH", 0xBEDE, 1) + bytes([0x21, 0x80, 0x80, 0x00])
    header = struct.pack("!BBHII", 0x90, 96, sequence, sequence * 960, ssrc)
    return header + extension + UNDECODABLE_OPUS


@pytest.mark.slow
async def test_malformed_rtp_and_rtcp_from_the_peer_do_not_end_its_call(
    callers: tuple[Caller, Caller, int],
    http: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caller, neighbour, _port = callers
    transport = sender_transport(caller)
    rng = random.Random(9)
    ssrc = rng.getrandbits(32)
    for sequence in range(200):
        await transport._send_rtp(rtp_with_bad_audio_level(sequence, ssrc))
        rtcp_type = rng.choice([200, 201, 202, 204, 205, 206, 207])
        body = bytes([0x80 | rng.randrange(32), rtcp_type]) + rng.randbytes(rng.randint(2, 60))
        with contextlib.suppress(Exception):  # libsrtp refuses some on the way out
            await transport._send_rtp(body)
        if sequence % 20 == 0:
            await asyncio.sleep(0.01)
    await still_talks(caller, "after the packets")
    await answers_a_question(caller)
    await answers_a_question(neighbour)
    assert (await media_errors(http)).get("rtp", 0) >= 100
    noise = warnings_from(caplog, "parley.realtime.webrtc", "aiortc", "asyncio")
    assert len(noise) <= 4, noise


def garbling(send: Callable[[bytes], Awaitable[None]], on: asyncio.Event) -> Any:
    """A `_send_rtp` that, while `on` is set, swaps each RTP payload for one that does not
    decode: the caller's encoder gone wrong, with its own SSRC and sequence numbers."""

    async def send_rtp(data: bytes) -> None:
        if on.is_set() and not 192 <= data[1] <= 208:  # RTCP goes through as it is
            csrcs = data[0] & 0x0F
            header = 12 + 4 * csrcs
            if data[0] & 0x10:
                words = struct.unpack("!H", data[header + 2 : header + 4])[0]
                header += 4 + 4 * words
            data = data[:header] + UNDECODABLE_OPUS
        await send(data)

    return send_rtp


@pytest.mark.slow
async def test_opus_that_fails_to_decode_for_a_while_is_counted_and_the_call_recovers(
    callers: tuple[Caller, Caller, int],
    http: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caller, neighbour, _port = callers
    transport = sender_transport(caller)
    broken = asyncio.Event()
    transport._send_rtp = garbling(transport._send_rtp, broken)  # type: ignore[method-assign]
    broken.set()
    caller.mic.say(question())  # spoken into a broken encoder: lost
    await asyncio.sleep(2.0)
    broken.clear()
    async with asyncio.timeout(10):  # ~100 frames went out broken; most are counted by now
        while (await media_errors(http)).get("decode", 0) < 50:
            await asyncio.sleep(0.1)
    await answers_a_question(caller)
    await answers_a_question(neighbour)
    decode_lines = [m for m in warnings_from(caplog, "aiortc") if "failed to decode" in m]
    assert len(decode_lines) <= 2, decode_lines


async def test_a_burst_of_bad_and_oversized_events_on_the_data_channel_is_survived(
    callers: tuple[Caller, Caller, int], app: Starlette
) -> None:
    caller, _neighbour, _port = callers
    services: Services = app.state.services
    assert services.calls is not None and caller.call_id is not None
    call = services.calls.get(caller.call_id)
    # A client that ignores the answer's max-message-size (aiortc's caller enforces it).
    caller.pc.sctp._remote_max_message_size = 4 * MAX_MESSAGE_BYTES  # type: ignore[union-attr]
    oversized = json.dumps({"type": "session.update", "pad": "x" * (MAX_MESSAGE_BYTES + 1)})
    bad = 600
    for index in range(bad):
        caller.channel.send("{not json" if index % 2 else json.dumps({"type": "no.such"}))
    for _ in range(3):
        caller.channel.send(oversized)

    def accounted() -> tuple[int, int]:
        """(errors sent one by one, errors held back and counted in summaries)"""
        errors = [e for e in caller.events if e["type"] == "error"]
        summaries = [e for e in errors if e["error"]["code"] == "errors_suppressed"]
        held = sum(int(e["error"]["message"].split(" ", 1)[0]) for e in summaries)
        return len(errors) - len(summaries), held

    started = asyncio.get_running_loop().time()
    async with asyncio.timeout(20):  # each bad message is accounted for, once
        while sum(accounted()) < bad + 3:
            await asyncio.sleep(0.1)
    took = asyncio.get_running_loop().time() - started
    sent, held = accounted()
    assert sent + held == bad + 3
    assert sent <= DEFAULT_LIMIT * (took + 2), (sent, took)  # a few a second, not one each
    assert call.refused_messages >= 3  # the oversized ones, and any burst past the inbox
    await still_talks(caller, "after the burst")


async def test_an_offer_aiortc_cannot_answer_in_time_leaves_nothing(app: Starlette) -> None:
    services: Services = app.state.services
    assert services.manager is not None
    registry = CallRegistry(services.manager, IceSettings(("127.0.0.1",)), setup_timeout_s=0)
    caller = Caller(httpx.AsyncClient())
    try:
        caller.pc.addTrack(caller.mic)
        await caller.pc.setLocalDescription(await caller.pc.createOffer())
        with pytest.raises(CallSetupError, match="took over"):
            await registry.create(caller.pc.localDescription.sdp.encode(), SessionConfig())
        assert len(registry) == 0 and len(services.manager) == 0
    finally:
        await registry.close()
        await caller.close()
        await caller.http.aclose()


async def test_a_peer_that_stops_reading_its_data_channel_is_hung_up(
    tmp_path: Path, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The peer's SCTP stops taking data (no acknowledgements, as from a peer whose
    receive window stays shut): once the channel's unsent bytes have not gone down for
    the bound, the call ends `client_too_slow`, counted; a neighbouring call goes on."""
    settings: dict[str, Any] = {"max_sessions": 4, "slow_client_s": 0.5}
    async with (
        fake_app(tmp_path, redis_url, "audio_ms: 1000, realtime_factor: 4.0", **settings) as app,
        asgi_client(app) as http,
    ):
        services: Services = app.state.services
        caller, neighbour = Caller(http), Caller(http)
        try:
            for c in (caller, neighbour):
                assert (await c.connect()).status_code == 201
                await c.wait_for(lambda e: e["type"] == "session.created")
            assert services.calls is not None and caller.call_id is not None
            call = services.calls.get(caller.call_id)
            session = call.session
            assert session is not None

            async def take_nothing(chunk: Any) -> None:  # (aiortc's own, replaced)
                return None

            caller.pc.sctp._receive_data_chunk = take_nothing  # type: ignore[union-attr,method-assign]
            caller.send({"type": "session.update", "session": {"type": "realtime"}})
            caller.send({"type": "response.create"})
            await answers_a_question(neighbour)
            async with asyncio.timeout(10):
                while not session.closed:
                    await asyncio.sleep(0.02)
            assert call.close_reason == session.close_reason == TOO_SLOW
            await still_talks(neighbour, "after")
        finally:
            await caller.close()
            await neighbour.close()
        value = services.metrics.registry.get_sample_value(
            "parley_slow_clients_closed_total", {"transport": "webrtc_events"}
        )
        assert value == 1
    assert len(warnings_from(caplog, "parley.realtime.slow_clients")) == 1
