"""The playout engine: the same cursor, clear, pause, drain and close rules whether a media
clock pulls frames or a paced sender takes pieces; output resampled as one stream."""

import asyncio

import numpy as np
import numpy.typing as npt
import pytest
import soxr

from sessions.playout import PlayoutBuffer


async def test_frames_cursor_clear_and_backpressure() -> None:
    buf = PlayoutBuffer(sample_rate=24_000, max_ms=100)
    tone = np.full(24_000 // 10, 1000, dtype=np.int16)  # 100 ms fills it
    await buf.write(tone, 24_000)
    blocked = asyncio.create_task(buf.write(tone, 24_000))
    await asyncio.sleep(0.02)
    assert not blocked.done()  # full: the writer waits for playback
    assert np.all(buf.next_frame() == 1000)
    assert buf.played_ms == 20
    await asyncio.sleep(0)
    buf.clear()
    await asyncio.wait_for(blocked, 1)
    buf.clear()
    assert buf.next_frame() is buf.silence  # cleared: silence at the very next frame
    assert buf.played_ms == 20  # the cursor counts only what played
    await asyncio.wait_for(buf.drained(), 1)


async def test_resamples_other_rates_and_plays_a_partial_tail() -> None:
    buf = PlayoutBuffer(sample_rate=24_000)
    await buf.write(np.ones(16_000 // 10 + 80, dtype=np.int16), 16_000)  # 105 ms at 16 kHz
    frames = 0
    while buf.next_frame() is not buf.silence:
        frames += 1
    assert frames == 6  # five whole frames and the padded tail
    assert buf.played_ms == 120


# --- one engine, one set of rules, whichever way it is played ---------------------------------


def sine(rate: int, seconds: float, hz: float = 330.0) -> npt.NDArray[np.int16]:
    t = np.arange(round(rate * seconds)) / rate
    pcm: npt.NDArray[np.int16] = np.rint(12_000 * np.sin(2 * np.pi * hz * t)).astype(np.int16)
    return pcm


def play_all(buf: PlayoutBuffer, clocked: bool) -> npt.NDArray[np.int16]:
    """Everything queued, as a media clock (frames) or a paced sender (pieces) plays it."""
    out = []
    while True:
        if clocked:
            frame = buf.next_frame()
            if frame is buf.silence:
                break
            out.append(frame)
        else:
            piece = buf.take()
            if piece is None:
                break
            out.append(piece.pcm)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int16)


async def test_chunked_output_resamples_as_one_stream() -> None:
    """24 kHz chunks played at 48 kHz: no trace of the chunk boundaries."""
    speech = sine(24_000, 1.0)
    buf = PlayoutBuffer(sample_rate=48_000, max_ms=5_000)
    for start in range(0, len(speech), 1_111):  # odd chunks, as a vocoder's never align
        await buf.write(speech[start : start + 1_111], 24_000)
    ended = asyncio.create_task(buf.drained())  # the end of the response: its tail queued
    await asyncio.sleep(0)
    played = play_all(buf, clocked=True)
    await asyncio.wait_for(ended, 1)
    whole = soxr.resample(speech, 24_000, 48_000)
    assert len(played) == -(-len(whole) // buf.frame_samples) * buf.frame_samples
    assert np.abs(played[: len(whole)].astype(np.int32) - whole).max() <= 2
    assert not played[len(whole) :].any()  # the last frame padded with silence
    assert buf.played_ms == 1_000


@pytest.mark.parametrize("clocked", [True, False], ids=["frames", "pieces"])
async def test_clear_drops_the_rest_of_an_interrupted_write(clocked: bool) -> None:
    buf = PlayoutBuffer(sample_rate=24_000 if clocked else None, max_ms=100)
    writer = asyncio.create_task(buf.write(sine(24_000, 1.0), 24_000))
    await asyncio.sleep(0.01)
    assert not writer.done() and buf.queued_ms == 100
    if clocked:  # room for one more piece...
        buf.next_frame()
    else:
        buf.take()
    buf.clear()  # ...but the answer is cut off before the writer gets to it
    await asyncio.wait_for(writer, 1)  # released, and it queued nothing more
    assert buf.queued_ms == 0 and buf.queued_pieces == 0
    assert buf.played_ms == 20
    await asyncio.wait_for(buf.drained(), 1)


@pytest.mark.parametrize("clocked", [True, False], ids=["frames", "pieces"])
async def test_pause_holds_the_queue_and_the_cursor(clocked: bool) -> None:
    buf = PlayoutBuffer(sample_rate=24_000 if clocked else None, piece_ms=20)
    await buf.write(sine(24_000, 0.1), 24_000)
    buf.pause()
    if clocked:
        assert buf.next_frame() is buf.silence
    else:
        assert buf.take() is None
    assert buf.queued_ms == 100 and buf.played_ms == 0
    drained = asyncio.create_task(buf.drained())
    await asyncio.sleep(0.01)
    assert not drained.done()  # paused audio is not played
    buf.resume()
    assert len(play_all(buf, clocked)) == 2_400
    await asyncio.wait_for(drained, 1)
    assert buf.played_ms == 100


@pytest.mark.parametrize("clocked", [True, False], ids=["frames", "pieces"])
async def test_close_drops_writes_and_releases_a_waiting_one(clocked: bool) -> None:
    buf = PlayoutBuffer(sample_rate=24_000 if clocked else None, max_ms=40)
    writer = asyncio.create_task(buf.write(sine(24_000, 1.0), 24_000))
    await asyncio.sleep(0.01)
    buf.close()
    await asyncio.wait_for(writer, 1)
    await buf.write(sine(24_000, 0.1), 24_000)
    assert buf.queued_ms == 40
    buf.close()  # idempotent


async def test_pieces_coalesce_until_sealed_and_keep_their_rate() -> None:
    buf = PlayoutBuffer(sample_rate=None, piece_ms=100)
    await buf.write(sine(24_000, 0.03), 24_000)
    await buf.write(sine(24_000, 0.03), 24_000)  # tops up the short piece
    buf.seal()  # something follows it: the next write starts a new piece
    await buf.write(sine(16_000, 0.03), 16_000)
    pieces = [buf.take(), buf.take()]
    assert [(len(p.pcm), p.rate) for p in pieces if p] == [(1_440, 24_000), (480, 16_000)]
    assert buf.pieces_added == buf.pieces_removed == 2
    assert buf.played_ms == 90


async def test_a_refused_piece_is_dropped_and_drop_oldest_frees_room() -> None:
    refuse = False
    buf = PlayoutBuffer(sample_rate=None, piece_ms=100, admit=lambda: not refuse)
    await buf.write(sine(24_000, 0.2), 24_000)
    refuse = True
    await buf.write(sine(24_000, 0.1), 24_000)
    assert buf.queued_pieces == 2
    assert buf.drop_oldest() and buf.queued_pieces == 1 and buf.played_ms == 0
    assert buf.drop_oldest() and not buf.drop_oldest()
    await asyncio.wait_for(buf.drained(), 1)
