"""The client's audio since its last question: bounded, the oldest audio goes first.

A video chat client streams audio (the video's sound, or the user talking) and now and then
asks a question about what it sent. The window holds the audio since the last question,
up to `max_bytes`; past that the oldest audio is dropped and counted, never the whole
buffer. It hands out whole 20 ms frames only and keeps the partial frame at the end for
later, so what it holds is exactly what the session was given.
"""

from __future__ import annotations

from pipeline.audio_format import INPUT_FRAME_BYTES as FRAME_BYTES
from pipeline.audio_format import INPUT_SAMPLE_RATE, SAMPLE_BYTES

BYTES_PER_MS = INPUT_SAMPLE_RATE * SAMPLE_BYTES // 1000


def ms_of(nbytes: int) -> int:
    """Milliseconds of 16 kHz mono PCM16 in `nbytes`."""
    return nbytes // BYTES_PER_MS


class AudioWindow:
    def __init__(self, max_bytes: int) -> None:
        if max_bytes < FRAME_BYTES:
            raise ValueError(f"the window must hold at least one frame ({FRAME_BYTES} bytes)")
        self.max_bytes = max_bytes - max_bytes % FRAME_BYTES
        self._frames = bytearray()
        self._partial = b""
        self.dropped_bytes = 0
        """Audio dropped since the last `take()`."""

    def __len__(self) -> int:
        return len(self._frames)

    def add(self, pcm: bytes) -> tuple[bytes, int]:
        """Take in PCM16 (an even number of bytes); returns the whole frames to pass on to
        the session (at most `max_bytes` of them) and how many old bytes were dropped."""
        if len(pcm) % 2:
            raise ValueError("PCM16 audio has an even number of bytes")
        data = self._partial + pcm
        whole = len(data) - len(data) % FRAME_BYTES
        frames, self._partial = data[:whole], data[whole:]
        dropped = max(0, len(self._frames) + whole - self.max_bytes)
        if whole >= self.max_bytes:  # this piece alone fills the window
            frames = frames[whole - self.max_bytes :]
            self._frames = bytearray(frames)
        else:
            self._frames += frames
            del self._frames[:dropped]
        self.dropped_bytes += dropped
        return frames, dropped

    def take(self) -> tuple[bytes, int]:
        """The audio since the last take (whole frames) and how much of it was dropped;
        the window starts empty again (but for a partial frame still to be completed)."""
        frames, dropped = bytes(self._frames), self.dropped_bytes
        self._frames = bytearray()
        self.dropped_bytes = 0
        return frames, dropped
