"""The outbound track codes each voiced frame a frame ahead in a thread: what the peer
decodes is the answer, a pause drops the spare packet and loses no audio, and a thread that
has not begun a frame's job when the frame is due leaves it to the loop."""

from __future__ import annotations

import asyncio
import functools
import threading

import av
import numpy as np
import pytest

from realtime.transports.webrtc.coding_thread import CodingThread
from realtime.transports.webrtc.opus_ahead import OpusAhead
from realtime.transports.webrtc.opus_out import FRAME_SAMPLES
from realtime.transports.webrtc.outbound import OUTPUT_RATE, OutboundAudioTrack
from sessions.playout import PlayoutBuffer
from tests.realtime.webrtc.test_opus_out import decode, tone


def matches(sent: np.ndarray, heard: np.ndarray) -> float:
    """The correlation of `sent` with `heard` lined up past the codec's look-ahead."""
    sent = sent.astype(np.float64)
    heard = heard.astype(np.float64)
    n = len(sent) - 2 * FRAME_SAMPLES
    best = max(range(0, 700), key=lambda lag: float(np.dot(sent[:n], heard[lag : lag + n])))
    return float(np.corrcoef(sent[:n], heard[best : best + n])[0, 1])


async def sent(track: OutboundAudioTrack) -> bytes:
    packet = await track.recv()
    assert isinstance(packet, av.Packet)
    return bytes(packet)


async def test_frames_coded_ahead_decode_to_the_answer() -> None:
    playout = PlayoutBuffer(OUTPUT_RATE)
    track = OutboundAudioTrack(playout)
    track.encode_opus()
    answer = tone(20)
    try:
        await playout.write(answer, OUTPUT_RATE)
        packets = [await sent(track) for _ in range(24)]
    finally:
        track.stop()
    opus = track._opus
    assert opus is not None
    assert opus.ahead_used >= 17  # all but the first frame (and any the thread was late for)
    assert opus.ahead_dropped == 0
    assert matches(answer, decode(packets)) > 0.99


async def test_a_pause_drops_the_spare_packet_and_the_answer_goes_on_whole() -> None:
    playout = PlayoutBuffer(OUTPUT_RATE)
    track = OutboundAudioTrack(playout)
    track.encode_opus()
    answer = tone(20, hz=300.0)
    try:
        await playout.write(answer, OUTPUT_RATE)
        packets = [await sent(track) for _ in range(8)]
        playout.pause()  # speech over the answer: the frame coded ahead does not come
        packets += [await sent(track) for _ in range(5)]
        playout.resume()  # a backchannel: the answer goes on where it was held
        packets += [await sent(track) for _ in range(14)]
    finally:
        track.stop()
    opus = track._opus
    assert opus is not None and opus.ahead_dropped == 1
    assert playout.played_ms == 20 * 20  # every frame of the answer played
    heard = decode(packets)
    before, after = heard[: 9 * FRAME_SAMPLES], heard[13 * FRAME_SAMPLES :]
    assert matches(answer[: 8 * FRAME_SAMPLES], before) > 0.99
    assert matches(answer[8 * FRAME_SAMPLES :], after) > 0.98


async def test_a_job_the_thread_has_not_begun_is_coded_on_the_loop() -> None:
    busy = threading.Event()
    thread = CodingThread("test-coding")
    try:
        thread.submit(lambda: busy.wait(10))  # the thread is taken: jobs wait behind it
        opus = OpusAhead(thread)
        frames = tone(3)
        first, second = frames[:FRAME_SAMPLES], frames[FRAME_SAMPLES : 2 * FRAME_SAMPLES]
        await opus.packet(first, 0, False, upcoming=second)
        await asyncio.sleep(0.05)
        packet = await opus.packet(second, FRAME_SAMPLES, False, upcoming=None)
    finally:
        busy.set()
        thread.close()
    assert opus.ahead_used == 0 and opus.ahead_dropped == 0  # cancelled before it began
    assert opus.encoded == 2 and len(bytes(packet)) > 3
    assert isinstance(packet, av.Packet) and packet.pts == FRAME_SAMPLES


def test_the_coding_thread_runs_jobs_in_order_sleeps_when_idle_and_closes_once() -> None:
    thread = CodingThread("test-coding")
    try:
        jobs = [thread.submit(functools.partial(pow, n, 2)) for n in range(50)]
        assert [job.result(timeout=5) for job in jobs] == [n * n for n in range(50)]
        failed = thread.submit(lambda: 1 // 0)
        with pytest.raises(ZeroDivisionError):
            failed.result(timeout=5)
    finally:
        thread.close()
        thread.close()
    assert not thread._thread.is_alive()
    with pytest.raises(RuntimeError):
        thread.submit(lambda: 1)


def test_the_upcoming_frame_is_a_whole_queued_piece_only() -> None:
    playout = PlayoutBuffer(OUTPUT_RATE)
    assert playout.upcoming_frame() is None  # idle
    playout._add(tone(1)[: FRAME_SAMPLES // 2], OUTPUT_RATE)
    assert playout.upcoming_frame() is None  # a short piece: it may yet be topped up
    playout._add(tone(2), OUTPUT_RATE)
    upcoming = playout.upcoming_frame()
    assert upcoming is not None and upcoming is playout.next_frame()
    playout.pause()
    assert playout.upcoming_frame() is None
