"""The cascade's Thinker: the user's turn in, the assistant's reply out as streamed text.

A spoken turn is transcribed by the `recognizer` engine argument's recogniser, Whisper base
by default or pocketsphinx (`asr.py`; the transcript is streamed first, as an
`input_transcript` delta); the camera frames become one sentence of context (`vision.py`); the
instructions, that context, the history and the user's words become a chat prompt for
SmolLM2-135M-Instruct, whose reply streams out token by token.

At a pause in the user's speech the session asks for the words so far and, for semantic_vad,
whether they sound finished (`judge_turn_end`): the same SmolLM2 scores the end of the user's
message after them (`turn_end_model.py`; ~80 ms), and the verdict follows the transcript.
With a `draft_recognizer` (Whisper tiny.en in the shipped cascade, ~75 ms a question
against base's ~210), a pause's words come twice when the session asks
(`draft_transcript`): tiny.en's first, with their verdict, so that the answer and the turn's
end can go ahead on them, then base's, the words of record (judged again only if they
differ). tiny.en is English only: a session in another language gets no draft.

Batching: every request's prompt goes to one `TextGenerator`, whose model thread runs the
prompts that arrive together (within `batch_window_ms` of each other, or while a batch runs)
as one batched `generate`; see `textgen.py`. Transcription happens before that, in a thread,
one utterance at a time (Whisper base takes ~150 ms for a short question, pocketsphinx ~300 ms).

Torch's thread count is process-wide, and the `threads` engine argument sets it (the cascade
config asks for 1). Alone on this 2-core machine, two threads decode a token of float32
SmolLM2 in ~17-20 ms against ~52 ms on one; with another process busy on a core they were
ruinous while OpenMP's idle threads spun, and fall back to about the one-thread speed now that
a worker's idle threads sleep (see `pipeline/worker.py`; `python -m loadtest.thinker_bench`).
The cascade takes one: the other core is Piper's, and with two the first clause's audio came
later. The `weights` engine argument "int8" holds the matrices as int8 (`int8_weights.py`),
~1.8x faster to decode.

The prompt's KV is reused between requests (`prefix_cache.py`): a conversation's next turn
prefills only what it adds. To keep that prefix stable when a conversation outgrows the
context, the oldest turns are dropped several at a time (`TRIM_MESSAGES`), not one exchange
per turn, which would change the prompt's start, and so cost a full prefill, at every turn.
That is the session's `truncation` `auto` and `retention_ratio` alike (the chunked cut already
keeps the prefix stable, and the context is a CPU latency budget, not the model's limit);
`disabled` fails the response with `context_length_exceeded` instead of cutting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import replace
from pathlib import Path

import torch

from ...engine_limits import cascade_thinker
from ...requests import RequestTracker
from ...tasks import TaskSet
from ...types import Chunk, End, EntryEngine, ErrorChunk, PipelineRequest, TextDelta
from ...word_match import same_words
from ..context_fit import CONTEXT_LENGTH_EXCEEDED, ContextExceeded
from .asr import DEFAULT_RECOGNIZER, RECOGNIZERS, Recognizer, make_recognizer
from .smollm import DEFAULT_FILE, DEFAULT_PACKAGE, WEIGHTS, LanguageModel, load_language_model
from .textgen import GenerationFailed, TextGenerator
from .tool_decoding import CallConstraint, ToolGrammarError, prepare
from .tool_prompt import call_grammar, history_messages, tools_system_text
from .tool_stream import CallCutOff, CallReader
from .transcript import Transcript
from .turn_end_model import TurnEndModel
from .vision import describe_frames

DEFAULT_INSTRUCTIONS = "You are a helpful voice assistant. Answer in one or two short sentences."
NOT_HEARD = "Sorry, I did not catch that."
CALL_THRESHOLD = -6.0
CALL_THRESHOLDS = {"fp32": CALL_THRESHOLD, "int8": -5.5}
"""The default call threshold per weight format: int8 weights raise log P(call marker) by
~0.4 on every prompt of `loadtest.tool_calls`, so the same decisions need a higher bar."""
TRIM_MESSAGES = 16
"""Messages dropped at a time from the start of a conversation that outgrows the context.
A trim costs the next turn a prefill of all that is kept (the prompt's start changed), so
the more it drops, the rarer and the cheaper that turn is: with 8 the 512-token context
trimmed every fourth turn and kept ~400 tokens, and those turns' first audio came ~450 ms
late (`voice_bench --n 20`, one session); 16 keeps the last few exchanges."""
SPEAK_FIRST = "(The user is waiting for you to speak.)"
"""The user turn of a request that has none (response.create with instructions only): with
no user turn at all SmolLM2 repeats its system message ("Greet the user warmly." back)."""


def may_call(request: PipelineRequest) -> bool:
    """Whether this turn may call a tool (and so lists the tools in its prompt).

    Not with no tools or tool_choice none, and not (under auto) in the turn that follows a
    tool's output with no new user input: that turn answers with the output. Listing the
    tools there made SmolLM2 copy its previous call instead of answering; without them it
    said "a temperature of 21 degrees Celsius and a sunny sky"."""
    choice = request.tool_choice or "auto"
    if not request.tools or choice == "none":
        return False
    answering = bool(request.history) and request.history[-1].kind == "function_call_output"
    new_input = bool(request.text) or bool(len(request.audio))
    return choice != "auto" or new_input or not answering


def _multilingual(recognizer: Recognizer) -> bool:
    return bool(getattr(recognizer, "multilingual", False))


def _page_in(lm: LanguageModel) -> None:
    """Run one tiny forward pass before the stage says it is ready.

    The weights are memory-mapped and read lazily: the first answer used to fault in all
    of them (+530 MB of RSS, float32 SmolLM2-135M) and paid for it in latency. Touching them
    here makes the worker's memory its steady size from the start: over 40 aborted answers
    it then stays within a few MB (`python -m loadtest.worker_memory`)."""
    with torch.inference_mode():
        lm.model(input_ids=torch.tensor([[lm.pad_token_id]]))


class ThinkerEngine(EntryEngine):
    """Streams TextDelta chunks: the input transcript (if the turn was spoken), then the reply."""

    name = "cascade.thinker"

    def __init__(
        self,
        *,
        max_new_tokens: int = 64,
        batch_window_ms: float = 20.0,
        max_batch: int = 8,
        threads: int = 1,
        model_package: str = DEFAULT_PACKAGE,
        model_file: str = DEFAULT_FILE,
        cache_dir: str | None = None,
        default_instructions: str = DEFAULT_INSTRUCTIONS,
        context_tokens: int = 1024,
        max_call_tokens: int = 256,
        call_threshold: float | None = None,
        recognizer: str = DEFAULT_RECOGNIZER,
        draft_recognizer: str = "none",
        weights: str = "fp32",
    ) -> None:
        self.max_new_tokens = max_new_tokens
        self.max_call_tokens = max_call_tokens
        """A tool call's budget (its arguments are bounded by the schema, see tool_prompt); a
        call that still outgrows it ends in an ErrorChunk, never in arguments that do not parse."""
        if weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, not {weights!r}")
        self.call_threshold = CALL_THRESHOLDS[weights] if call_threshold is None else call_threshold
        """tool_choice auto calls a tool when log P(call marker) at the first step is at least
        this (tool_decoding.py; measured by `python -m loadtest.tool_calls`); by default the
        weight format's (`CALL_THRESHOLDS`)."""
        cascade_thinker({"max_new_tokens": max_new_tokens, "context_tokens": context_tokens})
        self.context_tokens = context_tokens
        """Prompt plus reply stay within this many tokens: older turns are dropped first.
        SmolLM2 takes far more, but on a CPU a long prompt costs first-token latency."""
        self.batch_window_ms = batch_window_ms
        self.max_batch = max_batch
        self.threads = threads
        self.model_package = model_package
        self.model_file = model_file
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.default_instructions = default_instructions
        self.recognizer = recognizer
        """Which speech recogniser transcribes spoken turns: "whisper" or "pocketsphinx"."""
        if recognizer not in RECOGNIZERS:
            raise ValueError(
                f"recognizer must be one of {', '.join(RECOGNIZERS)}, not {recognizer!r}"
            )
        if draft_recognizer != "none" and draft_recognizer not in RECOGNIZERS:
            raise ValueError(
                f"draft_recognizer must be none or one of {', '.join(RECOGNIZERS)}, "
                f"not {draft_recognizer!r}"
            )
        self.draft_recognizer = draft_recognizer
        """A quicker recogniser whose words a pause's transcription sends first when the
        session asks (`PipelineRequest.draft_transcript`), or "none"."""
        self.weights = weights
        """How SmolLM2's Linear layers are held: "fp32", or "int8" per output channel
        (`int8_weights.py`), which decodes faster on a CPU (`loadtest.thinker_bench`)."""
        self._lm: LanguageModel | None = None
        self._recognizer: Recognizer | None = None
        self._draft: Recognizer | None = None
        self._turn_end: TurnEndModel | None = None
        self._generator: TextGenerator | None = None
        self._requests: RequestTracker[None] = RequestTracker()

    @property
    def batch_size(self) -> int:
        """How many requests the most recent batch served."""
        return self._generator.last_batch_size if self._generator else 0

    @property
    def reused_prompt_tokens(self) -> int:
        """How many tokens of the latest single request's prompt came from kept KV."""
        return self._generator.prefixes.reused_tokens if self._generator else 0

    def forget_prompts(self) -> None:
        """Drop the kept KV (the next prompts prefill in full)."""
        if self._generator is not None:
            self._generator.prefixes.forget()

    async def start(self) -> None:
        if self._generator is not None:
            return
        self._lm = await asyncio.to_thread(self._load)
        self._turn_end = await asyncio.to_thread(TurnEndModel, self._lm)
        self._recognizer = await asyncio.to_thread(make_recognizer, self.recognizer)
        if self.draft_recognizer != "none":
            self._draft = await asyncio.to_thread(make_recognizer, self.draft_recognizer)
        self._generator = TextGenerator(
            self._lm, window_s=self.batch_window_ms / 1000, max_batch=self.max_batch
        )

    def _load(self) -> LanguageModel:
        torch.set_num_threads(self.threads)
        lm = load_language_model(
            self.model_package, self.model_file, self.cache_dir, weights=self.weights
        )
        _page_in(lm)
        prepare(lm)
        return lm

    def stalled(self, bound_s: float) -> str | None:
        return self._generator.watch.stalled(bound_s) if self._generator else None

    async def close(self) -> None:
        self._requests.clear()
        generator, self._generator = self._generator, None
        if generator is not None:
            await generator.close()

    def active_requests(self) -> int:
        return len(self.request_ids())

    def request_ids(self) -> set[str]:
        """The requests holding any state here (the engine's or the model thread's)."""
        held = self._generator.request_ids() if self._generator else set()
        return self._requests.ids() | held

    async def abort(self, request_id: str) -> None:
        self._requests.abort(request_id)
        if self._generator is not None:
            self._generator.cancel(request_id)

    async def generate(
        self, request_id: str, request: PipelineRequest
    ) -> AsyncGenerator[Chunk, None]:
        generator, recognizer = self._generator, self._recognizer
        if generator is None or recognizer is None or self._lm is None:
            yield ErrorChunk(message="the thinker was not started", stage=self.name)
            return
        with self._requests.track(request_id):
            if request.transcribe_only:  # the turn's words only: no answer follows yet
                async for chunk in self._transcribe_only(request_id, request, recognizer):
                    yield chunk
                return
            user_text = request.text or ""
            if len(request.audio):
                if request.transcript is not None:  # recognised at the turn's pause
                    transcript = Transcript(request.transcript)
                else:
                    transcript = await asyncio.to_thread(
                        recognizer.recognise, request.audio, request.recognition
                    )
                if self._requests.aborted(request_id):
                    return  # while transcribing
                heard = transcript.text
                if heard:
                    yield TextDelta(heard, kind="input_transcript", logprobs=transcript.logprobs)
                user_text = " ".join(t for t in (user_text, heard) if t)
            if len(request.audio) and not user_text.strip():
                yield TextDelta(text=NOT_HEARD)  # a spoken turn with nothing heard
                yield End()
                return
            frames = request.frames
            scene = await asyncio.to_thread(describe_frames, frames) if frames else ""
            if self._requests.aborted(request_id):
                return  # while looking at the frames
            try:
                prompt = self.chat_prompt(request, user_text, scene)
            except ContextExceeded as exc:
                yield ErrorChunk(message=str(exc), stage=self.name, code=CONTEXT_LENGTH_EXCEEDED)
                return
            budget = min(self.max_new_tokens, request.max_output_tokens or self.max_new_tokens)
            try:  # off the loop: llguidance compiles a large schema for a while
                constraint = await asyncio.to_thread(self.tool_constraint, request, budget)
            except ToolGrammarError as exc:
                yield ErrorChunk(message=f"tools: {exc}", stage=self.name)
                return
            if self._requests.aborted(request_id):
                return  # while compiling the tools' grammar
            if constraint is not None and constraint.calling is not False:
                budget = max(budget, self.max_call_tokens)
            stream = generator.stream(request_id, prompt, budget, constraint)
            reader: CallReader | None = None
            async with contextlib.aclosing(stream):
                try:
                    async for text in stream:
                        if constraint is not None and reader is None and constraint.calling:
                            reader = CallReader()
                        if reader is None:
                            yield TextDelta(text=text)
                        else:
                            for delta in reader.feed(text):
                                yield delta
                    if reader is not None:
                        yield reader.finish()
                except (GenerationFailed, CallCutOff) as exc:
                    yield ErrorChunk(message=str(exc), stage=self.name)
                    return
            if not self._requests.aborted(request_id):
                yield End()

    async def _transcribe_only(
        self, request_id: str, request: PipelineRequest, recognizer: Recognizer
    ) -> AsyncGenerator[Chunk, None]:
        """A turn's words (a draft first if asked and there is a draft recogniser for the
        language), each with its verdict if asked, then End. The final recognition runs
        beside the draft's, not after it: an answer begun on the draft waits for the final
        words before it is heard, so they are on the critical path."""
        hints, draft = request.recognition, ""
        if not len(request.audio):
            yield End()
            return
        drafter = self._draft if request.draft_transcript else None
        if drafter is not None and not (hints.language in ("", "en") or _multilingual(drafter)):
            drafter = None  # tiny.en hears English only
        if request.transcript is not None:  # recognised already: no draft, no recogniser
            drafter = None

        async def final_words() -> Transcript:
            if request.transcript is not None:
                return Transcript(request.transcript)
            return await asyncio.to_thread(recognizer.recognise, request.audio, hints)

        async with TaskSet(f"{self.name}:{request_id}:words") as beside:  # closed: cancelled
            final = beside.create_task(final_words(), log_failure=False)  # (its thread ends)
            if drafter is not None:
                drafted = await asyncio.to_thread(
                    drafter.recognise, request.audio, replace(hints, logprobs=False)
                )
                if self._requests.aborted(request_id):
                    return
                draft = drafted.text
                if draft:
                    yield TextDelta(draft, kind="draft_transcript")
                    if request.judge_turn_end and (verdict := await self._verdict(draft)):
                        yield verdict
            transcript = await final
        if self._requests.aborted(request_id):
            return
        heard = transcript.text
        if heard:
            yield TextDelta(heard, kind="input_transcript", logprobs=transcript.logprobs)
            judged = bool(draft) and same_words(draft, heard)  # its verdict stands
            if request.judge_turn_end and not judged and (verdict := await self._verdict(heard)):
                yield verdict
        yield End()

    async def _verdict(self, words: str) -> TextDelta | None:
        """Whether `words` sound like a whole turn, as a `turn_end` delta (None: no judge,
        or it cannot tell)."""
        if self._turn_end is None:
            return None
        finished = await asyncio.to_thread(self._turn_end.sounds_finished, words)
        if finished is None:
            return None
        return TextDelta(text="finished" if finished else "unfinished", kind="turn_end")

    def tool_constraint(self, request: PipelineRequest, text_tokens: int) -> CallConstraint | None:
        """The decoding rule for a request's tools: None with no tools and no calls in the
        history; words only (no call marker) when the turn may not call."""
        choice = request.tool_choice or "auto"
        if self._lm is None:
            return None
        if not may_call(request):
            if not request.tools and all(i.kind == "message" for i in request.history):
                return None
            return CallConstraint(self._lm, None, mode="text", text_tokens=text_tokens)
        tools = request.tools
        if choice not in ("auto", "required"):
            tools = tuple(t for t in request.tools if t.name == choice)
            if not tools:
                raise ToolGrammarError(f"tool_choice {choice!r} names none of the tools")
        return CallConstraint(
            self._lm,
            call_grammar(tools),
            mode="auto" if choice == "auto" else "call",
            threshold=self.call_threshold,
            text_tokens=text_tokens,
        )

    def chat_prompt(self, request: PipelineRequest, user_text: str, scene: str = "") -> str:
        """The chat prompt, rendered with the model's own template (after `start`)."""
        system = [request.instructions.strip() or self.default_instructions]
        system += [
            item.text
            for item in request.history
            if item.role == "system" and item.kind == "message"
        ]
        if scene:
            system.append(f"What the camera shows: {scene}")
        if may_call(request):
            system.append(tools_system_text(request.tools))
        turns = history_messages(request.history)
        said = [{"role": "user", "content": user_text.strip()}] if user_text.strip() else []
        if not said and (not turns or turns[-1]["role"] != "user"):
            said = [{"role": "user", "content": SPEAK_FIRST}]  # instructions only: a greeting
        if self._lm is None:
            raise RuntimeError("the thinker was not started")
        tokenizer = self._lm.tokenizer
        budget = self.context_tokens - self.max_new_tokens
        while True:  # the oldest turns go first when the conversation outgrows the context
            messages = [
                {"role": "system", "content": "\n".join(system)},
                *turns,
                *said,
            ]
            prompt = str(
                tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            )
            needed = len(tokenizer(prompt).input_ids)
            if not turns or needed <= budget:
                return prompt
            if request.truncation.type == "disabled":  # the session forbids the cut
                raise ContextExceeded(
                    f"the conversation needs {needed} tokens plus {self.max_new_tokens} for "
                    f"the reply, more than the context of {self.context_tokens} tokens, and "
                    "the session's truncation is disabled"
                )
            # a few long turns too many: an exchange at a time, so the latest ones stay
            del turns[: TRIM_MESSAGES if len(turns) > TRIM_MESSAGES else 2]
