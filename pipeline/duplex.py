"""What a full-duplex model offers the session layer, and how to find one in a pipeline.

A turn-based pipeline answers requests (`Pipeline.generate`); a duplex model instead holds
a stream per session for as long as the session lives: the microphone goes in continuously
and the model's voice comes out continuously, the model alone deciding when to speak. A
graph serves one through a stage whose engine has a `duplex` attribute of this shape
(pipeline/engines/moshi/duplex_stage.py); transports that can carry a duplex conversation
ask `duplex_model(pipeline)` and, when there is one, open a stream for each session instead
of running turns.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

DUPLEX_RATE = 24_000
"""The sample rate of a duplex stream, both ways."""


class DuplexFull(Exception):
    """The model holds all the sessions it can: try again later."""


class DuplexDown(DuplexFull):
    """The model cannot serve now (its frame clock died or stalled): a new session is
    refused with the reason, as a full model refuses one, until it is healthy again."""


class DuplexFailed(Exception):
    """Raised by a stream's `frames()`: the model failed under the session (its clock died
    or stalled, or the session's own input or row failed), so the stream has ended. The
    session ends with `model_error`, its client told why."""


class DuplexFrame(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def pcm(self) -> npt.NDArray[np.int16]:
        """80 ms of the model's voice at DUPLEX_RATE."""


class DuplexStream(Protocol):
    def feed(self, pcm: npt.NDArray[np.int16]) -> None:
        """Microphone audio at DUPLEX_RATE, any length."""

    def frames(self) -> AsyncIterator[DuplexFrame]:
        """The model's voice (DuplexFrame), frame by frame, until the stream ends;
        DuplexFailed when it ended because the model failed under it."""


class DuplexModel(Protocol):
    def open(self, session_id: str) -> DuplexStream:
        """A stream for the session; DuplexFull when the model holds all it can (DuplexDown
        when it cannot serve now)."""

    def leave(self, session_id: str) -> None:
        """The session's stream ends and its place is freed (idempotent)."""


def duplex_model(pipeline: Any) -> DuplexModel | None:
    """The duplex model a pipeline (a StageGraph) serves, if one of its stages is one."""
    for engine in getattr(pipeline, "engines", {}).values():
        model = getattr(engine, "duplex", None)
        if model is not None:
            return model  # type: ignore[no-any-return]
    return None
