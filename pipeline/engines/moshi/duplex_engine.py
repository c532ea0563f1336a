"""Moshi as a service: one frame clock for every live session, listening and speaking at once.

A turn-based engine answers a request; a duplex model never stops. Each session opens a
`DuplexSession`: it feeds the microphone in (any length of 24 kHz PCM16, cut into 80 ms
frames in a bounded inbox) and reads the model's voice out, a frame every 80 ms (silence
included, with the text token the model wrote for it). One clock task owns the model: every
80 ms it takes each session's oldest unheard frame (silence when the microphone has sent
nothing: the model hears a pause), runs the codec and the frame step for all sessions at
once on its model thread, and hands each session its frame. Sessions join and leave between
frames.

With a tokenizer (the checkpoint's, or the toy model's: text_stream.py) each frame also
carries the words its text token adds to the model's transcript.

A frame whose work ends past its time is late: it is still produced (a duplex model that
skipped frames would lose its place in the conversation), the clock moves on from when it
ended, and `stats` counts it and the worst lateness. A session that reads its voice too
slowly loses the oldest frames of its outbox, counted, rather than holding the clock back.

The model hears one microphone frame a tick, and a microphone sends one frame every 80 ms,
so frames that piled up once (a late frame, a client that sent a burst) would wait in the
inbox for the rest of the call: the model would hear the user that much later, for ever.
Each session watches its inbox as a jitter buffer does: when frames have been waiting at
every tick for a second (a standing queue, not a burst that drains), it drops the quietest
of the waiting frames down to one, counted in `stats.skipped_in`. A burst that drains on
its own (a client sending 200 ms or 1 s chunks in real time) is never cut.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ...memory_plan import MemoryPlan, rows_setting
from ...tasks import TaskSet
from ..gpu_memory import MemoryQuery, SizingSettings
from .frame_step import FrameStepper, RowsFull, Sampling
from .memory import plan_rows
from .mimi_frames import FRAME_SAMPLES, MimiFrames
from .text_stream import TextPieces, load_text_tokenizer, skipped_ids

FRAME_S = 0.08
INBOX_FRAMES = 25
"""Microphone frames a session may have waiting (2 s); past this the oldest are dropped."""
OUTBOX_FRAMES = 50
"""Voice frames waiting for a slow reader (4 s); past this the oldest are dropped."""
STANDING_TICKS = 12
"""Ticks (~1 s) an inbox must never have drained to one frame before it is cut back."""
RECENT_STEPS = 2048
"""Per-step timings the engine keeps (`DuplexStats.recent`), for benchmarks and metrics."""

Pcm = npt.NDArray[np.int16]


@dataclass(frozen=True, slots=True)
class VoiceFrame:
    index: int
    """The session's frame number, from 0, without gaps."""
    pcm: Pcm
    """1,920 samples at 24 kHz (silence before the model's first whole frame)."""
    text: int
    """The text token the model wrote with this frame."""
    words: str = ""
    """What that token adds to the model's transcript ("" for padding, or no tokenizer)."""
    heard: int = 0
    """Microphone frames the model had taken when it made this frame, heard or cut from a
    standing queue (its latency as a client hears it: loadtest/duplex_latency.py)."""


@dataclass(frozen=True, slots=True)
class StepTimes:
    """One tick's work, in ms: what a late frame spent its time on."""

    at: float
    """When the tick's work began (the engine's clock)."""
    sessions: int
    rows: float
    """Joins and leaves applied before the frame."""
    encode: float
    step: float
    decode: float
    total: float
    """The tick's whole work as the clock saw it (the model thread's queue included)."""


@dataclass
class DuplexStats:
    steps: int = 0
    late_steps: int = 0
    worst_late_ms: float = 0.0
    unheard_frames: int = 0
    """Frames a session's microphone had not supplied in time (heard as silence)."""
    dropped_in: int = 0
    skipped_in: int = 0
    """Microphone frames dropped from a standing queue so the model hears the user live."""
    dropped_out: int = 0
    recent: collections.deque[StepTimes] = field(
        default_factory=lambda: collections.deque(maxlen=RECENT_STEPS)
    )

    @property
    def step_ms_last(self) -> float:
        """The last tick's whole work in ms (0 before the first)."""
        return self.recent[-1].total if self.recent else 0.0


