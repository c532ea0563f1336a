"""A session's answers, one at a time: the turn scope.

The session has a single writer of output. The `Responder` starts each answer (a `Response`,
response.py) as one task in the session's task group, and stops it: a barge-in, a
response.cancel, a lost connection or the session's end cancels it (the sink cleared first,
then the task cancelled and awaited); a new answer cuts off one still generating, or lets
one that only plays out its audio hand over (its audio plays on and the new one queues
after it). It makes the thinking / speaking / listening transitions of an answer and tells
turn-taking when one starts and when one has played out (turn_taking.py).

What it uses of the session is a `ResponderHost`: the session's parts, what changes
while it lives (its settings, its sink, its task group), and what the session does when an
answer ends or fails.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from pipeline.tasks import cancel_and_wait
from pipeline.types import Pipeline, PipelineRequest

from .clock import Clock
from .config import SessionConfig
from .errors import InvalidRequestError, RedisUnavailableError, SessionClosedError
from .events import Event, new_id
from .history import History
from .limits import SessionLimits
from .mcp_tools import McpTools
from .metrics import SessionMetrics
from .prefetch import Prefetch
from .request_builder import RequestBuilder
from .response import Response, ResponseContext
from .response_options import ResolvedOptions, ResponseOptions
from .sink import OutputSink
from .state import SessionState, StateMachine
from .transcription import Heard, ItemTranscriber, store_transcript
from .turn_taking import TurnTaking
from .turns import TurnInput, Turns

log = logging.getLogger("parley.sessions.responder")

_S = SessionState

FORGET_TIMEOUT_S = 5.0


class ResponderHost(Protocol):
    """What the responder needs from its session: its parts, and what changes while it
    lives (its settings, its sink, its task group)."""

    session_id: str
    config: SessionConfig
    limits: SessionLimits
    clock: Clock
    history: History
    machine: StateMachine
    metrics: SessionMetrics

    @property
    def sink(self) -> OutputSink:
        """Where output goes now (it changes when the client reconnects)."""
        ...

    @property
    def task_group(self) -> asyncio.TaskGroup | None:
        """The session's scope while it runs; None once it has ended."""
        ...

    def emit(self, event: Event) -> None: ...

    def report_error(self, error: Exception, client_event_id: str | None = None) -> None: ...

    def store_trouble(self) -> None:
        """An answer failed for want of the session store: the client hears why, once."""
        ...

    def answer_ended(self) -> None:
        """An answer ended (played out, cancelled or failed): idle time counts from now."""
        ...


