"""Server-side turn detection: webrtcvad on 20 ms frames, with hysteresis and level gating.

webrtcvad alone cannot place turn edges. It calls the first ~100 ms of a stream speech
whatever it hears, it takes a burst of noise for speech, and it holds "speech" for
100-140 ms after the voice stops (its built-in hangover), which would put every
`SpeechEnd` that late. So:

* a frame counts as speech only if the VAD says so *and* it is clearly louder than the
  background (a gate a few dB over a tracked noise floor): hangover frames are quiet, so
  they drop out and the end lands on the last real speech frame;
* a turn starts only when most of a short window of frames is speech, so clicks do not
  start one; its start is the first speech frame of that window, moved back over directly
  preceding loud frames (soft onsets such as "th" that the VAD misses), and its end
  likewise runs on over a few trailing loud frames ("ff");
* a turn ends after `silence_duration_ms` with no speech frame.

Measured on espeak-ng sentences (several voices and languages, background noise up to
about -50 dBFS) the edges land within 20 ms of the true ones; in louder noise, soft
fricatives at an edge drown and the edge moves inward by up to ~100 ms. Times are in the
caller's input timeline: `offset_ms` is where the frame starts.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import webrtcvad

from pipeline.audio_format import FRAME_MS, INPUT_FRAME_BYTES, INPUT_SAMPLE_RATE

from .config import TurnDetectionConfig

START_WINDOW = 5
"""Frames (100 ms) in the window that decides a turn has started."""
START_VOICED = 3
"""Speech frames the window needs: 60 ms of a 100 ms window, so a click never starts a turn."""
EDGE_FRAMES = 4
"""Most loud non-VAD frames a start is moved back over, or an end carried on over."""
GATE_MIN_DBFS = -56.0
"""A speech frame is at least this loud (RMS about 52 of 32768), whatever the floor."""
GATE_MARGIN_DB = 6.0
"""...and at least this much above the noise floor (steady noise wanders by about 1 dB)."""
FLOOR_RISE_DB = 0.5
"""The noise floor follows a quieter frame at once, a louder one by this much per frame..."""
FLOOR_RISE_IN_SPEECH_DB = 0.02
"""...or this much while the VAD hears a turn go on: the quiet closures inside real speech
pull the floor back down, while steady noise the VAD takes for speech cannot hold a turn
open for ever."""
FLOOR_START_MAX_DBFS = -45.0
"""The floor starts at the first frame's level, but no higher: a stream may open mid-word."""
VAD_WARMUP_FRAMES = 5
"""Frames whose VAD verdict is ignored: webrtcvad says "speech" to anything at first."""
VERDICT_WAIT_MS = 400
"""semantic_vad holds a turn's end this long past the silence window for the words' verdict
on a pause still on its way (recognition and judgement take ~250 ms after the pause): with
eagerness high (350 ms) the window ran out before any verdict came."""
UNFINISHED_FACTOR = 2
UNFINISHED_MAX_MS = 2_500
"""semantic_vad waits out a pause after words that break off this much longer (at most)."""
PAUSE_MS = 60
"""Silence after speech that is reported as a pause (at most half the silence window): the
recognition of the words so far starts there, and the answer to them (prefetch.py), while
the rest of the silence window runs; semantic_vad's turn ends when their verdict comes. It
was 160 ms, then 80: with semantic_vad the answer begun at the pause is what the user waits
for, and 60 brought its first audio 492 -> 442 ms p50 after the last voiced sample (n 30,
three runs alternated, docs/benchmarks/embedded.md); under server_vad the answer is ready
before a 500 ms window ends either way. A pause inside a sentence costs a draft recognition
that speech resuming makes moot (the request is aborted before the rest), and cuts nothing
off: only the silence window (or the verdict) ends the turn. On the spoken set (Piper's and
espeak-ng's 30 sentences) 0.1-0.2 such pauses an utterance at 60 ms, 0.07-0.1 at 80 and
0.6-1.0 at 40 (one at nearly every word's gap)."""
OVERLAP_PAUSE_MS = 160
"""The pause while speech over an answer is judged (adaptive interruption): its words are
recognised there, and a verdict on part of it misjudges it: part of an "mm-hmm" or a cough
taken for words cuts the answer, and "yeah" alone, kept, lets "yeah, but what about the
price?" play on until it is judged again. The interruption bench (12-07, one after another,
n 27 other sounds and 9 interruptions each): at 60 ms 6 of 27 cut, real interruptions cut
in 431 / 881 ms p50 / p95; at 80 1-2 of 27, 431-443 / 884-930; at 160 2 of 27, 401 / 508
(every "yeah, but" judged whole). The user is not waiting on an answer here."""