class SessionClosed(Exception):
    """The session (or the engine) has closed: no more voice frames."""


@dataclass
class DuplexSession:
    session_id: str
    stats: DuplexStats
    _inbox: collections.deque[Pcm] = field(default_factory=lambda: collections.deque())
    _partial: Pcm = field(default_factory=lambda: np.zeros(0, np.int16))
    _outbox: collections.deque[VoiceFrame] = field(default_factory=collections.deque)
    _ready: asyncio.Event = field(default_factory=asyncio.Event)
    _depths: collections.deque[int] = field(
        default_factory=lambda: collections.deque(maxlen=STANDING_TICKS)
    )
    """The inbox's depth at each of the last ticks, before the tick took its frame."""
    closed: bool = False
    frames_out: int = 0
    frames_heard: int = 0

    def feed(self, pcm: Pcm) -> None:
        """Microphone audio (24 kHz PCM16, any length) for the frames to come."""
        joined = np.concatenate([self._partial, np.asarray(pcm, np.int16)])
        whole = len(joined) // FRAME_SAMPLES * FRAME_SAMPLES
        for start in range(0, whole, FRAME_SAMPLES):
            if len(self._inbox) >= INBOX_FRAMES:
                self._inbox.popleft()
                self.stats.dropped_in += 1
            self._inbox.append(joined[start : start + FRAME_SAMPLES])
        self._partial = joined[whole:]

    def next_heard(self) -> Pcm:
        """The frame the model hears this tick (silence when none came in time)."""
        self._depths.append(len(self._inbox))
        standing = min(self._depths) if len(self._depths) == STANDING_TICKS else 0
        if standing > 1:
            self._cut_standing_queue(standing - 1)
        if self._inbox:
            self.frames_heard += 1
            return self._inbox.popleft()
        self.stats.unheard_frames += 1
        return np.zeros(FRAME_SAMPLES, np.int16)

    def _cut_standing_queue(self, excess: int) -> None:
        """Drop the `excess` quietest waiting frames (speech is kept before silence)."""
        loudness = [float(np.abs(frame.astype(np.int32)).mean()) for frame in self._inbox]
        quietest = set(sorted(range(len(loudness)), key=loudness.__getitem__)[:excess])
        kept = [frame for k, frame in enumerate(self._inbox) if k not in quietest]
        self._inbox.clear()
        self._inbox.extend(kept)
        self.stats.skipped_in += excess
        self.frames_heard += excess  # passed over: the microphone's stream moved on
        self._depths.clear()

    def deliver(self, frame: VoiceFrame) -> None:
        if len(self._outbox) >= OUTBOX_FRAMES:
            self._outbox.popleft()
            self.stats.dropped_out += 1
        self._outbox.append(frame)
        self._ready.set()

    def end(self) -> None:
        self.closed = True
        self._ready.set()

    async def frames(self) -> AsyncIterator[VoiceFrame]:
        """The model's voice, frame by frame, until the session closes."""
        while True:
            while self._outbox:
                yield self._outbox.popleft()
            if self.closed:
                return
            self._ready.clear()
            await self._ready.wait()


