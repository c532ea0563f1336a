import asyncio

import numpy as np

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
