"""`interruption: "adaptive"` on a SIP call: the server's SIP settings ask for it, and a
caller's "Yeah." over the answer leaves every packet of it on the line (a Python RTP peer
on loopback, a real session, the fake engine's recogniser hearing "Yeah.")."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from loadtest.speech import silence, speak, trim_silence
from realtime.transports.sip.media_calls import SipMediaCalls
from sessions import SessionManager
from tests.fakes.fake_engine import FakeEngine

from .test_media_call import RATE, Peer, answer_call, peer, question

__all__ = ["peer"]  # the fixture, used by name

ANSWER_MS = 3_000


@pytest.fixture
async def adaptive_calls(manager: SessionManager) -> AsyncIterator[SipMediaCalls]:
    async def hangup(call_id: str) -> None:
        return None

    config = {"turn_detection": {"interruption": "adaptive"}}
    handler = SipMediaCalls(manager, hangup, host="127.0.0.1", config=config)
    yield handler
    await handler.close()


async def test_a_backchannel_on_the_line_leaves_the_answer_whole(
    adaptive_calls: SipMediaCalls, peer: Peer, engine: FakeEngine
) -> None:
    engine.audio_ms, engine.transcript = ANSWER_MS, "Yeah."
    listener = await answer_call(adaptive_calls, peer)
    await peer.say(question())
    await listener.wait_for("response.created")
    async with asyncio.timeout(5):
        while len(peer.loud()) < 25:  # half a second of the answer heard
            await asyncio.sleep(0.02)
    # A phone sends silence after the word: turn detection hears time pass on the line.
    await peer.say(np.concatenate([trim_silence(speak("Yeah.", rate=RATE)), silence(800, RATE)]))
    await listener.wait_for("response.done")
    await listener.wait_for("input_audio_buffer.speech_stopped", count=2)
    done = [e for e in listener.events if e.type == "response.done"]
    assert [getattr(e, "status", None) for e in done] == ["completed"]
    assert "conversation.item.truncated" not in listener.types()
    assert "output_audio_buffer.cleared" not in listener.posts
    async with asyncio.timeout(10):  # every packet of the answer reaches the caller
        while len(peer.loud()) < ANSWER_MS // 20:
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    assert len(peer.loud()) == ANSWER_MS // 20