@dataclass(frozen=True, slots=True)
class SpeechStart:
    start_ms: int


@dataclass(frozen=True, slots=True)
class SpeechConfirmed:
    """Speech has lasted `min_speech_ms`: long enough to interrupt the assistant."""

    start_ms: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class SpeechPause:
    """The voice stopped `PAUSE_MS` ago: maybe the end of the turn, maybe a breath. Work
    that the end would start can begin now on the audio up to `end_ms`, and be kept if the
    turn does end there (a `SpeechEnd` with the same `end_ms`)."""

    start_ms: int
    end_ms: int


@dataclass(frozen=True, slots=True)
class SpeechResumed:
    """The voice came back after a reported pause: the turn goes on, and work begun on the
    pause (its recognition, an answer to its words) is moot."""

    at_ms: int


@dataclass(frozen=True, slots=True)
class SpeechEnd:
    start_ms: int
    end_ms: int


TurnSignal = SpeechStart | SpeechConfirmed | SpeechPause | SpeechResumed | SpeechEnd


@dataclass(frozen=True, slots=True)
class _Frame:
    offset_ms: int
    speech: bool
    loud: bool


class TurnDetector:
    """Feeds frames to webrtcvad and reports where turns start, firm up and end."""

    def __init__(
        self, config: TurnDetectionConfig, voice: Callable[[bytes], bool] | None = None
    ) -> None:
        """`voice`: another detector's verdict on each frame (silero_vad.py) in place of
        webrtcvad's; the level gate applies to either."""
        self._config = config
        self._vad = webrtcvad.Vad(config.aggressiveness)
        self._voice = voice
        self._floor_dbfs: float | None = None
        self._frames_seen = 0
        self._recent: deque[_Frame] = deque(maxlen=START_WINDOW + EDGE_FRAMES)
        self._start_ms: int | None = None
        self._last_speech_end_ms = 0
        self._tail_frames: int | None = None
        """Loud frames carried on since the last speech frame; None once the tail broke."""
        self._confirmed = False
        self._paused = False
        self._window_ms: int | None = None
        """The silence window of this pause as the words judged it (semantic_vad)."""
        self.pause_ms = PAUSE_MS
        """Silence after speech reported as a pause from the next frame on (OVERLAP_PAUSE_MS
        while speech over an answer is judged)."""
        self.level_dbfs = -math.inf
        """The last frame's level (the gate's; voice_level.py reads it, not computing it again)."""

    @property
    def in_speech(self) -> bool:
        return self._start_ms is not None

    @property
    def speech_end_ms(self) -> int | None:
        """The end of the last speech frame of the turn in progress (None outside one)."""
        return None if self._start_ms is None else self._last_speech_end_ms

    def reconfigure(self, config: TurnDetectionConfig) -> None:
        """Use `config` from the next frame on; a turn in progress carries on."""
        self._config = config
        self._vad.set_mode(config.aggressiveness)

    def reset(self) -> None:
        """Forget any turn in progress (no SpeechEnd for it); the noise floor is kept."""
        self._recent.clear()
        self._start_ms = None
        self._tail_frames = None
        self._confirmed = False
        self._paused = False
        self._window_ms = None

    def judge_pause(self, end_ms: int, finished: bool | None) -> None:
        """semantic_vad: the words up to the pause that ended at `end_ms` sound `finished`
        (the turn ends at the next silent frame), or not (the pause is waited out longer),
        or cannot be judged (None: the silence window decides). Ignored when speech went on
        since, or for server_vad."""
        if self._config.type != "semantic_vad" or not self.in_speech:
            return
        if end_ms != self._last_speech_end_ms:
            return
        base = self._config.silence_duration_ms
        if finished is None:
            self._window_ms = base
        else:
            self._window_ms = 0 if finished else min(UNFINISHED_MAX_MS, base * UNFINISHED_FACTOR)

    def process(self, frame: bytes, offset_ms: int) -> list[TurnSignal]:
        """Classify one 640-byte frame starting at `offset_ms`; return what it changed."""
        if len(frame) != INPUT_FRAME_BYTES:
            raise ValueError(
                f"a frame is {INPUT_FRAME_BYTES} bytes of 16 kHz PCM16, got {len(frame)}"
            )
        heard = (
            self._vad.is_speech(frame, INPUT_SAMPLE_RATE)
            if self._voice is None
            else self._voice(frame)
        )
        voiced = heard and self._frames_seen >= VAD_WARMUP_FRAMES
        self._frames_seen += 1
        level = self.level_dbfs = frame_level_dbfs(frame)
        rise = FLOOR_RISE_IN_SPEECH_DB if voiced and self.in_speech else FLOOR_RISE_DB
        floor = self._track_floor(level, rise)
        loud = level >= max(GATE_MIN_DBFS, floor + GATE_MARGIN_DB)
        current = _Frame(offset_ms, voiced and loud, loud)
        self._recent.append(current)
        if self._start_ms is None:
            return self._maybe_start(current)
        return self._continue(current)

    def _track_floor(self, level: float, rise: float) -> float:
        """The background level: the quietest recent frame, rising by at most `rise` a frame.

        A frame can lift the floor only by `rise` before it is judged against it, so a
        sudden loud frame is judged against the floor as it was.
        """
        floor = self._floor_dbfs
        if floor is None:
            floor = min(level, FLOOR_START_MAX_DBFS)
        elif level < floor:
            floor = level
        else:
            floor = min(level, floor + rise)
        self._floor_dbfs = floor
        return floor

    def _maybe_start(self, current: _Frame) -> list[TurnSignal]:
        recent = list(self._recent)
        window_from = max(0, len(recent) - START_WINDOW)
        if not current.speech or sum(f.speech for f in recent[window_from:]) < START_VOICED:
            return []
        first = next(i for i in range(window_from, len(recent)) if recent[i].speech)
        start = recent[first].offset_ms
        for earlier in reversed(recent[max(0, first - EDGE_FRAMES) : first]):
            if not earlier.loud or earlier.offset_ms != start - FRAME_MS:
                break
            start = earlier.offset_ms
        self._start_ms = start
        self._confirmed = False
        signals: list[TurnSignal] = [SpeechStart(start)]
        return signals + self._speech_frame(current)

    def _continue(self, current: _Frame) -> list[TurnSignal]:
        assert self._start_ms is not None
        if current.speech:
            return self._speech_frame(current)
        if current.loud and self._tail_frames is not None and self._tail_frames < EDGE_FRAMES:
            self._tail_frames += 1
            self._last_speech_end_ms = current.offset_ms + FRAME_MS
        else:
            self._tail_frames = None
        silent_ms = current.offset_ms + FRAME_MS - self._last_speech_end_ms
        window = self._config.silence_duration_ms if self._window_ms is None else self._window_ms
        if self._verdict_pending():
            window += VERDICT_WAIT_MS
        if silent_ms < window:
            pause_ms = min(self.pause_ms, self._config.silence_duration_ms // 2)
            if self._paused or silent_ms < pause_ms:
                return []
            self._paused = True
            return [SpeechPause(self._start_ms, self._last_speech_end_ms)]
        end = SpeechEnd(self._start_ms, self._last_speech_end_ms)
        self.reset()
        return [end]

    def _verdict_pending(self) -> bool:
        """semantic_vad reported a pause whose words are not judged yet."""
        return self._config.type == "semantic_vad" and self._paused and self._window_ms is None

    def _speech_frame(self, current: _Frame) -> list[TurnSignal]:
        assert self._start_ms is not None
        self._last_speech_end_ms = current.offset_ms + FRAME_MS
        self._tail_frames = 0
        signals: list[TurnSignal] = [SpeechResumed(current.offset_ms)] if self._paused else []
        self._paused = False
        self._window_ms = None
        lasted_ms = self._last_speech_end_ms - self._start_ms
        if self._confirmed or lasted_ms < self._config.min_speech_ms:
            return signals
        self._confirmed = True
        return [*signals, SpeechConfirmed(self._start_ms, self._last_speech_end_ms)]


def frame_level_dbfs(frame: bytes) -> float:
    """One PCM16 frame's RMS level in dB below full scale (-90.3 at most quiet)."""
    # A dot product, not np.mean of the squares: the same value, 1.4 us a frame, was 4.3.
    samples = np.frombuffer(frame, dtype="<i2").astype(np.float64)
    rms = math.sqrt(float(samples.dot(samples)) / len(samples))
    return 20.0 * math.log10(max(rms, 1.0) / 32768.0)
