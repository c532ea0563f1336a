"""One conversation: the owner of its parts, and what the transports talk to.

`run()` is the session's scope (a TaskGroup, run by the SessionManager): the event-log
writer, the watchdog (limits.py), the transcriber, a duplex model's reader, and at most one
answer (the turn scope, responder.py), so output has a single writer. Closing the session
ends all of it, tells the pipeline to forget it, deletes its Redis keys, and sends a goodbye.

Its parts: the input audio path (audio_in.py), turn-taking (turn_taking.py: the user's
turns), the responder (the answers), the conversation (conversation.py: the items) and its
output (output.py: the client's sink, the event log). Turn-taking and the responder ask the
session for what they need through two small protocols (`TurnHost`, `ResponderHost`). It
knows no transport: transports call its public methods and give it an `OutputSink`. Its
limits are measured on a `Clock`: wall time, unless a test compresses it (sessions.clock).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis

from pipeline.audio_format import INPUT_SAMPLE_RATE
from pipeline.types import Pipeline, PipelineRequest, RecognitionHints

from .audio_in import AudioIn
from .clock import REAL_CLOCK, Clock
from .config import SessionConfig
from .conversation import Conversation, text_message
from .duplex_turns import DuplexTurn, DuplexTurns
from .errors import SessionClosedError
from .events import (
    ConversationItem,
    DtmfReceived,
    ErrorEvent,
    Event,
    SessionClosed,
    SessionCreated,
    SessionStateChanged,
    SessionUpdated,
    error_event,
)
from .limits import SessionLimits as SessionLimits  # where the manager and tests find it
from .limits import Watchdog
from .mcp_tools import McpTools
from .metrics import SessionMetrics
from .output import SessionOutput
from .prefetch import Prefetch
from .recognition_hints import recognition_hints
from .redis_link import RedisLink
from .request_builder import RequestBuilder
from .responder import Responder
from .response_options import ResponseOptions
from .sink import OutputSink
from .state import SessionState, StateMachine
from .store import SessionStore
from .store_notices import StoreNotices
from .transcription import Heard, ItemTranscriber, store_transcript
from .transcription_session import check_type_change, refuse_response
from .turn_taking import ModelTurnTaking, ServerTurnTaking, TurnTaking
from .turns import MIN_COMMIT_MS as MIN_COMMIT_MS  # the transports size their queries by it
from .turns import Turns

log = logging.getLogger("parley.sessions.session")


class Session:
    def __init__(
        self,
        *,
        session_id: str,
        config: SessionConfig,
        redis: aioredis.Redis,
        pipeline: Pipeline,
        sink: OutputSink,
        limits: SessionLimits | None = None,
        metrics: SessionMetrics | None = None,
        link: RedisLink | None = None,
        clock: Clock = REAL_CLOCK,
        resume_token: str | None = None,
        fence: int = 0,
        rehydrated: bool = False,
        duplex: DuplexTurns | None = None,
    ) -> None:
        """`clock`: the time the watchdog and the responses live by (tests compress it).
        `resume_token`, `fence`, `rehydrated`: a session another process created, resumed
        here (rehydrate.py); `fence`: this process's ownership token (ownership.py).
        `duplex`: the session's place on a full-duplex model, which then decides when to
        speak (duplex_turns.py); the session closes it when it ends."""
        self.session_id = session_id
        self.clock = clock
        self.config = config
        self.resume_token = resume_token or secrets.token_urlsafe(24)
        self.rehydrated = rehydrated
        self.transport: dict[str, Any] = {}
        """What the last connection kept in the record for a resume elsewhere."""
        self.limits = limits or SessionLimits()
        self.metrics = metrics or SessionMetrics()
        self._pipeline = pipeline
        self.link = link or RedisLink(redis)
        self._notices = StoreNotices(
            self.link, self.limits.spill_max_bytes, self.emit, lambda: self.closing
        )
        """What the client is told, once an episode, when Redis cannot take writes."""
        self.store = store = SessionStore(
            session_id,
            config,
            redis,
            self.link,
            ttl_s=self.limits.key_ttl_s,
            spill_max_bytes=self.limits.spill_max_bytes,
            metrics=self.metrics,
            on_drop=self._notices.spill_dropped,
        )
        store.fence = fence
        self.keys, self.spill = store.keys, store.spill
        self.audio, self.frames = store.audio, store.frames
        self.history, self.event_log = store.history, store.event_log
        self.output = SessionOutput(sink, store)
        self.machine = StateMachine(session_id, self._on_transition)
        self._turns = Turns()
        self._requests = RequestBuilder(session_id, store, self._turns, self.metrics)
        self._media_lock = asyncio.Lock()
        self.turn_taking: TurnTaking
        """Who takes the turns: Parley (or the client), or the duplex model (turn_taking.py)."""
        if duplex is not None:
            self.turn_taking = ModelTurnTaking(
                self, self._turns, self.machine, config.turn_detection, self._media_lock
            )
        else:
            server = ServerTurnTaking(
                self,
                self._turns,
                self.machine,
                config.turn_detection,
                self._media_lock,
                pipeline=pipeline,
                read_audio=self.audio.read,
                clock=clock,
                metrics=self.metrics,
                turn_context=lambda item_id: self._responder.turn_context(item_id),
            )
            server.transcript.hints = self.recognition_hints
            self.turn_taking = server
        self._transcriber = ItemTranscriber(
            session_id,
            pipeline,
            self.history,
            self.audio.read,
            self.emit,
            known=self.turn_taking.words,
            hints=self.recognition_hints,
        )
        self.conversation = Conversation(store, self._turns, self._transcriber, self.emit)
        self._audio_in = AudioIn(
            store, self._turns, self.turn_taking, self._media_lock, duplex, config.noise_reduction
        )
        self._responder = Responder(
            self, pipeline, self._turns, self._transcriber, self._requests, self.turn_taking
        )
        self.mcp = self._responder.mcp = McpTools(session_id, self.history, self.emit)
        self._tg: asyncio.TaskGroup | None = None
        self._started = asyncio.Event()
        """session.created has gone out: what the client sends is answered after it."""
        self._close_requested = asyncio.Event()
        self._closed = asyncio.Event()
        self.close_reason = ""
        self._watchdog = Watchdog(
            self.limits,
            clock,
            responding=lambda: self.responding,
            emit=self.emit,
            close=self.request_close,
        )
        self.movable = False
        """A transport that can resume it elsewhere serves it (a drain hands it over)."""
        self.duplex = duplex

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        return self.machine.state

    @property
    def closed(self) -> bool:
        return self.machine.state is SessionState.CLOSED

    async def run(self) -> None:
        """The session scope; returns after close, with every task ended and keys deleted."""
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                writer = tg.create_task(self.event_log.run(), name=f"{self.session_id}:events")
                watchdog = tg.create_task(self._watchdog.run(), name=f"{self.session_id}:watchdog")
                transcriber = tg.create_task(
                    self._transcriber.run(), name=f"{self.session_id}:transcriber"
                )
                model = None
                if self.duplex is not None:
                    turns = self.duplex.run(self._model_speaks, self._model_failed)
                    model = tg.create_task(turns, name=f"{self.session_id}:duplex")
                # session.created is the first event a client gets, whatever it sends at once,
                # and comes once the record is written: its resume token works from then on.
                if not self.rehydrated:
                    await self.store.write_record(self.config, self.resume_token)
                    self.emit(
                        SessionCreated(
                            session_id=self.session_id,
                            config=self.config,
                            resume_token=self.resume_token,
                        )
                    )
                self._started.set()
                self.mcp.reconfigure(self.config.mcp_tools)  # listed after session.created
                await self._close_requested.wait()
                await self._shutdown()
                watchdog.cancel()
                transcriber.cancel()
                writer.cancel()
                if model is not None:
                    model.cancel()
        finally:
            self._started.set()  # nobody waits for a session.created that never comes
            self._tg = None
            await self.mcp.close()
            if self.duplex is not None:
                self.duplex.close()
            await self.audio.aclose()
            await self._responder.forget_session()
            if self.moving:
                await self.spill.aclose()  # the keys stay for the process that resumes it
            else:
                await self.store.delete()  # fenced: kept when another process owns it
            self._closed.set()

    def request_close(self, reason: str) -> None:
        """Ask the session to end; safe from anywhere, any number of times."""
        if not self._close_requested.is_set():
            self.close_reason = reason
            self._close_requested.set()

    async def close(self, reason: str = "client") -> None:
        """End the session and wait until it is fully torn down. Idempotent."""
        self.request_close(reason)
        await self._closed.wait()

    def request_hand_over(self, reason: str, *, flush: bool = True) -> None:
        """End here without a goodbye and without deleting the keys: the session goes on
        in another process (manager.py). The client's connection is told `reason`.
        `flush`: what was recorded so far is written first (False: the session was
        taken over already, so nothing more is written at all)."""
        self.output.moving = True
        if not flush:
            self.output.quiet = True
        self.request_close(reason)

    async def _shutdown(self) -> None:
        if self.moving:
            await self.output.go_quiet()
        elif not await self.store.owns():  # taken over meanwhile: no teardown writes
            self.output.quiet = True
            await self.spill.aclose()
        await self.turn_taking.close()
        async with self._media_lock:  # no media write races the key deletion
            await self._responder.cancel(self.close_reason or "session_closed")
            await self.mcp.close()
            self._audio_in.close()
            self.output.sink.clear()
            self.machine.to(SessionState.CLOSED, self.close_reason)
            self.emit(SessionClosed(reason=self.close_reason))
            if self.moving:  # the connection alone hears why (it tells its client)
                self.output.sink.event(SessionClosed(reason=self.close_reason))

    def recover(self, offset_ms: int, events: list[Event]) -> None:
        """A session resumed from Redis: its input audio timeline goes on at `offset_ms`
        (the end of the stored audio), and `events` (an unfinished answer's end) are
        emitted before anything else."""
        self._turns.offset_ms = self._turns.uncommitted_from_ms = offset_ms
        for event in events:
            self.emit(event)

    # --- Redis outages ---------------------------------------------------------------------

    def redis_unavailable(self, outage: int) -> None:
        """Tell the client, once per outage, that the session store is unreachable."""
        self._notices.tell(self._notices.outage(outage))

    def redis_full(self, refusal: int) -> None:
        """Tell the client, once per refusal, that the session store refuses writes (it is
        at its memory limit)."""
        self._notices.tell(self._notices.refusal(refusal))

    def store_trouble(self) -> None:
        self._notices.trouble()

    async def restore_after_outage(self) -> None:
        """Redis answers again: the store puts back what it lost (see SessionStore.restore)."""
        if not self._close_requested.is_set():
            await self.store.restore(self.config, self.resume_token)

    async def write_back_after_refusal(self) -> None:
        """Redis takes writes again: what was kept is written (see SessionStore.write_back)."""
        if not self._close_requested.is_set():
            await self.store.write_back()

    # --- connections ---------------------------------------------------------------------

    def matches_token(self, token: str) -> bool:
        return hmac.compare_digest(token.encode(), self.resume_token.encode())

    async def detach(self, grace_s: float) -> None:
        """The client's connection dropped: stop answering, keep the session `grace_s` for a
        resume (its events go on into the event log), then close it."""
        self._check_open()
        await self._responder.stop("client_disconnected")
        self.output.detach()
        self._watchdog.detached(grace_s)

    def attach(self, sink: OutputSink) -> None:
        """A client (re)connected: output goes to `sink` from now on."""
        self._check_open()
        self.output.sink = sink
        self._watchdog.attached()

    # --- events --------------------------------------------------------------------------

    def recognition_hints(self) -> RecognitionHints:
        """The language and prompt the client asks its speech to be recognised with, as
        the session's settings hold them now (every recognition of its audio asks)."""
        return recognition_hints(self.config)

    def emit(self, event: Event) -> None:
        self.output.emit(event)

    @property
    def moving(self) -> bool:
        """Handed over to another process: it ends here silently and keeps its keys."""
        return self.output.moving

    def report_error(self, error: Exception, client_event_id: str | None = None) -> None:
        """Send a typed error to the client as an `error` event; the session goes on."""
        self.emit(error_event(error, client_event_id))

    def _on_transition(self, old: SessionState, new: SessionState, reason: str) -> None:
        self.emit(SessionStateChanged(previous=old.value, state=new.value, reason=reason))

    def _check_open(self) -> None:
        """Every call a client's connection makes starts here: the session must be open,
        and the call is activity (the idle timeout counts from it)."""
        if self._close_requested.is_set() or self.closed:
            raise SessionClosedError("the session is closed")
        self._watchdog.activity()

    # --- settings ------------------------------------------------------------------------

    async def update(self, patch: Mapping[str, Any]) -> SessionConfig:
        """Validate and apply new settings; on error nothing changes."""
        self._check_open()
        await self._started.wait()  # session.updated never overtakes session.created
        self._check_open()
        new = self.config.updated(patch)
        check_type_change(self.config, new, self._pipeline, responding=self.responding)
        async with self._media_lock:
            await self.frames.reconfigure(new.video)
            self.audio.max_seconds = new.max_audio_seconds
            self.turn_taking.reconfigure(new.turn_detection)
            self._audio_in.reconfigure(new.noise_reduction)
            self.config = new
        self.emit(SessionUpdated(session_id=self.session_id, config=new))
        self.mcp.reconfigure(new.mcp_tools)
        # The record too: a resume on another process goes on with these settings.
        await self.store.write_record(new, self.resume_token)
        return new

    # --- media in ------------------------------------------------------------------------

    async def append_audio(
        self, pcm: bytes, sample_rate: int = INPUT_SAMPLE_RATE, channels: int = 1
    ) -> None:
        """Buffer client audio (PCM16 interleaved, any supported rate) and detect turns."""
        self._check_open()
        await self._audio_in.append(pcm, sample_rate, channels, self._check_open)

    def dtmf(self, digit: str) -> None:
        """A keypad digit from the caller (a phone call): told to the client as an event."""
        self._check_open()
        self.emit(DtmfReceived(digit=digit, received_at=int(time.time())))

    async def add_frame(self, image: bytes, timestamp_ms: int | None = None) -> bool:
        """Cache a camera frame (JPEG or PNG); False if the similar-frame filter dropped it."""
        self._check_open()
        ts = round(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        async with self._media_lock:
            self._check_open()
            evicted, filtered = self.frames.evicted, self.frames.filtered
            kept = await self.frames.add(image, ts)
        self.metrics.dropped_frames.labels("video_evicted").inc(self.frames.evicted - evicted)
        self.metrics.dropped_frames.labels("video_similar").inc(self.frames.filtered - filtered)
        return kept

    # --- turns (what turn-taking asks of the session: turn_host.TurnHost) ------------

    async def _model_speaks(self, turn: DuplexTurn) -> None:
        """The duplex model began a turn: it is answered as a response of its own."""
        try:
            await self._responder.start(pipeline=turn)
        except SessionClosedError:
            await turn.close()

    def _model_failed(self, reason: str) -> None:
        """The duplex model failed under the session: the client is told in an `error`
        (`model_error`, in every protocol's words), then the session ends with that reason."""
        self.emit(
            ErrorEvent(
                code="model_error",
                error_type="server_error",
                message=f"The session has ended: {reason}.",
            )
        )
        self.request_close("model_error")

    @property
    def closing(self) -> bool:
        return self._close_requested.is_set()

    async def interrupt(self) -> None:
        await self._responder.cancel("barge_in", next_state=SessionState.USER_SPEAKING)

    async def respond(self, prefetched: Prefetch | None = None) -> None:
        await self._responder.start(prefetched=prefetched)

    def transcribe(self, item_id: str, begin_ms: int, end_ms: int) -> None:
        self._transcriber.request(item_id, begin_ms, end_ms)

    async def store_transcript(self, item_id: str, heard: Heard) -> None:
        await store_transcript(self.history, self.emit, item_id, heard)

    async def request_ahead(
        self, item_id: str, span: tuple[int, int], words: str
    ) -> PipelineRequest:
        return await self._responder.request_ahead(item_id, span, words)

    async def commit_turn(self, item_id: str, begin_ms: int, end_ms: int) -> ConversationItem:
        return await self.conversation.commit_speech(item_id, begin_ms, end_ms)

    async def commit_audio(self) -> ConversationItem:
        """Manual turns: make the uncommitted input audio a user item."""
        self._check_open()
        async with self._media_lock:
            return await self.turn_taking.commit()

    async def clear_audio(self) -> None:
        """Drop the uncommitted input audio."""
        self._check_open()
        async with self._media_lock:
            await self.turn_taking.clear()

    async def add_text(self, text: str, role: str = "user") -> ConversationItem:
        """A typed message; the next response answers it."""
        return await self.add_item(text_message(text, role))

    async def add_item(
        self, item: ConversationItem, previous_item_id: str | None = None
    ) -> ConversationItem:
        """conversation.item.create: `item` joins the conversation (conversation.py)."""
        self._check_open()
        return await self.conversation.add(item, previous_item_id)

    async def add_audio_item(
        self, item: ConversationItem, pcm: bytes, sample_rate: int = INPUT_SAMPLE_RATE
    ) -> ConversationItem:
        """A user message of recorded speech: a committed turn (conversation.py)."""
        self._check_open()
        async with self._media_lock:
            self._check_open()
            return await self.conversation.add_audio(item, pcm, sample_rate)

    async def retrieve_item(self, item_id: str) -> ConversationItem:
        """conversation.item.retrieve: the item as it is now (a transcript, a truncation)."""
        self._check_open()
        return await self.conversation.retrieve(item_id)

    async def delete_item(self, item_id: str) -> None:
        """conversation.item.delete: the item leaves the history (and the model's context)."""
        self._check_open()
        await self.conversation.delete(item_id)

    # --- responses (responder.py; what it asks of the session: ResponderHost) -----------

    @property
    def responding(self) -> bool:
        return self._responder.responding

    async def create_response(self, options: ResponseOptions | None = None) -> str:
        """response.create: answer the conversation so far, shaped by `options`."""
        self._check_open()
        refuse_response(self.config)
        return await self._responder.create(options, duplex=self.duplex is not None)

    async def cancel_response(self) -> bool:
        """response.cancel: False when nothing was in progress."""
        self._check_open()
        return await self._responder.cancel("client_cancelled")

    async def truncate_item(self, item_id: str, audio_end_ms: int) -> None:
        """conversation.item.truncate: the answer in progress or just played knows which
        words were heard by then; an older assistant audio item is cut in proportion."""
        self._check_open()
        if not await self._responder.truncate(item_id, audio_end_ms):
            await self.conversation.truncate(item_id, audio_end_ms)

    @property
    def sink(self) -> OutputSink:
        return self.output.sink

    @property
    def task_group(self) -> asyncio.TaskGroup | None:
        return self._tg

    def answer_ended(self) -> None:
        self._watchdog.activity()  # idle time counts from the answer's end

    def describe(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "state": self.state.value,
            "input_audio_ms": self._turns.offset_ms,
            "age_s": round(self.clock.now() - self._watchdog.created, 1),
        }
