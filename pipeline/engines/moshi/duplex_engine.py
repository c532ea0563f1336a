"""Moshi as a service: one frame clock for every live session, listening and speaking at once.

A turn-based engine answers a request; a duplex model never stops. Each session opens a
`DuplexSession` (duplex_session.py): it feeds the microphone in (any length of 24 kHz
PCM16, cut into 80 ms frames in a bounded inbox) and reads the model's voice out, a frame
every 80 ms (silence included, with the text token the model wrote for it). One clock owns
the model, and it runs on the model's own thread, never on the server's event loop (where
every transport runs): every 80 ms it takes each session's oldest unheard frame (silence
when the microphone has sent nothing: the model hears a pause), runs the codec and the
frame step for all sessions at once, puts each session's frame in its outbox and wakes the
readers on the loop with one `call_soon_threadsafe`. Sessions join and leave between
frames; the loop only records the joins and leaves (under a lock the clock holds for a few
list operations), so it never waits on a frame.

With a tokenizer (the checkpoint's, or the toy model's: text_stream.py) each frame also
carries the words its text token adds to the model's transcript.

A frame whose work ends past its time is late: it is still produced (a duplex model that
skipped frames would lose its place in the conversation), the clock moves on from when it
ended, and `stats` counts it and the worst lateness. A session that reads its voice too
slowly loses the oldest frames of its outbox, counted, rather than holding the clock back.

The model hears one microphone frame a tick, and a microphone sends one frame every 80 ms,
so frames that piled up once (a late frame, a client that sent a burst) would wait in the
inbox for the rest of the call: the model would hear the user that much later, for ever.
Each session watches its inbox as a jitter buffer does (duplex_session.py).

Faults (docs/engines/moshi-clock.md): a frame that raises is logged and counted and its
sessions get no frame for that tick; one session's bad frame or row fails that session
alone. A clock that dies (a sticky device error, or `FAILED_IN_A_ROW` failed frames:
clock_faults.py) or stalls (no frame done for `stall_s`: the clock's `StepWatch`) puts the
engine down: `stalled()` names why (so `/readyz` is red), every open session ends with the
reason (its reader gets DuplexFailed, its client `model_error`), and `open` refuses new
sessions (DuplexDown) until the engine is healthy again. A dead clock restarts in-process
with cleared rows after `restart_s`; a sticky error, or a frame stuck past `stuck_s` (the
thread cannot be got back), ends the process for its supervisor to restart.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ...device_faults import injected_fault
from ...duplex import DuplexDown
from ...memory_plan import MemoryPlan, rows_setting
from ...step_watch import StepWatch
from ...tasks import TaskSet
from ..gpu_memory import MemoryQuery, SizingSettings
from .clock_faults import FAILED_IN_A_ROW, ClockDeath, exit_for_supervisor, is_sticky
from .duplex_session import (
    INBOX_FRAMES,
    OUTBOX_FRAMES,
    RECENT_STEPS,
    STANDING_TICKS,
    DuplexSession,
    DuplexStats,
    Pcm,
    StepTimes,
    VoiceFrame,
)
from .frame_step import FrameStepper, RowsFull, Sampling
from .memory import plan_rows
from .mimi_frames import FRAME_SAMPLES, MimiFrames
from .text_stream import TextPieces, load_text_tokenizer, skipped_ids

log = logging.getLogger("parley.moshi.clock")

FRAME_S = 0.08
STALL_S = 2.0
"""No frame done for this long (25 frames): the clock is stalled, the engine down."""
STUCK_S = 10.0
"""A frame stuck this long: the model's thread cannot be got back; the process exits."""
RESTART_S = 1.0
"""A dead clock (not a sticky error) restarts after this long."""
WATCH_S = 0.1
"""How often the loop looks at the clock's progress."""
EXIT_GRACE_S = 1.0
"""Before a process exit: time for the ended sessions' clients to be told."""

Spoken = dict[str, tuple[Pcm, int, str]]


class SessionClosed(Exception):
    """The session (or the engine) has closed: no more voice frames."""


