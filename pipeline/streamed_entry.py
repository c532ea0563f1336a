"""A pipeline's streamed turns, passed on to its entry stage's engine.

A session streams a spoken turn while the user speaks (`types.StreamingInput`) to its
pipeline, which is a graph: the turn belongs to the stage that takes the request, the entry
stage. A graph whose one entry stage's engine takes streamed turns (the Qwen3-Omni Thinker,
in this process or behind a worker's or stage host's link) passes each call on; any other
(the cascade, the echo and fake pipelines, a graph of several entry stages) answers False,
and the session takes its turns whole, exactly as before.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .types import PipelineRequest, StreamingInput, streams_input


class PassesStreamedTurns:
    """`types.StreamsTurns` for a pipeline that names its engine in `_turn_engine`."""

    def _turn_engine(self) -> StreamingInput | None:
        """The engine streamed turns go to now, or None."""
        raise NotImplementedError

    def streams_turns(self) -> bool:
        return self._turn_engine() is not None

    async def open_turn(self, turn_id: str, context: PipelineRequest) -> bool:
        engine = self._turn_engine()
        if engine is None:
            return False
        await engine.open_turn(turn_id, context)
        return True

    async def feed_turn(self, turn_id: str, pcm: npt.NDArray[np.int16]) -> bool:
        engine = self._turn_engine()
        if engine is None:
            return False
        await engine.feed_turn(turn_id, pcm)
        return True

    async def drop_turn(self, turn_id: str) -> bool:
        engine = self._turn_engine()
        if engine is None:
            return False
        await engine.drop_turn(turn_id)
        return True


def turn_engine(engine: object) -> StreamingInput | None:
    """`engine` if it takes streamed turns now, else None."""
    return engine if streams_input(engine) and isinstance(engine, StreamingInput) else None
