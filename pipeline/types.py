"""The pipeline's vocabulary: requests, typed chunks and the small contracts.

Everything that crosses a stage boundary or leaves the pipeline is one of the chunk
dataclasses below. They are plain data so that connectors can move them between
processes and sessions can match on them without knowing which engine made them.
Sessions see one contract, `Pipeline`; stages see two engine kinds, `EntryEngine` (takes the
`PipelineRequest`) and `StreamEngine` (takes a `StageInput`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

# The audio formats are defined in audio_format; engines import INPUT_SAMPLE_RATE from here.
from .audio_format import INPUT_SAMPLE_RATE as INPUT_SAMPLE_RATE
from .audio_format import OUTPUT_SAMPLE_RATE
from .capacity import Capacity, PipelineCapacity, RowLoad


@dataclass(frozen=True, slots=True)
class VideoFrame:
    """One camera frame: encoded image bytes (JPEG or PNG) and its capture time."""

    image: bytes
    timestamp_ms: int


ItemKind = Literal["message", "function_call", "function_call_output"]


@dataclass(frozen=True, slots=True)
class HistoryItem:
    """A committed conversation item as the model sees it.

    A `message` is the role's `text`. A `function_call` (role assistant) is the model's
    call of tool `name` with JSON `arguments`, under the client's `call_id`; its
    `function_call_output` (role user: what the client's code returned) has the same
    `call_id` and the result as `text`.
    """

    role: Literal["user", "assistant", "system"]
    text: str
    item_id: str = ""
    """The session's id of the item ("" outside a session)."""
    kind: ItemKind = "message"
    name: str = ""
    call_id: str = ""
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function the model may call: OpenAI's `{"type": "function", ...}` tool."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    """The arguments' JSON schema (an object schema; empty means no arguments)."""


@dataclass(frozen=True, slots=True)
class RecognitionHints:
    """How a client asks its speech to be recognised (OpenAI Realtime's
    `audio.input.transcription`): the language it is spoken in (ISO-639-1, "" to let the
    recogniser decide or use its own), and a prompt of words to expect (names, terms) or of
    the text before it. A recogniser that cannot use one ignores it (pipeline docs say which)."""

    language: str = ""
    prompt: str = ""
    logprobs: bool = False
    """Also give each token's log-probability (OpenAI's `include:
    ["item.input_audio_transcription.logprobs"]`), if the recogniser has them."""


NO_HINTS = RecognitionHints()
"""What a request without the client's language or prompt carries."""


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One token of a transcript and how sure the recogniser was of it (OpenAI's
    `LogProbProperties`): its text, the natural log of its probability when it was chosen,
    and its UTF-8 bytes (a token may hold part of a character: its text then shows U+FFFD,
    its bytes are exact)."""

    token: str
    logprob: float
    utf8: bytes


Logprobs = tuple[TokenLogprob, ...]
"""A transcript's (or a piece's) tokens in order: their texts joined are its text."""


@dataclass(frozen=True, slots=True)
class Truncation:
    """What an engine does when the conversation does not fit its context (OpenAI
    Realtime's session `truncation`).

    - `auto`: the oldest history items are dropped until the prompt and the reply's budget
      fit;
    - `retention_ratio`: when it does not fit, keep only this fraction of the conversation
      after the instructions (`post_instructions_tokens`, if set, caps it too), dropping
      the oldest items; cutting more than needed at once keeps later turns' prompts (and a
      session's cached KV) stable for longer;
    - `disabled`: nothing is dropped; a conversation that does not fit fails the response
      with `context_length_exceeded`.
    Items once dropped stay dropped for the session's later turns."""

    type: Literal["auto", "retention_ratio", "disabled"] = "auto"
    retention_ratio: float = 1.0
    post_instructions_tokens: int | None = None


ToolChoice = str
"""`auto` (the model decides), `none` (never call), `required` (call one of the tools), or
a tool's name (call that one)."""


@dataclass(frozen=True, slots=True)
class PipelineRequest:
    """Everything one response needs: the turn, its context and the output format."""

    request_id: str
    audio: npt.NDArray[np.int16]
    """The user's turn (with prefix padding), PCM16 mono at INPUT_SAMPLE_RATE; may be empty."""
    text: str | None = None
    """A typed user message, when the turn was text rather than speech."""
    frames: tuple[VideoFrame, ...] = ()
    history: tuple[HistoryItem, ...] = ()
    instructions: str = ""
    output_sample_rate: int = OUTPUT_SAMPLE_RATE
    output_text_only: bool = False
    session_id: str = ""
    """The session the request answers for ("" outside a session): an engine may keep state
    between a session's requests (the Thinker's KV) until `forget_session`."""
    item_ids: tuple[str, ...] = ()
    """Every item of the session's conversation in the prompt's order: the history's (with
    or without text, which `history` leaves out) and last this turn's own. An engine that
    keeps a session's state checks with it that the conversation is still the one it saw."""
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    """False: at most one call (OpenAI's `parallel_tool_calls`); the session keeps only a
    round's first call whatever the engine makes, and an engine that can tell its model
    does (openai_chat sends it on)."""
    max_output_tokens: int | None = None
    """At most this many tokens of reply (None: the engine's own limit)."""
    voice: str = ""
    """The voice to speak in ("": the engine's default); an engine that has no such voice
    uses its default."""
    speed: float = 1.0
    """Speaking rate: 1.0 normal, OpenAI's range 0.25-1.5."""
    transcript: str | None = None
    """The words of `audio`, already recognised (at the turn's last pause): an engine that
    recognises speech uses them instead of recognising the audio again."""
    transcribe_only: bool = False
    """Only transcribe `audio` (as `input_transcript` deltas), then End: no answer. For a
    user turn that no answer follows yet; an engine with no recogniser just ends."""
    judge_turn_end: bool = False
    """With `transcribe_only`, at a pause in the user's speech: also say whether the words
    sound like a whole turn (a `turn_end` TextDelta), if the engine can judge that."""
    draft_transcript: bool = False
    """With `transcribe_only`, at a pause: an engine with a faster, rougher recogniser beside
    its own sends that one's words first (a `draft_transcript` TextDelta, and with
    `judge_turn_end` their verdict), then its own recogniser's (`input_transcript`, and a
    verdict again only if the words differ), so that an answer can start on the draft while
    the final words are on their way (sessions/prefetch.py)."""
    truncation: Truncation = field(default_factory=Truncation)
    """How to cut a conversation longer than the engine's context."""
    recognition: RecognitionHints = field(default_factory=RecognitionHints)
    """The client's language and prompt for recognising `audio`."""
    streamed_turn: str = ""
    """The turn as it was streamed to an engine while the user spoke (`StreamingInput`):
    an engine that has it goes on from what it prefilled then; any other (or one that lost
    it) reads the whole turn from `audio` as always, so `audio` is the whole turn still."""


@dataclass(frozen=True, slots=True)
class StageInput:
    """What a downstream stage receives: the request, and its upstream chunks as they come.

    The stream starts before the upstream stage has finished, so a stage can begin on the
    first chunk ("async chunk") and must consume it to its end or be cancelled.
    """

    request: PipelineRequest
    chunks: AsyncIterator[Chunk]


# --- chunks -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of text. `input_transcript` is what the user said; `output` what the model says;
    `turn_end` is a verdict on the user's words so far, "finished" or "unfinished" (only for
    a request that asks `judge_turn_end`); `draft_transcript` the whole of a quick first
    guess at what the user said (only for a request that asks `draft_transcript`)."""

    text: str
    kind: Literal["output", "input_transcript", "turn_end", "draft_transcript"] = "output"
    logprobs: Logprobs | None = None
    """An `input_transcript`'s tokens, when the request asked for them
    (`RecognitionHints.logprobs`) and the recogniser has them; else None."""


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """Part of a function call the model is making, for the client to run.

    A call streams as several deltas with the same `call_id` and `name`: `arguments` is the
    next piece of the arguments' JSON text; the last delta has `done=True` and the
    arguments are then complete (the pieces joined parse as JSON). A response may make
    several calls, one after another."""

    call_id: str
    name: str
    arguments: str
    done: bool = False


@dataclass(frozen=True, slots=True)
class HiddenStates:
    """Hidden states passed from one stage to the next (e.g. Thinker -> Talker)."""

    array: npt.NDArray[Any]
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CodecCodes:
    """Discrete units (codec codes, phoneme ids) passed to a vocoder stage."""

    codes: npt.NDArray[np.int32]
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AudioChunk:
    """Synthesised speech: PCM16 mono at `sample_rate`."""

    pcm: npt.NDArray[np.int16]
    sample_rate: int

    @property
    def duration_ms(self) -> float:
        return 1000.0 * len(self.pcm) / self.sample_rate


@dataclass(frozen=True, slots=True)
class End:
    """The request finished normally; nothing follows."""


@dataclass(frozen=True, slots=True)
class ErrorChunk:
    """The request failed in some stage; nothing follows.

    `code` is the reason in one word, which the session hands its client as the error's
    code: `model_error` (the model failed), `server_busy` (no capacity for the request
    within its wait: it may be tried again), `context_length_exceeded` (the conversation
    does not fit the model's context and the session's truncation forbids cutting it)."""

    message: str
    stage: str = ""
    code: str = "model_error"


Chunk = TextDelta | ToolCallDelta | HiddenStates | CodecCodes | AudioChunk | End | ErrorChunk
OutputChunk = TextDelta | ToolCallDelta | AudioChunk | End | ErrorChunk
"""What a pipeline yields to its caller (intermediate chunks never leave the graph)."""


# --- contracts ----------------------------------------------------------------------------


class Engine(ABC):
    """One stage's model runner: what every engine has, whichever kind it is.

    An engine is an `EntryEngine` (a stage with no upstream edge: it gets the request
    itself) or a `StreamEngine` (every other stage: it gets the request and its upstream
    chunks as they come). The graph decides which kind a stage is and checks the engine
    against it when it is built. `generate` streams chunks for one request and must abort the
    request when the iterator is closed or its task cancelled (then re-raise), leaving no
    state behind; `pipeline.requests.RequestTracker` keeps that bookkeeping for an engine.
    """

    name: str

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def abort(self, request_id: str) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    def active_requests(self) -> int:
        """How many requests hold state in the engine right now (0 after every abort)."""

    async def forget_session(self, session_id: str) -> None:  # noqa: B027 (a default)
        """The session has ended: drop whatever the engine kept for it between its requests.
        Most engines keep nothing per session, hence this default."""

    def capacity(self) -> Capacity | None:
        """What the started engine can serve at once (`capacity.py`); None for an engine
        with no fixed rows of its own (admission keeps its configured cap for it)."""
        return None

    def shared_by_processes(self) -> bool:
        """Whether this one engine serves every server process of `parley serve --workers
        N` (a stage host's, a remote stage's), rather than each process running its own:
        admission then counts its capacity once, not once per process."""
        return False

    def row_load(self) -> RowLoad | None:
        """Its rows now (held, waited for, refused: `row_gate.py`), for the metrics; None
        for an engine with no row gate."""
        return None

    def stalled(self, bound_s: float) -> str | None:
        """Why the engine has made no progress for longer than `bound_s` while it has work
        (its model thread stuck in a step), or None. The process serving a stage asks this
        at every heartbeat and stops vouching for the stage while it answers a reason; an
        engine keeps a `step_watch.StepWatch` to answer. This default (no thread of its
        own to watch) is never stalled."""
        return None

    def broken(self) -> str | None:
        """Why the engine can never serve again in this process (a sticky device error: the
        process's CUDA context is unusable, `device_faults.py`), or None. The process serving
        the stage then exits so that its supervisor starts a fresh one; an engine that can
        break answers the same reason from `stalled` too, so `/readyz` turns red at once.
        This default (nothing that breaks for good) never is."""
        return None


class EntryEngine(Engine):
    """An entry stage's engine: one request in, a stream of chunks out."""

    @abstractmethod
    def generate(
        self, request_id: str, request: PipelineRequest, /
    ) -> AsyncGenerator[Chunk, None]: ...


class StreamEngine(Engine):
    """A downstream stage's engine: it starts on the first upstream chunk ("async chunk")
    and reads `inputs.chunks` to its end unless it stops early or is cancelled."""

    @abstractmethod
    def generate(self, request_id: str, inputs: StageInput, /) -> AsyncGenerator[Chunk, None]: ...


class StreamingInput(ABC):
    """What an engine that can take a turn's input while it arrives adds to its contract.

    While the user speaks, whoever owns the audio opens a turn (`open_turn`, with the
    request the turn would be answered with so far: its session, history, items and
    instructions, no audio yet), feeds it the turn's audio as it comes (`feed_turn`, PCM16
    mono at INPUT_SAMPLE_RATE, in order) and then either asks for the answer with a request
    naming the turn (`PipelineRequest.streamed_turn`, with the whole turn's audio as
    always), or drops it (`drop_turn`: cancelled, abandoned, interrupted). The engine does
    ahead what the turn's end would otherwise wait for, and keeps nothing of a dropped turn.

    Streaming is an optimisation, never a second meaning: the answer to a request naming a
    streamed turn is the answer to the same request with no streamed turn, and an engine
    that lost the turn (a restarted stage) or cannot use what it prepared answers from the
    request alone. One open turn per session: opening another drops the earlier one.
    Engines without this capability (the cascade, the OpenAI-compatible Thinker, Moshi)
    take every turn whole, as before; `streams_input` tells them apart."""

    @abstractmethod
    async def open_turn(self, turn_id: str, context: PipelineRequest) -> None: ...

    @abstractmethod
    async def feed_turn(self, turn_id: str, pcm: npt.NDArray[np.int16]) -> None:
        """More of the turn's audio; returns at once (the work runs behind it)."""

    @abstractmethod
    async def drop_turn(self, turn_id: str) -> None:
        """Forget the turn and all done for it (idempotent; an unknown id is no error)."""

    def streamed_turns(self) -> dict[str, int]:
        """How streamed turns ended so far, by outcome (for the metrics)."""
        return {}

    def takes_streamed_turns(self) -> bool:
        """Whether turns streamed to it are used now. True for an engine that has the
        capability itself; a stage's proxy in the main process (`stage_client.py`) says
        what the engine over its link said (False while it has said nothing)."""
        return True


def streams_input(engine: object) -> bool:
    """Whether `engine` takes a turn's input while it arrives (`StreamingInput`)."""
    return isinstance(engine, StreamingInput) and engine.takes_streamed_turns()


@runtime_checkable
class Pipeline(Protocol):
    """What a session calls: one request in, a stream of output chunks out.

    Closing the returned iterator (or cancelling the task iterating it) aborts the
    request in every stage. The stream always ends with exactly one End or ErrorChunk
    unless it is closed early.
    """

    name: str

    async def start(self) -> None: ...

    def generate(self, request: PipelineRequest) -> AsyncGenerator[OutputChunk, None]: ...

    async def close(self) -> None: ...

    def active_requests(self) -> int: ...

    async def forget_session(self, session_id: str) -> None:
        """The session has ended: every stage drops what it kept for it between turns."""
        ...

    def capacity(self) -> PipelineCapacity | None:
        """What the started pipeline can serve at once (its stages' `Engine.capacity()`
        combined); None when no stage states any (admission keeps its configured cap)."""
        ...


@runtime_checkable
class StreamsTurns(Protocol):
    """A pipeline that passes streamed turns (`StreamingInput`) on to its entry stage's
    engine, when that engine takes them: a session asks `streams_turns()`, and each call
    answers whether it was passed on (False: the pipeline cannot stream, and the turn is
    taken whole when its answer comes, as always)."""

    def streams_turns(self) -> bool:
        """Whether turns streamed now reach an engine that uses them."""
        ...

    async def open_turn(self, turn_id: str, context: PipelineRequest) -> bool: ...

    async def feed_turn(self, turn_id: str, pcm: npt.NDArray[np.int16]) -> bool: ...

    async def drop_turn(self, turn_id: str) -> bool: ...


def pipeline_streams_turns(pipeline: object) -> bool:
    """Whether a session should stream its turns to `pipeline` (`StreamsTurns`)."""
    return isinstance(pipeline, StreamsTurns) and pipeline.streams_turns()


@runtime_checkable
class ReportsStages(Protocol):
    """A pipeline that can say which of its stages cannot serve now (for `/readyz`)."""

    def stalled_stages(self) -> dict[str, str]:
        """Per stage that is down or stuck: why (see `Engine.stalled`)."""
        ...
