"""The `qwen3_omni.thinker` engine: a PipelineRequest in; reply text and hidden states out.

Chunks, in order: one HiddenStates for the prompt (`metadata["part"] == "prompt"`: the
positions the Talker reads, its user items and the reply's opening, with their token ids
(`host_states.for_the_talker`), the Thinker's embeddings of tts_bos/eos/pad, each audio's
feature length and each image's patch grid: everything the Talker's prompt needs, so the
Talker never holds the Thinker's embedding table), then per reply token a TextDelta as soon
as it is chosen and a HiddenStates (`part == "reply"`) once it has been fed. Reply text is
placeholder words ("tok123 ") under random weights and real text with a checkpoint's
tokenizer.

Random weights never choose `<|im_end|>`; `min_new_tokens` can hold it off for a real model
too, which gives the fixed reply lengths benchmarks need. A response's `max_output_tokens`
(OpenAI's) ends its reply sooner: at most that many tokens, `min_new_tokens` or not.

With `session_kv_tokens`, a session's KV survives between its turns (`session_kv.py`): a turn
that goes on from the session's last one prefills only what it adds. Its prompt chunk still
has the states of every user item, and the media of every placeholder, earlier turns'
included (`PromptMedia`): the Talker's prompt is the whole conversation's user items.

With `decode_rows`, a turn takes a cache row before its prefill, waiting for one or failing
`server_busy` (`row_gate.py`), and one longer than a row fails `context_length_exceeded`
(docs/engines/capacity.md).

A prompt and its reply's budget (`max_new_tokens`) fit `max_context`: a longer conversation
is cut as the request's `truncation` says (`context_fit.py`), its oldest items left out of
this turn's and the session's later prompts; a cut that changes the prompt's beginning
drops the session's KV entry (one full prefill). One that cannot be cut fails with
`context_length_exceeded`.

A spoken turn can be streamed while the user speaks (`StreamingInput`, `streamed_turns.py`):
its lead and finished audio windows are prefilled then, and the request that names it
prefills only the rest; docs/engines/streamed-prefill.md.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import AsyncGenerator
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from ...engine_limits import qwen3_omni_thinker
from ...memory_plan import TokenCache, rows_setting
from ...types import (
    Chunk,
    End,
    EntryEngine,
    ErrorChunk,
    HiddenStates,
    HistoryItem,
    PipelineRequest,
)
from ..context_fit import CONTEXT_LENGTH_EXCEEDED, ContextCuts, ContextExceeded
from .audio_features import AudioFeatures, AudioInput
from .config import TOKENS
from .fused_moe import install_fused_moe
from .host_states import for_the_talker
from .memory import CACHE_TOKENS_PER_ROW_DIVISOR
from .prefill_queue import PrefillQueue
from .prefill_timeline import log_turn
from .prefix_cache import PrefixCache
from .prompt import ChatParts, Vocab, chat_parts, load_vocab
from .prompt_fit import (
    LEAD_AUDIO_TOKENS,
    ContextLimits,
    FittedPrompt,
    Lead,
    lead_after_entry,
    lead_from_history,
)
from .sampling import Sampling
from .session_kv import (
    PromptMedia,
    Resumed,
    SessionKV,
    continuation,
)
from .stage import ModelStage
from .staging_queue import StagingQueue
from .step_batcher import StepBatcher
from .streamed_turns import StreamedTurns, TurnsStreamedIn
from .thinker_runner import ThinkerHidden, ThinkerPrompt, ThinkerRunner, ThinkerState
from .thinker_slots import ThinkerSlots
from .tool_calls import CallParser, history_turn, offered, tools_text
from .vision_input import TOKEN_PIXELS, FrameImages, VisionInput, warm_up_frame

DEFAULT_INSTRUCTIONS = "You are a helpful voice assistant."
logger = logging.getLogger(__name__)
SESSION_KV, PREFIX_CACHE = "session KV", "prefix cache"


class ThinkerEngine(ModelStage[ThinkerState], EntryEngine, TurnsStreamedIn):
    name = "qwen3_omni.thinker"
    part = "thinker"

    def __init__(
        self,
        *,
        max_new_tokens: int = 128,
        min_new_tokens: int = 0,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        default_instructions: str = DEFAULT_INSTRUCTIONS,
        image_max_pixels: int = 128 * TOKEN_PIXELS,
        prefix_cache_tokens: int | str = 0,
        session_kv_tokens: int | str = 0,
        session_kv_max_tokens: int = 0,
        prefill_batch: int = 8,
        prefill_chunk_tokens: int = 0,
        talker_prompt_tokens: int = 0,
        warm_up: bool | None = None,
        stream_turns: bool = True,
        **model: Any,
    ) -> None:
        super().__init__(**model)
        if prefill_batch < 1 or prefill_chunk_tokens < 0:
            raise ValueError("prefill_batch must be at least 1, prefill_chunk_tokens at least 0")
        self.prefill_batch = prefill_batch
        """Prompts prefilled together at most (those waiting when the model thread is free)."""
        self.prefill_chunk_tokens = prefill_chunk_tokens
        """A batched prefill runs this many positions (over all its prompts) at a time, and
        decode steps run between two chunks (0: a prefill runs whole)."""
        self.stream_turns = stream_turns
        """Take spoken turns while the user speaks (False: every turn whole, as an engine
        without the capability: the baseline the benchmarks measure streaming against)."""
        self.warm_up = torch.device(self.device).type == "cuda" if warm_up is None else warm_up
        """Prefill a made-up spoken turn with a camera frame, alone and batched, before the
        stage is ready, so that no request pays for first use (lazy inits, first shapes,
        cuBLAS workspaces). None: on a GPU, where first use costs (a CPU has little to warm)."""
        self.prefills: PrefillQueue | None = None
        self.streamed: StreamedTurns | None = None
        self._vocab_lock = threading.Lock()
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        self.max_new_tokens = max_new_tokens
        self.min_new_tokens = min_new_tokens
        qwen3_omni_thinker(
            {
                "max_new_tokens": max_new_tokens,
                "min_new_tokens": min_new_tokens,
                "max_context": self.max_context,
                "session_kv_tokens": session_kv_tokens,
                "session_kv_max_tokens": session_kv_max_tokens,
                "prefill_batch": prefill_batch,
                "prefill_chunk_tokens": prefill_chunk_tokens,
            }
        )
        if talker_prompt_tokens < 0:
            raise ValueError("talker_prompt_tokens must be at least 0")
        self.talker_prompt_tokens = talker_prompt_tokens
        """The Talker's prompt (the user items and this turn) is held to this many positions
        by the cut to the context too (0: no Talker, or no limit of its own). A graph file
        sets it from the Talker's arguments (`engine_limits.with_derived_limits`)."""
        self.sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p)
        self.default_instructions = default_instructions
        self.image_max_pixels = image_max_pixels
        """Each camera frame is scaled to at most this (32 x 32 pixels make one token)."""
        self.images: FrameImages | None = None
        self.warmed_rows: list[int] = []
        """The batch sizes the warm-up prefilled (empty: none ran)."""
        # --- sizing: the token caches, integers or `auto` (grown with the rows at start) ---
        per_row = self.max_context // CACHE_TOKENS_PER_ROW_DIVISOR
        self.token_caches = (
            TokenCache(SESSION_KV, rows_setting(session_kv_tokens, "session_kv_tokens"), per_row),
            TokenCache(
                PREFIX_CACHE, rows_setting(prefix_cache_tokens, "prefix_cache_tokens"), per_row
            ),
        )
        self.session_kv_max_tokens = session_kv_max_tokens
        self.prefix_cache_tokens = self._fixed_tokens(PREFIX_CACHE)
        """KV of this many prompt tokens is kept for later turns to reuse (0: none; `auto`:
        set at start)."""
        session_tokens = self._fixed_tokens(SESSION_KV)
        self.sessions = SessionKV(session_tokens, session_kv_max_tokens) if session_tokens else None
        """Sessions' KV kept between their turns: this many tokens over all sessions, at most
        `session_kv_max_tokens` (0: no limit of its own) for one (0: none kept; `auto`: made
        at start)."""
        self.cuts = ContextCuts()
        """The history items each session's cuts to `max_context` left out (context_fit.py)."""
        self.runner: ThinkerRunner | None = None
        self.vocab: Vocab | None = None
        self.features: AudioFeatures | None = None
        self.tts_embeds: np.ndarray[Any, Any] | None = None

    def _fixed_tokens(self, name: str) -> int:
        """The cache's integer budget (0 for `auto` until start sizes it)."""
        return next(c.budget(0) for c in self.token_caches if c.name == name)

    def _loaded(self) -> None:
        assert self.model is not None and self.config is not None
        if self.decode_rows:
            install_fused_moe(self.model)
        # sizing (stage.py `_size`): rows and token caches from the card, on a GPU
        budgets = self._size(self.config.thinker_config.text_config, self.token_caches)
        self.prefix_cache_tokens = budgets[PREFIX_CACHE]
        if self.sessions is None and budgets[SESSION_KV]:
            self.sessions = SessionKV(budgets[SESSION_KV], self.session_kv_max_tokens)
        prefixes = PrefixCache(self.prefix_cache_tokens) if self.prefix_cache_tokens else None
        slots = None
        if self.decode_rows:
            slots = ThinkerSlots(
                self.model,
                rows=self.decode_rows,
                max_length=self.max_context,
                accept_layer=int(self.config.talker_config.accept_hidden_layer),
                reserve=self.max_new_tokens,
                capture=self.capture_graphs,
                shortest=self.shortest_attention,
            )
            slots.warm()
        self.runner = ThinkerRunner(
            self.model,
            self.config,
            sampling=self.sampling,
            seed=self.seed,
            prefix_cache=prefixes,
            slots=slots,
            plain_fallback=self.plain_fallback,
        )
        self.vocab = load_vocab(self.model_path)
        mel_bins = int(self.config.thinker_config.audio_config.num_mel_bins)
        self.features = AudioFeatures(mel_bins, self.model_path)
        vision = self.config.thinker_config.vision_config
        self.images = FrameImages(
            patch_size=int(vision.patch_size),
            merge_size=int(vision.spatial_merge_size),
            temporal_patch_size=int(vision.temporal_patch_size),
            max_pixels=self.image_max_pixels,
        )
        special = [TOKENS["tts_bos"], TOKENS["tts_eos"], TOKENS["tts_pad"]]
        self.tts_embeds = self.runner.special_embeddings(special)
        if self.warm_up:
            self._warm()

    def _warm(self) -> None:
        """On the model thread, before the stage is ready: every prefill path once (media
        towers, a batch of one and a full batch, chunked as configured) and the decode
        steps after it. What it leaves behind (cached prefixes, cache rows) is let go."""
        runner = self.runner
        assert runner is not None
        turn = PipelineRequest(
            request_id="warm-up",
            audio=np.zeros(16_000 * 2, dtype=np.int16),
            frames=(warm_up_frame(),),
            text="Warming up.",
        )
        prompt = self._fitted_prompt(turn, None).prompt
        for rows in sorted({1, self.prefill_batch}):
            job = runner.prefill_job(
                [(prompt, None)] * rows, chunk_tokens=self.prefill_chunk_tokens
            )
            job.batch.begin()
            while not job.batch.done:
                job.batch.run_chunk()
            states = [state for state, _ in runner.finish_prefill(job)]
            runner.step_batch(states[: min(self.max_batch, self.decode_rows or self.max_batch)])
            for state in states:
                runner.release(state)
        if runner.prefix_cache is not None:
            runner.prefix_cache.clear()
        self.warmed_rows = sorted({1, self.prefill_batch})

    def _batcher(self) -> StepBatcher[ThinkerState, ThinkerHidden]:
        runner = self.runner
        assert runner is not None
        minimum = self.min_new_tokens

        def step(states: list[ThinkerState]) -> list[ThinkerHidden]:
            return runner.step_batch(states, min_new_tokens=minimum)

        return StepBatcher(self.name, self.thread, step, max_batch=self.max_batch)

    def _instructions(self, request: PipelineRequest) -> str:
        base = request.instructions or self.default_instructions
        tools = offered(request.tools, request.tool_choice or "auto")
        return f"{base}\n\n{tools_text(tools)}" if tools else base

    def _fitted_prompt(
        self, request: PipelineRequest, resumed: Resumed | None, planned: int = 0
    ) -> FittedPrompt:
        """On a prep thread (`PrefillQueue`): log-mel features, image patches and the chat
        prompt's ids, going on from the session's entry (its tokens, then only what the turn
        adds) where that fits `max_context`, else from the history, cut to fit as the
        request's truncation says (raises ContextExceeded where it cannot be); `planned`: the
        cut of the turn's streamed lead, kept where the turn fits with it (prompt_fit.py)."""
        assert self.features is not None and self.images is not None
        audio: AudioInput | None = self.features(request.audio)
        vision: VisionInput | None = self.images(request.frames)
        limits = self._limits(request)
        if resumed is not None:
            added = self._parts(request, resumed.added, audio, vision, instructions="")
            ids = resumed.entry.token_ids + resumed.entry.tail + added.ids()
            if limits.holds(ids):
                prompt = ThinkerPrompt(ids, audio, vision)
                return FittedPrompt(prompt, resumed.past(), 0, 0, resumed.entry.media)
        instructions = self._instructions(request)
        parts = self._parts(request, request.history, audio, vision, instructions=instructions)
        dropped = limits.cut(parts, request.truncation, planned)
        kept = parts.without_oldest(dropped)
        prompt = ThinkerPrompt(kept.ids(), audio, vision)
        return FittedPrompt(prompt, None, dropped, parts.tokens().total)

    def _limits(self, request: PipelineRequest) -> ContextLimits:
        talker = 0 if request.output_text_only else self.talker_prompt_tokens
        return ContextLimits(self.max_context, self.max_new_tokens, talker)

    def _parts(
        self,
        request: PipelineRequest,
        history: list[HistoryItem] | tuple[HistoryItem, ...],
        audio: AudioInput | None,
        vision: VisionInput | None,
        *,
        instructions: str,
        audio_tokens: int = 0,
    ) -> ChatParts:
        assert self.vocab is not None
        with self._vocab_lock:  # prompts are built on several threads; a tokenizer is one
            return chat_parts(
                self.vocab,
                instructions=instructions,
                history=[history_turn(item) for item in history],
                audio_tokens=audio.tokens if audio else audio_tokens,
                text=request.text,
                image_tokens=vision.tokens if vision else (),
            )

    def _cut(self, request: PipelineRequest, fitted: FittedPrompt) -> PipelineRequest:
        """Leave the items the fit dropped out of this and the session's later turns."""
        cut = self.cuts.cut(request, fitted.dropped)
        logger.info(
            "%s: %s: %d oldest of %d history items left out of the prompt (truncation %s): "
            "%d -> %d tokens, with %d for the reply in a context of %d",
            self.name,
            request.session_id or request.request_id,
            fitted.dropped,
            len(request.history),
            request.truncation.type,
            fitted.tokens,
            len(fitted.prompt.input_ids),
            self.max_new_tokens,
            self.max_context,
        )
        return cut

    # --- a session's KV between its turns ------------------------------------------------

    def _session_prompt(self, request: PipelineRequest) -> Resumed | None:
        if self.sessions is None:
            return None
        return self.sessions.resume(request, self._instructions(request))

    def _remember(
        self,
        request: PipelineRequest,
        prompt: ThinkerPrompt,
        state: ThinkerState,
        hidden: list[npt.NDArray[Any]],
        reply: str,
        media: PromptMedia,
    ) -> None:
        if self.sessions is None:
            return
        assert self.runner is not None
        self.sessions.keep_turn(
            request,
            instructions=self._instructions(request),
            prompt_ids=prompt.input_ids,
            state=state,
            hidden=hidden,
            reply=reply,
            media=media,
            eos_id=self.runner.eos_id,
        )

    # --- a turn streamed while the user speaks (streamed_turns.py) --------------------------

    def _lead(self, context: PipelineRequest) -> Lead | None:
        """Where a spoken turn after `context` goes on from, as `generate` would build it:
        from the session's entry where the turn fits after it, else from the history, cut
        as `generate` will cut it (None: it cannot be)."""
        context = self.cuts.view(context)
        instructions = self._instructions(context)
        limits = self._limits(context)
        entry = self.sessions.get(context.session_id) if self.sessions is not None else None
        if entry is not None and context.item_ids:
            added = continuation(
                entry, instructions=instructions, item_ids=context.item_ids, history=context.history
            )
            if added is not None:
                parts = self._parts(context, added, None, None, instructions="", audio_tokens=1)
                if (lead := lead_after_entry(entry, parts, limits)) is not None:
                    return lead
        parts = self._parts(
            context,
            context.history,
            None,
            None,
            instructions=instructions,
            audio_tokens=LEAD_AUDIO_TOKENS,
        )
        return lead_from_history(parts, limits, context.truncation)

    def _row_memory(self) -> int:
        slots = self.runner.slots if self.runner is not None else None
        return slots.decoder.cache.nbytes if slots is not None else 0

    async def forget_session(self, session_id: str) -> None:
        if self.streamed is not None:
            await self.streamed.forget_session(session_id)
        self.cuts.forget(session_id)
        if self.sessions is not None:
            self.sessions.forget(session_id)

    async def start(self) -> None:
        if self.model is not None:
            return
        await super().start()
        assert self.runner is not None
        self.prefills = PrefillQueue(
            self.name,
            self.thread,
            self.runner,
            max_batch=self.prefill_batch,
            chunk_tokens=self.prefill_chunk_tokens,
            min_new_tokens=self.min_new_tokens,
        )
        self.prefills.start()
        if not self.stream_turns:
            return
        assert self.features is not None
        staging = StagingQueue(
            self.name,
            self.thread,
            self.runner,
            decode=self.batcher,
            max_batch=self.prefill_batch,
            chunk_tokens=self.prefill_chunk_tokens,
        )
        staging.start()
        self.streamed = StreamedTurns(
            self.name,
            staging,
            self.features,
            self._lead,
            max_positions=self.max_context - self.max_new_tokens,
        )

    async def close(self) -> None:
        if self.streamed is not None:
            await self.streamed.close()
            self.streamed = None
        if self.prefills is not None:
            await self.prefills.close()
            self.prefills = None
        if self.sessions is not None:
            self.sessions.clear()
        await super().close()

    async def generate(
        self, request_id: str, request: PipelineRequest, /
    ) -> AsyncGenerator[Chunk, None]:
        runner, vocab = self.runner, self.vocab
        if runner is None or vocab is None:
            yield ErrorChunk(message="the thinker was not started", stage=self.name)
            return
        if request.transcribe_only:  # no transcript of its own: it answers the audio directly
            yield End()
            return
        self._requests.begin(request_id)
        began = time.perf_counter()
        remembered = False
        held: ThinkerState | None = None
        gate = self.rows
        try:
            if (refused := await self._take_row(request_id)) is not None:
                if isinstance(refused, ErrorChunk):
                    yield refused
                return  # a chunk saying why, or aborted while it waited
            row_at = time.perf_counter()
            request = self.cuts.view(request)  # less what earlier cuts left out
            streamed = self.streamed
            staged = None
            if streamed is not None and request.streamed_turn:
                staged = await streamed.take(request)
            resumed = self._session_prompt(request)
            planned = staged.lead.dropped if staged is not None else 0
            assert self.prefills is not None
            try:
                fitted = await self.prefills.prepare(
                    functools.partial(self._fitted_prompt, request, resumed, planned)
                )
            except ContextExceeded as exc:
                logger.info("%s: %s: %s", self.name, request.session_id or request_id, exc)
                code = CONTEXT_LENGTH_EXCEEDED
                yield ErrorChunk(message=str(exc), stage=self.name, code=code)
                return
            built_at = time.perf_counter()
            past = fitted.past
            if staged is not None and streamed is not None:  # what it prefilled, if it fits
                entry = resumed.entry if resumed is not None and past is not None else None
                past = streamed.past_for(staged, fitted.prompt, entry) or past
            if fitted.dropped:
                request = self._cut(request, fitted)
            submitted_at = time.perf_counter()
            prompt, state, hidden, times = await self.prefills.submit(fitted.prompt, past)
            held = state
            log_turn(
                request.session_id or request_id,
                began=began,
                row_at=row_at,
                built_at=built_at,
                submitted_at=submitted_at,
                first_at=time.perf_counter(),
                times=times,
                staged=past.staged if past is not None else 0,
            )
            if self._requests.aborted(request_id):
                return  # aborted
            self._requests.set_state(request_id, state)
            fed = [hidden.states]
            reply: list[str] = []
            budget = min(self.max_new_tokens, request.max_output_tokens or self.max_new_tokens)
            calls = CallParser()  # the reply's text, with any <tool_call> read out of it
            media = fitted.earlier.then(prompt.audio, prompt.vision)
            talker_ids, talker_states = for_the_talker(hidden.token_ids, hidden.states)
            yield HiddenStates(
                array=talker_states,
                metadata={
                    "part": "prompt",
                    "token_ids": talker_ids,
                    "tts_embeds": self.tts_embeds,
                    "audio_feature_lengths": list(media.audio_lengths),
                    "image_grid_thw": [list(grid) for grid in media.image_grids],
                },
            )
            assert self.batcher is not None
            with self.batcher.member():
                for produced in range(1, budget + 1):
                    if self._requests.aborted(request_id):
                        return  # aborted
                    token = state.next_token
                    if token == runner.eos_id:
                        break
                    reply.append(vocab.decode(token))
                    for chunk in calls.feed(reply[-1]):
                        yield chunk
                    if produced == budget:
                        break  # as in generate(), the last token is chosen but never fed
                    step: ThinkerHidden = await self.batcher.step(state)
                    if self._requests.aborted(request_id):
                        return  # aborted
                    fed.append(step.states)
                    yield HiddenStates(
                        array=step.states, metadata={"part": "reply", "token_ids": step.token_ids}
                    )
            if self.sessions is not None:  # its KV, out of its cache row, for the next turn
                await self.thread.call(runner.release, state, keep=True)
            self._remember(request, prompt, state, fed, "".join(reply), media)
            remembered = True
            for chunk in calls.finish():
                yield chunk
            yield End()
        finally:
            if not remembered and self.sessions is not None:
                self.sessions.forget(request.session_id)  # an aborted turn is a truncated one
            self._requests.end(request_id)
            if held is not None:  # finished, aborted or cancelled: its cache row goes back
                self.thread.post(runner.release, held)
            if gate is not None:  # after the release, which the model thread runs first
                gate.give_back(request_id)
