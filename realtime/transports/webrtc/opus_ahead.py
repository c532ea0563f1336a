"""Opus coded one frame ahead, in a thread: the call's next frame is ready when it is due.

Coding a voiced 20 ms frame costs ~150-250 us of libopus. On the event loop that is the
largest share of a call's per-frame loop time (py-spy, 20 calls: 30 %), and every inbound
frame (the one that tells a barge-in) waits behind it. Handing each frame to a thread as it
falls due was worse on a loaded 2-core host (opus_out.py): the thread is often scheduled
tens of ms later, and the frame with it.

So the frame is coded a frame early. When the track hands out frame n, it asks the
playout what frame n+1 will be if nothing changes (`PlayoutBuffer.upcoming_frame()`, the
queued piece itself) and the process's coding thread codes it (coding_thread.py; PyAV
releases the GIL while libopus runs). 20 ms later, if frame n+1 is that very piece, its
packet is ready and the loop does no coding. Otherwise (the answer paused, was cleared, or
started: a few frames an answer) the spare packet is dropped and the frame is coded on the
loop as before. If the thread has not begun the job by then, the job is cancelled and the
frame coded on the loop; if it is running, its end is awaited (it is within a coding's
time of done).

A spare packet was still coded: the encoder's state has moved one frame past what the peer
decoded. The next packet, coded from that state, decodes with a small mismatch for a frame
(libopus predicts from its history), at an edge where the sound itself jumps (an answer
cut to silence, or silence to a held answer coming back); silence after it is coded as
usual, and the encoder goes quiet again as before.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib

import av
import numpy as np
import numpy.typing as npt
from av.stream import Stream

from .coding_thread import CodingThread, coding_thread
from .opus_out import OpusPacketizer


class OpusAhead:
    """The outbound track's packets: `packet()` for the frame due now, with the frame after
    it coded ahead."""

    def __init__(self, thread: CodingThread | None = None) -> None:
        self._opus = OpusPacketizer()
        self._thread = thread if thread is not None else coding_thread()
        self._ahead: tuple[npt.NDArray[np.int16], concurrent.futures.Future[bytes]] | None = None
        self.ahead_used = 0
        """Frames whose packet was coded ahead, in the thread."""
        self.ahead_dropped = 0
        """Packets coded ahead for a frame that did not come (paused, cleared, started)."""

    @property
    def encoded(self) -> int:
        return self._opus.encoded

    async def packet(
        self,
        pcm: npt.NDArray[np.int16],
        pts: int,
        silent: bool,
        upcoming: npt.NDArray[np.int16] | None,
    ) -> av.Packet[Stream]:
        """The packet for `pcm` at `pts` (`silent`: the playout's shared silence frame);
        `upcoming`: the frame expected next (None: not known), coded ahead."""
        data = await self._ready(pcm)
        packet = (
            self._opus.packet(pcm, pts, silent)
            if data is None
            else self._opus.wrap(data, pts, silent)
        )
        if upcoming is not None:
            # RuntimeError: the thread is closed (the interpreter is exiting): no job
            with contextlib.suppress(RuntimeError):
                frame = upcoming
                self._ahead = (frame, self._thread.submit(lambda: self._opus.encode(frame)))
        return packet

    async def _ready(self, pcm: npt.NDArray[np.int16]) -> bytes | None:
        """The packet coded ahead for `pcm`, or None (none, or for another frame: dropped,
        and the encoder free for the loop)."""
        if self._ahead is None:
            return None
        expected, job = self._ahead
        self._ahead = None
        if job.cancel():
            return None  # never begun: the encoder's state is untouched
        data = job.result() if job.done() else await asyncio.wrap_future(job)
        if expected is pcm:
            self.ahead_used += 1
            return data
        self.ahead_dropped += 1
        return None