class MoshiDuplexEngine:
    """Owns the model, its thread and the clock. `start` loads and captures; `open` /
    `leave` add and remove sessions; `close` (idempotent) ends every session and the clock."""

    def __init__(
        self,
        *,
        tiny: bool = False,
        device: str = "cpu",
        dtype: str = "float32",
        model_path: str | None = None,
        rows: int | str = 8,
        codec_context: int = 4,
        sampling: Sampling | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_rows: int = 64,
        gpu_memory_utilization: float = 0.9,
        memory_query: MemoryQuery | None = None,
    ) -> None:
        self.options = dict(tiny=tiny, device=device, dtype=dtype, model_path=model_path)
        # --- sizing to the card (moshi/memory.py) ---
        self.rows_asked = rows_setting(rows, "rows")
        """An integer (a demand, refused at start if it does not fit) or `auto`."""
        self.sizing = SizingSettings.of(
            max_rows=max_rows,
            gpu_memory_utilization=gpu_memory_utilization,
            memory_query=memory_query,
        )
        self.memory_plan: MemoryPlan | None = None
        self.rows = self.rows_asked if isinstance(self.rows_asked, int) else max_rows
        """The sessions this engine holds at once (`auto`: `max_rows` until start sizes it on
        a GPU)."""
        self.codec_context = codec_context
        self.sampling = sampling or Sampling()
        self.clock = clock
        self.stats = DuplexStats()
        self._sessions: dict[str, DuplexSession] = {}
        self._joining: list[str] = []
        self._leaving: list[str] = []
        """Rows change between frames only, on the clock's side: never under a running step."""
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="moshi")
        self._stepper: FrameStepper | None = None
        self._codec: MimiFrames | None = None
        self._tokenizer: Any | None = None
        self._pieces: dict[str, TextPieces] = {}
        """Per session, on the model's thread: its text tokens so far, as words."""
        self._tasks = TaskSet("moshi")
        """Owns the clock task (`_ticker`); `close()` closes it."""
        self._ticker: asyncio.Task[None] | None = None
        self._closed = False
        self._rows_ms = 0.0
        self._phases = (0.0, 0.0, 0.0)
        """The last frame's joins and leaves; its encode, step and decode (ms, model thread)."""

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self._load)
        self._ticker = self._tasks.create_task(self._tick(), name="moshi:clock")

    def _load(self) -> None:
        import torch

        from .weights import load_moshi

        dtype = getattr(torch, str(self.options["dtype"]))
        model: Any = load_moshi(
            tiny=bool(self.options["tiny"]),
            device=str(self.options["device"]),
            dtype=dtype,
            model_path=self.options["model_path"],  # type: ignore[arg-type]
        )
        figures = self.sizing.figures(str(self.options["device"]))
        if figures is not None:  # sizing: the rows from the card
            self.memory_plan = plan_rows(
                config=model.config,
                dtype=dtype,
                device=str(self.options["device"]),
                figures=figures,
                settings=self.sizing,
                rows=self.rows_asked,
            )
            self.rows = self.memory_plan.rows
        self._stepper = FrameStepper(model, rows=self.rows, sampling=self.sampling)
        self._stepper.warm()
        self._codec = MimiFrames(
            model.audio_encoder,
            codebooks=self._stepper.codebooks,
            context=self.codec_context,
            largest=self.rows,
        )
        self._codec.warm()
        self._tokenizer = load_text_tokenizer(
            tiny=bool(self.options["tiny"]),
            vocab_size=int(model.config.vocab_size),
            model_path=self.options["model_path"],  # type: ignore[arg-type]
        )

    def open(self, session_id: str) -> DuplexSession:
        """A session from the next frame on; RowsFull when the model holds all it can."""
        if self._closed or self._ticker is None:
            raise SessionClosed("the duplex engine is not running")
        if session_id in self._sessions:
            return self._sessions[session_id]
        if len(self._sessions) >= self.rows:
            raise RowsFull(f"all {self.rows} duplex sessions this model holds are in use")
        session = DuplexSession(session_id, self.stats)
        self._sessions[session_id] = session
        self._joining.append(session_id)
        return session

    def leave(self, session_id: str) -> None:
        """The session ends: its row and codec state are freed (idempotent)."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        session.end()
        if session_id in self._joining:
            self._joining.remove(session_id)
        else:
            self._leaving.append(session_id)

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._tasks.close()
        for session_id in list(self._sessions):
            self.leave(session_id)
        await asyncio.to_thread(self._thread.shutdown, True)  # a frame in flight ends first
        self._apply_rows()

    def _row_changes(self) -> tuple[list[str], list[str]]:
        """The leaves and joins asked for since the last frame (taken on the loop)."""
        leaving, self._leaving = self._leaving, []
        joining, self._joining = self._joining, []
        return leaving, joining

    def _apply_rows(self, changes: tuple[list[str], list[str]] | None = None) -> None:
        """The joins and leaves asked for since the last frame (on the model's thread: a
        leave may move a session's cache rows)."""
        leaving, joining = changes if changes is not None else self._row_changes()
        for session_id in leaving:
            self._pieces.pop(session_id, None)
            if self._stepper is not None:
                self._stepper.leave(session_id)
            if self._codec is not None:
                self._codec.forget(session_id)
        for session_id in joining:
            if self._stepper is not None:
                self._stepper.join(session_id)

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        due = self.clock() + FRAME_S
        while True:
            await asyncio.sleep(max(0.0, due - self.clock()))
            changes = self._row_changes()
            live = list(self._sessions.values())
            heard = {s.session_id: s.next_heard() for s in live}
            began = self.clock()
            spoken = await loop.run_in_executor(self._thread, self._rows_and_frame, changes, heard)
            ended = self.clock()
            self.stats.steps += 1
            encode_ms, step_ms, decode_ms = self._phases
            total_ms = (ended - began) * 1000
            self.stats.recent.append(
                StepTimes(began, len(live), self._rows_ms, encode_ms, step_ms, decode_ms, total_ms)
            )
            late_ms = (ended - due) * 1000 - FRAME_S * 1000
            if late_ms > 0:  # the frame's work ended after the next frame was due
                self.stats.late_steps += 1
                self.stats.worst_late_ms = max(self.stats.worst_late_ms, late_ms)
                due = ended
            for session in live:
                if session.session_id in spoken and not session.closed:
                    pcm, text, words = spoken[session.session_id]
                    frame = VoiceFrame(session.frames_out, pcm, text, words, session.frames_heard)
                    session.deliver(frame)
                    session.frames_out += 1
            due += FRAME_S

    def _rows_and_frame(
        self, changes: tuple[list[str], list[str]], heard: dict[str, Pcm]
    ) -> dict[str, tuple[Pcm, int, str]]:
        began = time.perf_counter()
        self._apply_rows(changes)
        self._rows_ms = (time.perf_counter() - began) * 1000
        self._phases = (0.0, 0.0, 0.0)
        spoken = self._frame(heard) if heard else {}
        return {s: (pcm, text, self._words(s, text)) for s, (pcm, text) in spoken.items()}

    def _words(self, session_id: str, token: int) -> str:
        if self._tokenizer is None:
            return ""
        pieces = self._pieces.get(session_id)
        if pieces is None:
            pieces = TextPieces(self._tokenizer, skipped_ids(self._tokenizer))
            self._pieces[session_id] = pieces
        return pieces.push(token)

    def _frame(self, heard: dict[str, Pcm]) -> dict[str, tuple[Pcm, int]]:
        """On the model thread: the codec in, the frame step, the codec out (each timed:
        the results are read back to the host, so each phase has ended when it is timed)."""
        assert self._stepper is not None and self._codec is not None
        t0 = time.perf_counter()
        codes = self._codec.encode(heard)
        t1 = time.perf_counter()
        out = self._stepper.step(codes)
        voice = {s: o.codes for s, o in out.items() if o.codes is not None}
        t2 = time.perf_counter()
        audio = self._codec.decode(voice)
        t3 = time.perf_counter()
        self._phases = ((t1 - t0) * 1000, (t2 - t1) * 1000, (t3 - t2) * 1000)
        silence = np.zeros(FRAME_SAMPLES, np.int16)
        return {s: (audio.get(s, silence), o.text) for s, o in out.items()}


__all__ = [
    "DuplexSession",
    "MoshiDuplexEngine",
    "RowsFull",
    "SessionClosed",
    "StepTimes",
    "VoiceFrame",
]
