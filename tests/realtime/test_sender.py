"""The paced sender: real-time audio with a lead, clear, pause, bounds, order."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from pipeline.tasks import cancel_and_wait
from realtime.transports.websocket.sender import SILENCE_AHEAD_S, PacedSender, SlowClientError

RATE = 24_000


class Wire:
    """A client that reads everything at once, and notes when each message came."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.times: list[float] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def send(self, message: dict[str, Any]) -> None:
        await self.gate.wait()
        self.messages.append(message)
        self.times.append(time.monotonic())

    def kinds(self) -> list[str]:
        return [m["type"] for m in self.messages]


def audio_message(pcm: npt.NDArray[np.int16], rate: int) -> dict[str, Any]:
    return {"type": "audio", "ms": len(pcm) * 1000 / rate, "first": int(pcm[0])}


def pcm(ms: int, value: int = 1) -> npt.NDArray[np.int16]:
    return np.full(RATE * ms // 1000, value, dtype=np.int16)


@contextlib.asynccontextmanager
async def running(sender: PacedSender) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(sender.run())
    try:
        yield task
    finally:
        await cancel_and_wait(task)


async def test_audio_goes_out_in_pieces_at_real_time_with_a_lead() -> None:
    wire = Wire()
    sender = PacedSender(wire.send, audio_message, lead_ms=300, piece_ms=100)
    async with running(sender):
        started = time.monotonic()
        await sender.audio(pcm(1_500), RATE)
        await sender.drained()
        finished = time.monotonic() - started
    assert [m["ms"] for m in wire.messages] == [100.0] * 15
    assert sender.played_ms == 1_500
    # The first 300 ms go at once; then each piece leaves the lead ahead of real time.
    for index, at in enumerate(wire.times):
        ahead_ms = index * 100 - (at - started) * 1000
        expected = min(index * 100, 300)
        assert expected - 150 <= ahead_ms <= expected + 30, (index, ahead_ms)
    assert 1.4 <= finished <= 1.8  # drained() waits out the lead: the client has played it


async def test_clear_drops_queued_audio_at_once_and_keeps_events() -> None:
    wire = Wire()
    sender = PacedSender(wire.send, audio_message)
    sender.post({"type": "a"})
    await sender.audio(pcm(1_000), RATE)
    sender.post({"type": "b"})
    assert sender.queued_ms == 1_000
    sender.clear()
    assert sender.queued_ms == 0
    async with running(sender):
        await sender.flushed()
    assert wire.kinds() == ["a", "b"]
    assert sender.played_ms == 0


async def test_events_and_audio_keep_their_order() -> None:
    wire = Wire()
    sender = PacedSender(wire.send, audio_message, lead_ms=1_000)
    sender.post({"type": "e1"})
    await sender.audio(pcm(200, 2), RATE)
    sender.post({"type": "e2"})
    await sender.audio(pcm(30, 3), RATE)
    await sender.audio(pcm(30, 3), RATE)  # small chunks coalesce into one piece
    sender.post({"type": "e3"})
    async with running(sender):
        await sender.flushed()
    assert wire.kinds() == ["e1", "audio", "audio", "e2", "audio", "e3"]
    assert [m["ms"] for m in wire.messages if m["type"] == "audio"] == [100, 100, 60]


async def test_a_full_queue_drops_the_oldest_audio_first_and_counts_it() -> None:
    wire = Wire()
    sender = PacedSender(wire.send, audio_message, max_items=5, lead_ms=1_000)
    await sender.audio(np.concatenate([pcm(100, 1), pcm(100, 2), pcm(100, 3)]), RATE)
    for name in ("e1", "e2", "e3"):
        sender.post({"type": name})
    assert sender.queued_items == 5
    assert sender.dropped_audio == 1
    async with running(sender):
        await sender.flushed()
    assert [m.get("first", m["type"]) for m in wire.messages] == [2, 3, "e1", "e2", "e3"]


async def test_a_client_that_stops_reading_ends_the_sender_not_the_memory() -> None:
    wire = Wire()
    wire.gate.clear()  # every send blocks: the client's socket is full
    sender = PacedSender(wire.send, audio_message, max_items=8)
    async with running(sender) as task:
        for i in range(20):
            sender.post({"type": f"e{i}"})
            if i % 3 == 0:
                await sender.audio(pcm(100), RATE)
        assert sender.queued_items <= 8
        assert sender.dropped_audio > 0
        wire.gate.set()
        with pytest.raises(SlowClientError):
            await asyncio.wait_for(task, 2)
    assert sender.dropped_events > 0


async def test_audio_waits_while_two_seconds_are_queued() -> None:
    wire = Wire()
    sender = PacedSender(wire.send, audio_message, max_queued_ms=500)
    writer = asyncio.create_task(sender.audio(pcm(1_000), RATE))
    await asyncio.sleep(0.05)
    assert not writer.done() and sender.queued_ms == 500
    async with running(sender):
        await asyncio.wait_for(writer, 2)
        await sender.drained()
    assert sender.played_ms == 1_000


async def test_pause_holds_audio_but_lets_events_through_except_ends() -> None:
    wire = Wire()
    sender = PacedSender(wire.send, audio_message, lead_ms=1_000)
    sender.pause()
    await sender.audio(pcm(300), RATE)
    sender.post({"type": "speech_started"})
    sender.post({"type": "response.done"}, after_audio=True)
    sender.post({"type": "later"})
    async with running(sender):
        await asyncio.sleep(0.1)
        assert wire.kinds() == ["speech_started"]
        sender.resume()
        await sender.flushed()
    assert wire.kinds() == ["speech_started", "audio", "audio", "audio", "response.done", "later"]


async def test_close_releases_a_waiting_writer() -> None:
    sender = PacedSender(Wire().send, audio_message, max_queued_ms=100)
    writer = asyncio.create_task(sender.audio(pcm(1_000), RATE))
    await asyncio.sleep(0.02)
    sender.close()
    await asyncio.wait_for(writer, 1)
    sender.close()  # idempotent


async def test_the_reader_waits_while_replies_fill_half_the_queue() -> None:
    """A burst of client messages that each get a reply must not overflow the queue: the
    reader holds off at half full until the sender has caught up."""
    wire = Wire()
    wire.gate.clear()  # the client has not read yet
    sender = PacedSender(wire.send, audio_message, max_items=8)
    replied = 0

    async def reader() -> None:
        nonlocal replied
        for i in range(20):
            await sender.input_room()
            sender.post({"type": f"pong{i}"})
            replied += 1

    async with running(sender):
        burst = asyncio.create_task(reader())
        await asyncio.sleep(0.05)
        assert not burst.done() and sender.queued_items <= 5  # half, plus the one in flight
        wire.gate.set()  # the client reads
        await asyncio.wait_for(burst, 2)
        await sender.flushed()
    assert replied == 20 and wire.kinds() == [f"pong{i}" for i in range(20)]
    assert sender.dropped_events == 0


async def test_a_reader_held_up_by_a_client_that_never_reads_gives_up() -> None:
    wire = Wire()
    wire.gate.clear()
    sender = PacedSender(wire.send, audio_message, max_items=8, stall_s=0.2)
    async with running(sender):
        for i in range(4):
            sender.post({"type": f"reply{i}"})
        await sender.input_room()  # the one in flight has left the queue
        sender.post({"type": "reply4"})
        with pytest.raises(SlowClientError):
            await asyncio.wait_for(sender.input_room(), 2)
        sender.close()
        await asyncio.wait_for(sender.input_room(), 1)  # closed: nothing to wait for


async def test_a_write_blocked_by_a_client_that_never_reads_ends_the_sender() -> None:
    wire = Wire()
    wire.gate.clear()  # the socket's buffers are full: the write never completes
    sender = PacedSender(wire.send, audio_message, stall_s=0.2)
    sender.post({"type": "e"})
    async with running(sender) as task:
        with pytest.raises(SlowClientError):
            await asyncio.wait_for(task, 2)


async def test_clear_drops_the_rest_of_a_write_it_interrupted() -> None:
    wire = Wire()
    sender = PacedSender(wire.send, audio_message, max_queued_ms=200)
    writer = asyncio.create_task(sender.audio(pcm(1_000), RATE))
    await asyncio.sleep(0.02)
    assert not writer.done() and sender.queued_ms == 200
    sender.clear()  # barge-in while the model's chunk waits for room
    await asyncio.wait_for(writer, 1)
    assert sender.queued_ms == 0  # the other 800 ms never queue
    async with running(sender):
        await asyncio.wait_for(sender.drained(), 1)
    assert wire.messages == [] and sender.played_ms == 0


KINDS: dict[str, tuple[dict[str, Any], bool]] = {
    "text delta": ({"type": "response.output_text.delta", "delta": "word "}, False),
    "transcript delta": ({"type": "response.output_audio_transcript.delta", "delta": "w"}, False),
    "control": ({"type": "response.done", "response": {"status": "completed"}}, True),
    "error": ({"type": "error", "error": {"code": "invalid_value"}}, False),
    "session event": ({"type": "session.updated", "session": {}}, False),
}


@pytest.mark.parametrize("kind", [*KINDS, "audio delta"])
async def test_every_kind_of_message_stays_bounded_while_the_client_does_not_read(
    kind: str,
) -> None:
    """Whatever the answer is made of, a client that never reads costs at most the queue's
    bound (events: `max_items`; audio: `max_queued_ms`, the model waiting past it), and
    its sender gives up after `stall_s`."""
    wire = Wire()
    wire.gate.clear()  # the first write blocks for ever: the socket's buffers are full
    sender = PacedSender(wire.send, audio_message, max_items=16, max_queued_ms=500, stall_s=0.3)
    async with running(sender) as task:
        if kind == "audio delta":
            writer = asyncio.create_task(sender.audio(pcm(5_000), RATE))
            await asyncio.sleep(0.1)
            assert not writer.done()  # the model is held back...
            assert sender.queued_ms <= 500 and sender.queued_items <= 16  # ...at the bound
        else:
            writer = None
            message, after_audio = KINDS[kind]
            for _ in range(1_000):
                sender.post(dict(message), after_audio=after_audio)
                assert sender.queued_items <= 16
            assert sender.dropped_events > 0  # counted, and fatal to the connection
        with pytest.raises(SlowClientError):
            await asyncio.wait_for(task, 2)
        sender.close()
        if writer is not None:
            await asyncio.wait_for(writer, 1)  # closing releases the model
    assert len(wire.messages) == 0


async def test_silence_fills_the_gaps_and_an_answer_waits_behind_little_of_it() -> None:
    """With `silence_ms` (GPT-Live) the stream never pauses: silence at real time while
    nothing is said, an answer's audio after at most `SILENCE_AHEAD_S` of it, and
    `drained()` waits for the answer only (silence goes on after it)."""
    wire = Wire()
    sender = PacedSender(wire.send, audio_message, lead_ms=300, piece_ms=100, silence_ms=40)
    async with running(sender):
        started = time.monotonic()
        await asyncio.sleep(0.5)
        quiet = [m for m in wire.messages if m["first"] == 0]
        assert quiet == wire.messages and all(m["ms"] == 40.0 for m in quiet)
        sent_ms = 40 * len(quiet)
        assert 400 <= sent_ms <= 500 + 1000 * SILENCE_AHEAD_S + 40, sent_ms  # real time
        asked = time.monotonic()
        await sender.audio(pcm(300), RATE)
        await sender.drained()
        answered = [i for i, m in enumerate(wire.messages) if m["first"] == 1]
        assert wire.times[answered[0]] - asked <= SILENCE_AHEAD_S + 0.05
        assert sender.played_ms == 300  # silence is no answer audio
        assert time.monotonic() - started < 0.5 + 0.3 + 2 * SILENCE_AHEAD_S + 0.3
        count = len(wire.messages)
        await asyncio.sleep(0.2)
        assert len(wire.messages) > count and wire.messages[-1]["first"] == 0  # on it goes
