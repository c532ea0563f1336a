"""The session's side of a streamed turn (sessions/streamed_turn.py): the calls go to the
pipeline in order, off the media path; the answer names the turn once its calls are sent;
a turn an answer begun ahead took is opened again when the user speaks on; a pipeline that
falls behind or fails loses the turn, which is then answered whole."""

from __future__ import annotations

import asyncio

import numpy as np

from pipeline.types import PipelineRequest
from sessions import streamed_turn
from sessions.streamed_turn import TurnStream

FRAME = np.arange(320, dtype=np.int16).tobytes()


class Calls:
    """A pipeline that takes streamed turns and notes each call; `hold` holds them back."""

    name = "calls"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.fail = False

    def streams_turns(self) -> bool:
        return True

    async def open_turn(self, turn_id: str, context: PipelineRequest) -> bool:
        await self.hold.wait()
        if self.fail:
            raise RuntimeError("no")
        self.calls.append(("open", turn_id, len(context.item_ids)))
        return True

    async def feed_turn(self, turn_id: str, pcm: np.ndarray) -> bool:
        await self.hold.wait()
        self.calls.append(("feed", turn_id, len(pcm)))
        return True

    async def drop_turn(self, turn_id: str) -> bool:
        self.calls.append(("drop", turn_id, 0))
        return True


async def read_audio(begin_ms: int, end_ms: int) -> np.ndarray:
    return np.zeros((end_ms - begin_ms) * 16, dtype=np.int16)


async def context(item_id: str) -> PipelineRequest:
    return PipelineRequest("r", np.zeros(0, dtype=np.int16), item_ids=("a", item_id))


def make(calls: Calls) -> TurnStream:
    return TurnStream("s", calls, read_audio, context)  # type: ignore[arg-type]


async def test_the_turn_goes_in_order_and_its_answer_names_it() -> None:
    calls = Calls()
    stream = make(calls)
    try:
        stream.open("item1", begin_ms=700, next_frame_ms=1000)  # 300 ms of padding and speech
        for i in range(25):
            stream.heard(FRAME, 1000 + 20 * i)
        turn = await stream.take("item1")
        assert turn and await stream.take("item1") == ""  # taken once
        assert calls.calls == [
            ("open", turn, 2),
            ("feed", turn, 4800),  # the audio before the first frame heard
            ("feed", turn, 3200),
            ("feed", turn, 3200),  # the last 100 ms went with nothing: the answer has them
        ]
        assert await stream.take("other") == ""
    finally:
        await stream.close()


async def test_a_turn_an_answer_begun_ahead_took_opens_again_on_more_speech() -> None:
    calls = Calls()
    stream = make(calls)
    try:
        stream.open("item1", begin_ms=0, next_frame_ms=0)
        first = await stream.take("item1", ahead=True)
        stream.resumed(next_frame_ms=2000)
        for i in range(10):
            stream.heard(FRAME, 2000 + 20 * i)
        second = await stream.take("item1")
        assert first and second and first != second
        assert calls.calls[-3:] == [
            ("open", second, 2),
            ("feed", second, 32_000),  # its audio from the beginning
            ("feed", second, 3200),
        ]
        stream.resumed(next_frame_ms=3000)  # taken by the answer itself: nothing reopens
        stream.open("item2", 3000, 3000)
        stream.drop()
        assert await stream.take("item2") == ""
        await asyncio.sleep(0.01)
        assert calls.calls[-1][0] == "drop"
    finally:
        await stream.close()


async def test_a_pipeline_that_falls_behind_or_fails_loses_the_turn() -> None:
    calls = Calls()
    stream = make(calls)
    try:
        calls.hold.clear()  # the pipeline does not keep up
        stream.open("item1", 0, 0)
        for i in range(10 * (streamed_turn.MAX_CALLS + 5)):
            stream.heard(FRAME, 20 * i)
        assert stream.open_item is None  # let go
        calls.hold.set()
        assert await stream.take("item1") == ""
        calls.fail = True
        stream.open("item2", 0, 0)
        await asyncio.sleep(0.01)
        assert await stream.take("item2") == ""  # its open failed: answered whole
    finally:
        await stream.close()