class Responder:
    def __init__(
        self,
        host: ResponderHost,
        pipeline: Pipeline,
        turns: Turns,
        transcriber: ItemTranscriber,
        requests: RequestBuilder,
        turn_taking: TurnTaking,
    ) -> None:
        self._host = host
        self._session_id = host.session_id
        self._pipeline = pipeline
        self._history = host.history
        self._turns = turns
        self._transcriber = transcriber
        self._requests = requests
        self._turn_taking = turn_taking
        self._machine = host.machine
        self._metrics = host.metrics
        self._clock = host.clock
        self._chunk_timeout_s = host.limits.chunk_timeout_s
        self.response: Response | None = None
        """The last answer: a client may still truncate its item after it ended."""
        self._task: asyncio.Task[None] | None = None
        self._writer_lock = asyncio.Lock()
        self.mcp: McpTools | None = None
        """The session's MCP servers, whose tools each answer offers and calls."""

    @property
    def responding(self) -> bool:
        """An answer is generating or playing."""
        return self._task is not None and not self._task.done()

    @property
    def generating(self) -> Response | None:
        """The answer in progress if it is still generating (not only playing out)."""
        response = self.response
        return (
            response if self.responding and response is not None and response.generating else None
        )

    async def create(self, options: ResponseOptions | None, *, duplex: bool) -> str:
        """response.create: refused while an answer generates, and in a session whose
        model is full duplex (it decides by itself when to speak)."""
        if duplex:
            raise InvalidRequestError(
                "this session's model is full duplex: it decides by itself when to speak, "
                "so a response cannot be created",
                "duplex_model_decides",
            )
        if (active := self.generating) is not None:
            raise InvalidRequestError(
                "Conversation already has an active response in progress: "
                f"{active.response_id}. Wait until the response is finished before "
                "creating a new one.",
                "conversation_already_has_active_response",
            )
        return await self.start(options)

    async def start(
        self,
        options: ResponseOptions | None = None,
        prefetched: Prefetch | None = None,
        pipeline: Pipeline | None = None,
    ) -> str:
        """Start an answer (`prefetched`: adopting the work begun at the turn's pause;
        `pipeline`: a duplex model's turn, which has heard the user's turns itself)."""
        if prefetched is None:
            await self._turn_taking.drop_ahead()  # an answer to anything else: that is moot
        host = self._host
        resolved = self._resolve(options or ResponseOptions())
        async with self._writer_lock:  # one writer: never start while one is torn down
            await self._end_previous()
            tg: asyncio.TaskGroup | None = host.task_group
            if tg is None:
                raise SessionClosedError("the session is not running")
            self._turn_taking.answering()
            # An out-of-band answer leaves the pending turn for the next real one.
            in_turn = resolved.in_conversation and pipeline is None
            turn = self._turns.take() if in_turn else TurnInput(None)
            transcript_item_id = turn.transcript_item_id
            words = known = None
            if prefetched is not None:  # its words were recognised at the pause
                words, prefetched = await self._turn_taking.adopt(prefetched)
                if prefetched is None:  # begun on a draft the final words overrule
                    words, known = None, words
            if transcript_item_id is not None:
                self._transcriber.answered(transcript_item_id)
                heard = await self._history.get(transcript_item_id)
                if heard is not None and heard.text:  # transcribed already: not again
                    transcript_item_id = None
            context = ResponseContext(
                pipeline=pipeline or self._pipeline,
                history=self._history,
                sink=host.sink,
                emit=host.emit,
                first_audio=self._speaking,
                chunk_timeout_s=self._chunk_timeout_s,
                clock=self._clock,
                mcp=self.mcp,
            )
            response = Response(
                new_id("resp"),
                context,
                lambda request_id: self._build_request(request_id, turn, resolved, known),
                transcript_item_id,
                resolved,
                prefetched,
                heard=words,
            )
            if prefetched is not None:
                self._turns.claim_audio(turn)  # the prefetched request has read it
            if self._machine.state is not _S.THINKING:
                self._machine.to(_S.THINKING, "response started")
            self.response = response
            self._task = tg.create_task(
                self._run(response), name=f"{self._session_id}:{response.response_id}"
            )
            return response.response_id

    def _resolve(self, options: ResponseOptions) -> ResolvedOptions:
        """The options over the session's settings, with its MCP servers' tools."""
        config = self._host.config
        if self.mcp is None:
            return options.resolve(config)
        functions = options.tools if options.tools is not None else config.tools
        return options.resolve(config, self.mcp.tool_configs(functions))

    async def _end_previous(self) -> None:
        """Before a new answer: one that is only playing out its audio hands over (its
        audio plays on, the new answer's queues after it, as OpenAI's clients expect after
        response.done); one still generating is cut off."""
        task, response = self._task, self.response
        playing_out = response is not None and not response.generating
        if task is not None and response is not None and not task.done() and playing_out:
            response.hand_over()
            await cancel_and_wait(task)
            self._task = None
            return
        await self.cancel("superseded")

    def _speaking(self) -> None:
        """The answer in progress has its first audio."""
        self._machine.to(_S.SPEAKING, "first audio")

    async def _run(self, response: Response) -> None:
        host, machine = self._host, self._machine
        try:
            status = await response.run()
            machine.to(_S.LISTENING, f"response {status}")
            self._turn_taking.answered()
        except asyncio.CancelledError:
            raise
        except RedisUnavailableError:  # not a bug: the client hears of the outage once
            host.store_trouble()
            if machine.can(_S.LISTENING):
                machine.to(_S.LISTENING, "session store unreachable")
        except Exception:
            log.exception("session %s: response %s crashed", self._session_id, response.response_id)
            host.report_error(RuntimeError("the response failed unexpectedly"))
            if machine.can(_S.LISTENING):
                machine.to(_S.LISTENING, "response crashed")
        finally:
            host.answer_ended()
            if response.status is not None:
                self._metrics.responses.labels(response.status).inc()
            if response.redis_unavailable:
                host.store_trouble()

    async def cancel(self, reason: str, next_state: SessionState = _S.LISTENING) -> bool:
        """Stop the answer in progress: sink cleared first, then the turn task cancelled.
        False when nothing was in progress."""
        task, response = self._task, self.response
        if task is None or response is None or task.done():
            return False
        self._host.sink.clear()
        response.cancel_reason = reason
        await cancel_and_wait(task)
        await response.discard_prefetched()  # if it was cancelled before it began
        self._host.sink.resume()
        # The response stays in `response`: a client may still truncate its item (OpenAI
        # clients send response.cancel, then conversation.item.truncate).
        self._task = None
        if self._machine.state is not next_state and self._machine.can(next_state):
            self._machine.to(next_state, reason)
        return True

    async def stop(self, reason: str) -> None:
        """Cancel the answer in progress, waiting for one that is starting first."""
        async with self._writer_lock:
            await self.cancel(reason)

    async def truncate(self, item_id: str, audio_end_ms: int) -> bool:
        """conversation.item.truncate of the last answer's item; False if it is another's."""
        response = self.response
        if response is None or response.item.id != item_id:
            return False
        await response.truncate(audio_end_ms, by_client=True)
        return True

    async def forget_session(self) -> None:
        """The session ended: the pipeline drops what it kept for it between turns (the
        Thinker's KV); the answer in flight, if any, was cancelled first, so nothing is kept
        after this."""
        try:
            async with asyncio.timeout(FORGET_TIMEOUT_S):
                await self._pipeline.forget_session(self._session_id)
        except Exception as exc:  # the session ends anyway; the engines' budgets evict it
            log.warning("session %s: the pipeline did not forget it: %r", self._session_id, exc)

    async def request_ahead(
        self, item_id: str, span_ms: tuple[int, int], words: str
    ) -> PipelineRequest:
        """The request of an answer begun ahead, on the words of the turn so far."""
        config = self._host.config
        options, rate = self._resolve(ResponseOptions()), config.output_sample_rate
        streamed = await self._turn_taking.streamed_turn(item_id, ahead=True)
        return await self._requests.build_ahead(
            new_id("resp"), item_id, span_ms, words, options, rate, streamed
        )

    async def turn_context(self, item_id: str) -> PipelineRequest:
        """The request the spoken turn `item_id`, just begun, would be answered with so far
        (no audio): a turn streamed while the user speaks opens with it."""
        config = self._host.config
        options, rate = self._resolve(ResponseOptions()), config.output_sample_rate
        return await self._requests.build_context(new_id("resp"), item_id, options, rate)

    async def _build_request(
        self,
        request_id: str,
        turn: TurnInput,
        options: ResolvedOptions,
        known: Heard | None = None,
    ) -> PipelineRequest:
        """`known`: the turn's words, recognised at its pause and taken already."""
        transcript = await self._heard(turn.speech_item_id or turn.user_item_id, known)
        rate = self._host.config.output_sample_rate
        streamed = ""
        if options.in_conversation and options.input is None:  # the spoken turn's own answer
            streamed = await self._turn_taking.streamed_turn(turn.user_item_id)
        return await self._requests.build(request_id, turn, options, rate, transcript, streamed)

    async def _heard(self, item_id: str | None, known: Heard | None = None) -> str | None:
        """The words of the spoken turn `item_id`, if they were recognised already (at its
        pause): stored on its item and announced, so the answer need not recognise them
        again."""
        if item_id is None:
            return None
        heard = known or await self._turn_taking.words(item_id)
        if heard is not None:
            await store_transcript(self._history, self._host.emit, item_id, heard)
            return heard.words
        item = await self._history.get(item_id)
        return item.text if item is not None and item.has_audio and item.text else None