class MoshiDuplexEngine:
    """Owns the model, its thread and the clock. `start` loads and captures; `open` /
    `leave` add and remove sessions; `close` (idempotent) ends every session and the clock.

    `stall_s`, `stuck_s`, `restart_s`: the clock's fault bounds (module docstring);
    `exit_process`: what ends the process after a sticky error (a seam for the tests)."""

    def __init__(
        self,
        *,
        tiny: bool = False,
        device: str = "cpu",
        dtype: str = "float32",
        model_path: str | None = None,
        rows: int | str = 8,
        sampling: Sampling | None = None,
        clock: Callable[[], float] = time.monotonic,
        stall_s: float = STALL_S,
        stuck_s: float = STUCK_S,
        restart_s: float = RESTART_S,
        exit_process: Callable[[str], None] = exit_for_supervisor,
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
        self.sampling = sampling or Sampling()
        self.clock = clock
        self.stall_s, self.stuck_s, self.restart_s = stall_s, stuck_s, restart_s
        self._exit_process = exit_process
        self.stats = DuplexStats()
        self.restarts = 0
        self._lock = threading.Lock()
        """Guards `_sessions`, `_joining` and `_leaving`: the loop and the clock use them."""
        self._sessions: dict[str, DuplexSession] = {}
        self._joining: list[str] = []
        self._leaving: list[str] = []
        """Rows change between frames only, on the clock's side: never under a running step."""
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="moshi")
        """The model's thread: it loads the model and then runs the clock (`_run_clock`)."""
        self.watch = StepWatch("the moshi frame clock")
        self._stop = threading.Event()
        self._handoff_lock = threading.Lock()
        self._woken: set[str] = set()
        self._failed: dict[str, str] = {}
        self._handoff_due = False
        """What the clock hands the loop, at most one `call_soon_threadsafe` pending: the
        sessions with new frames, and those failed (bounded by the rows)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stepper: FrameStepper | None = None
        self._codec: MimiFrames | None = None
        self._tokenizer: Any | None = None
        self._pieces: dict[str, TextPieces] = {}
        """Per session, on the model's thread: its text tokens so far, as words."""
        self._tasks = TaskSet("moshi")
        """Owns the clock's supervisor (`_run`) and its watch (`_watch_clock`)."""
        self._ticker: asyncio.Task[None] | None = None
        self._closed = False
        self._dead: str | None = None
        """Why the clock died (until it has restarted)."""
        self._stall: str | None = None
        """Why the clock counts as stalled (until it makes progress again)."""
        self._rows_ms = 0.0
        self._phases = (0.0, 0.0, 0.0)
        """The last frame's joins and leaves; its encode, step and decode (ms, model thread)."""

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._loop.run_in_executor(self._thread, self._load)
        self._ticker = self._tasks.create_task(self._run(), name="moshi:clock")
        self._tasks.create_task(self._watch_clock(), name="moshi:clock-watch")

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
            model.audio_encoder, codebooks=self._stepper.codebooks, rows=self.rows
        )
        self._codec.warm()
        self._tokenizer = load_text_tokenizer(
            tiny=bool(self.options["tiny"]),
            vocab_size=int(model.config.vocab_size),
            model_path=self.options["model_path"],  # type: ignore[arg-type]
        )

    def cache_figures(self) -> tuple[int, int]:
        """(positions one session's row holds, device bytes of every row's state: the main
        and depth KV, the codec's streaming state) once loaded."""
        stepper, codec = self._stepper, self._codec
        if stepper is None or codec is None:
            return 0, 0
        caches = (stepper.cache, stepper.depth_cache)
        tensors = [t for cache in caches for t in (*cache.keys, *cache.values)]
        tensors += [*codec.encoder.tensors(), *codec.decoder.tensors()]
        return stepper.cache.window, sum(t.numel() * t.element_size() for t in tensors)

    # --- sessions (on the loop) ----------------------------------------------------------

    def open(self, session_id: str) -> DuplexSession:
        """A session from the next frame on; RowsFull when the model holds all it can,
        DuplexDown while the clock is dead or stalled."""
        if self._closed or self._ticker is None:
            raise SessionClosed("the duplex engine is not running")
        if (down := self.down) is not None:
            raise DuplexDown(f"the duplex model cannot serve now ({down}); try again shortly")
        with self._lock:
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
        session = self._drop(session_id)
        if session is not None:
            session.end()

    def _fail(self, session_id: str, reason: str) -> None:
        """The model failed under the session: it ends with `reason` (its reader is told)."""
        session = self._drop(session_id)
        if session is not None:
            session.fail(reason)

    def _drop(self, session_id: str) -> DuplexSession | None:
        with self._lock:
            session = self._sessions.pop(session_id, None)
            if session is None:
                return None
            if session_id in self._joining:
                self._joining.remove(session_id)
            else:
                self._leaving.append(session_id)
        return session

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    @property
    def down(self) -> str | None:
        """Why the engine cannot serve now (its clock died or stalled), or None."""
        return self._dead or self._stall

    def stalled(self, bound_s: float) -> str | None:
        """Why the engine cannot serve (`Engine.stalled`: `/readyz` names it): the clock
        died, or has done no frame for `stall_s` (or the stage's bound, the shorter)."""
        return self.down or self.watch.stalled(min(bound_s, self.stall_s))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        await self._tasks.close()
        for session_id in list(self._sessions):
            self.leave(session_id)
        await asyncio.to_thread(self._thread.shutdown, True)  # a frame in flight ends first
        self._apply_rows()

    # --- the clock's health (on the loop) ------------------------------------------------

    async def _run(self) -> None:
        """Run the clock on the model's thread; restart it when it dies (a sticky error
        ends the process instead)."""
        loop = asyncio.get_running_loop()
        while True:
            death: ClockDeath | None
            try:
                death = await loop.run_in_executor(self._thread, self._run_clock)
            except Exception as exc:  # outside a frame: still a dead clock, told as one
                log.exception("moshi clock: failed outside a frame")
                death = ClockDeath(f"{type(exc).__name__}: {exc}", is_sticky(exc))
            if death is None:
                return  # stopped by close()
            self._dead = f"its frame clock died: {death.reason}"
            self._go_down(self._dead)
            if death.sticky:
                await asyncio.sleep(EXIT_GRACE_S)
                self._exit_process(self._dead)
                return  # (where the seam did not exit) the engine stays down
            await asyncio.sleep(self.restart_s)
            try:  # every session has left (`_go_down`): their rows are freed
                await loop.run_in_executor(self._thread, self._apply_rows)
            except Exception as exc:
                log.exception("moshi clock: its rows could not be cleared for a restart")
                self._exit_process(f"{self._dead}; no restart: {type(exc).__name__}: {exc}")
                return
            self.restarts += 1
            self._dead = None
            log.warning("moshi clock: restarted with its rows cleared (restart %d)", self.restarts)

    async def _watch_clock(self) -> None:
        """Put the engine down while its clock makes no progress; up again once it does.
        A frame stuck past `stuck_s` cannot be got back: the process exits."""
        stuck_since: float | None = None
        while True:
            await asyncio.sleep(WATCH_S)
            reason = self.watch.stalled(self.stall_s)
            if reason is None:
                if self._stall is not None:
                    log.warning("moshi clock: making progress again; taking new sessions")
                self._stall, stuck_since = None, None
                continue
            if self._stall is None:
                self._stall = reason
                stuck_since = time.monotonic()
                self._go_down(reason)
            elif stuck_since is not None and time.monotonic() - stuck_since > self.stuck_s:
                stuck_since = None
                self._exit_process(f"{reason}: stuck past {self.stuck_s:g} s")

    def _go_down(self, reason: str) -> None:
        """End every open session with `reason`; `open` refuses new ones meanwhile."""
        ending = list(self._sessions)
        log.error(
            "moshi clock: %s; /readyz is red, %d sessions end with model_error, new sessions "
            "are refused until it recovers",
            reason,
            len(ending),
        )
        for session_id in ending:
            self._fail(session_id, f"the model failed: {reason}")

    def _hand_over(self, woken: set[str], failed: dict[str, str]) -> None:
        """From the clock: wake the sessions with new frames and end the failed ones, on
        the loop (one callback pending at most, whatever the loop's delay)."""
        if self._loop is None or not (woken or failed):
            return
        with self._handoff_lock:
            self._woken |= woken
            self._failed.update(failed)
            if self._handoff_due:
                return
            self._handoff_due = True
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody reads now
            self._loop.call_soon_threadsafe(self._take_handoff)

    def _take_handoff(self) -> None:
        with self._handoff_lock:
            woken, self._woken = self._woken, set()
            failed, self._failed = self._failed, {}
            self._handoff_due = False
        for session_id, reason in failed.items():
            log.warning("moshi session %s failed alone: %s", session_id, reason)
            self.stats.failed_sessions += 1
            self._fail(session_id, reason)
        for session_id in woken:
            if (session := self._sessions.get(session_id)) is not None:
                session.wake()

    # --- the clock (on the model's thread) -----------------------------------------------

    def _run_clock(self) -> ClockDeath | None:
        """Tick every FRAME_S until stopped (None) or dead (why). A failed frame is
        survived; a sticky one, or `FAILED_IN_A_ROW` in a row, ends the clock."""
        in_a_row = 0
        with self.watch.busy():
            due = self.clock() + FRAME_S
            while not self._stop.wait(max(0.0, due - self.clock())):
                try:
                    if (fault := injected_fault("parley-moshi-clock")) is not None:
                        raise fault  # the fault drill (device_faults.INJECT_ENV); off unless set
                    self._tick()
                    in_a_row = 0
                except Exception as exc:
                    in_a_row += 1
                    self.stats.failed_steps += 1
                    sticky = is_sticky(exc)
                    log.error(
                        "moshi clock: a frame failed (%d in a row, %s)",
                        in_a_row,
                        "sticky" if sticky else "its sessions got no frame",
                        exc_info=exc,
                    )
                    if sticky or in_a_row >= FAILED_IN_A_ROW:
                        count = "" if sticky else f" ({in_a_row} frames in a row)"
                        return ClockDeath(f"{type(exc).__name__}: {exc}{count}", sticky)
                ended = self.clock()
                self.watch.progress()
                late_ms = (ended - due) * 1000 - FRAME_S * 1000
                if late_ms > 0:  # the frame's work ended after the next frame was due
                    self.stats.late_steps += 1
                    self.stats.worst_late_ms = max(self.stats.worst_late_ms, late_ms)
                    due = ended
                due += FRAME_S
        return None

    def _tick(self) -> None:
        with self._lock:
            changes = self._row_changes()
            live = list(self._sessions.values())
        heard = {s.session_id: s.next_heard() for s in live}
        began = self.clock()
        spoken, failed = self._rows_and_frame(changes, heard)
        ended = self.clock()
        self.stats.steps += 1
        encode_ms, step_ms, decode_ms = self._phases
        total_ms = (ended - began) * 1000
        self.stats.recent.append(
            StepTimes(began, len(live), self._rows_ms, encode_ms, step_ms, decode_ms, total_ms)
        )
        woken: set[str] = set()
        for session in live:
            if session.session_id in spoken and not session.closed:
                session.deliver(*spoken[session.session_id])
                woken.add(session.session_id)
        self._hand_over(woken, failed)

    def _row_changes(self) -> tuple[list[str], list[str]]:
        """The leaves and joins asked for since the last frame (under `_lock`)."""
        leaving, self._leaving = self._leaving, []
        joining, self._joining = self._joining, []
        return leaving, joining

    def _apply_rows(self, changes: tuple[list[str], list[str]] | None = None) -> dict[str, str]:
        """The joins and leaves asked for since the last frame (on the model's thread: a
        leave may move a session's cache rows). A join that fails fails its session alone:
        the sessions whose row failed, and why."""
        if changes is None:
            with self._lock:
                changes = self._row_changes()
        leaving, joining = changes
        for session_id in leaving:
            self._forget_row(session_id)
        failed: dict[str, str] = {}
        for session_id in joining:
            if self._stepper is None:
                continue
            try:
                self._stepper.join(session_id)
            except Exception as exc:
                failed[session_id] = f"its row could not be set up: {type(exc).__name__}: {exc}"
                self._forget_row(session_id)
        return failed

    def _forget_row(self, session_id: str) -> None:
        self._pieces.pop(session_id, None)
        if self._stepper is not None:
            self._stepper.leave(session_id)
        if self._codec is not None:
            self._codec.forget(session_id)

    def _rows_and_frame(
        self, changes: tuple[list[str], list[str]], heard: dict[str, Pcm]
    ) -> tuple[Spoken, dict[str, str]]:
        """The frame for every session heard, and the sessions that failed alone (their
        row, their microphone's frame, their words): those leave the model at once, so the
        others' frame goes on without them."""
        began = time.perf_counter()
        failed = self._apply_rows(changes)
        for session_id, pcm in heard.items():
            if pcm.shape != (FRAME_SAMPLES,) or pcm.dtype != np.int16:
                failed[session_id] = (
                    f"its microphone frame was malformed ({pcm.dtype} of shape {pcm.shape}, "
                    f"not {FRAME_SAMPLES} PCM16 samples)"
                )
        for session_id in failed:
            heard.pop(session_id, None)
            self._forget_row(session_id)
        self._rows_ms = (time.perf_counter() - began) * 1000
        self._phases = (0.0, 0.0, 0.0)
        spoken: Spoken = {}
        for session_id, (pcm, text) in (self._frame(heard) if heard else {}).items():
            try:
                spoken[session_id] = (pcm, text, self._words(session_id, text))
            except Exception as exc:
                failed[session_id] = f"its words could not be read: {type(exc).__name__}: {exc}"
                self._forget_row(session_id)
        return spoken, failed

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
    "FRAME_S",
    "INBOX_FRAMES",
    "OUTBOX_FRAMES",
    "RECENT_STEPS",
    "STANDING_TICKS",
    "DuplexSession",
    "DuplexStats",
    "MoshiDuplexEngine",
    "RowsFull",
    "SessionClosed",
    "StepTimes",
    "VoiceFrame",
]
