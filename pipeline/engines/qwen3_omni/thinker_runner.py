"""The Thinker, stepped one token at a time, with the hidden states the Talker needs.

transformers' `Qwen3OmniMoeForConditionalGeneration.generate` runs the whole Thinker first
and hands the Talker, per position, two hidden states: the embedding layer's output
(`hidden_states[0]`, which the Talker projects for text) and layer `accept_hidden_layer`'s
(which it projects for audio and image positions). Streaming needs the same per step, so
this runner prefills the prompt and then decodes token by token with its own KV cache:

- `prefill` returns the prompt's hidden states and the first reply token;
- each `step` feeds the last token and returns that position's hidden states and the next
  token. As in `generate`, the final token is never fed (it is normally `<|im_end|>`).

Positions are Qwen3-Omni's 3-D mRoPE ids. The model object keeps `rope_deltas` as shared
state between calls, which concurrent requests would trample, so the runner computes the
positions itself (`get_rope_index` at prefill, then prompt offset + step) and passes them in.
A `ThinkerState` is one request's cache and position; requests never share one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache, Qwen3OmniMoeConfig

from .audio_features import AudioInput
from .batch_cache import padding_mask, split_cache, stack_caches
from .config import TOKENS
from .host_states import HostStates, empty_states, to_host
from .prefill_batch import BatchedPrefill, PrefillRow
from .prefix_cache import PrefixCache
from .sampling import Sampling, choose_rows, pick
from .thinker_slots import ThinkerSlots
from .vision_input import VisionInput

Hidden = HostStates
"""float32, or a bfloat16 model's bit patterns (host_states.py)"""
GREEDY = Sampling()
MULTIMODAL = frozenset({TOKENS["audio"], TOKENS["image"], TOKENS["video"]})


@dataclass(frozen=True, slots=True)
class ThinkerPrompt:
    input_ids: list[int]
    audio: AudioInput | None = None
    vision: VisionInput | None = None


@dataclass(frozen=True, slots=True)
class ThinkerHidden:
    """Hidden states of some positions: [n, 2, hidden] (embedding output, accept layer)."""

    token_ids: list[int]
    states: Hidden


@dataclass(frozen=True, slots=True)
class ThinkerPast:
    """What a prefill goes on from (a session's earlier turns): the KV of the prompt's first
    `length` positions, their hidden states, and their mRoPE offset (the next position is
    `length + rope_delta`). The prefill leaves `cache` as it was (its batch copies it)."""

    cache: DynamicCache
    length: int
    rope_delta: int
    hidden: npt.NDArray[np.floating]
    staged: int = 0
    """positions of the prompt after `length` that `cache` and `hidden` hold already (a
    streamed turn's, `extend`): the prefill computes only those after them"""
    audio_frames: int = 0
    """of the prompt's audio, the frames whose positions are among the staged ones"""


@dataclass
class ThinkerState:
    cache: DynamicCache
    rope_delta: int
    length: int
    """positions in the cache"""
    next_token: int
    generated: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None


@dataclass(frozen=True, slots=True)
class _Planned:
    prompt: ThinkerPrompt
    row: PrefillRow
    total: int
    rope_delta: int
    earlier: npt.NDArray[np.floating] | None
    """hidden states of the positions before the row's (from the past or a cached prefix)"""
    text_end: int | None
    """a fresh prompt's text prefix (kept in the prefix cache); None: it went on from a past"""


@dataclass(frozen=True, slots=True)
class Extension:
    """A streamed turn's next part: `ids` (and their `audio`) after `past` (None: none)."""

    past: ThinkerPast | None
    ids: list[int]
    audio: AudioInput | None = None

    def start(self) -> int:
        """The mRoPE position of its first id."""
        past = self.past
        return past.length + past.rope_delta + past.staged if past is not None else 0


@dataclass(frozen=True, slots=True)
class StagingJob:
    """Streamed turns' next parts prefilled together (`ThinkerRunner.staging_job`)."""

    parts: list[Extension]
    batch: BatchedPrefill


@dataclass(frozen=True, slots=True)
class PrefillJob:
    """Prompts prefilled together: their plans and the batch that runs them."""

    planned: list[_Planned]
    batch: BatchedPrefill


def _with_media(row: PrefillRow, prompt: ThinkerPrompt, audio_from: int = 0) -> PrefillRow:
    return PrefillRow(
        row.input_ids, row.positions, row.past, prompt.audio, prompt.vision, audio_from
    )


def _one_by_one(start: int, count: int) -> torch.Tensor:
    """[3, count] mRoPE positions from `start` on, one a position (text's and audio's)."""
    return torch.arange(start, start + count).view(1, -1).expand(3, -1)


class ThinkerRunner:
    def __init__(
        self,
        model: Any,
        config: Qwen3OmniMoeConfig,
        *,
        sampling: Sampling = GREEDY,
        seed: int = 0,
        prefix_cache: PrefixCache | None = None,
        slots: ThinkerSlots | None = None,
        plain_fallback: bool = False,
    ) -> None:
        self.model = model
        self.slots = slots
        """Decode steps on cache rows (batched in place, captured on a GPU); None: plain."""
        self.plain_fallback = plain_fallback
        """With rows: a request that finds none is stepped the plain way (only where a graph
        file asks for it); False: that is a bug in whoever let it in (the row gate)."""
        self.plain_steps = 0
        """Plain decode steps run (requests stepped without a cache row), for tests and logs."""
        self.config = config
        self.sampling = sampling
        self.seed = seed
        self.prefix_cache = prefix_cache
        self.last_prefill_tokens = 0
        """How many prompt positions the latest prefill computed (the rest were reused)."""
        self.accept_layer = int(config.talker_config.accept_hidden_layer)
        self.eos_id = TOKENS["im_end"]
        self.device = next(model.parameters()).device
        self.hidden_size = int(config.thinker_config.text_config.hidden_size)

    def _hidden(self, hidden_states: tuple[torch.Tensor, ...]) -> Hidden:
        both = torch.stack((hidden_states[0][0], hidden_states[self.accept_layer][0]), dim=1)
        return to_host(both)

    def _choose(self, state: ThinkerState, logits: torch.Tensor, min_new_tokens: int) -> int:
        banned = None
        if len(state.generated) < min_new_tokens:
            banned = torch.tensor([self.eos_id], device=logits.device)
        token = pick(logits, self.sampling, state.generator, banned=banned, seen=state.generated)
        state.generated.append(token)
        return token

    @torch.inference_mode()
    def special_embeddings(self, token_ids: list[int]) -> Hidden:
        """The embedding layer's output for `token_ids` (the Talker's tts_bos/eos/pad)."""
        ids = torch.tensor([token_ids], device=self.device)
        embeds: torch.Tensor = self.model.get_input_embeddings()(ids)[0]
        return to_host(embeds)

    @torch.inference_mode()
    def prefill(
        self,
        prompt: ThinkerPrompt,
        *,
        min_new_tokens: int = 0,
        past: ThinkerPast | None = None,
        chunk_tokens: int = 0,
    ) -> tuple[ThinkerState, ThinkerHidden]:
        """Prefill `prompt` (all of it, or with `past` only what follows `past.length`: the
        prompt's media are then the new part's) and choose the first reply token;
        `chunk_tokens` positions at a time (0: all at once)."""
        job = self.prefill_job([(prompt, past)], chunk_tokens=chunk_tokens)
        job.batch.begin()
        while not job.batch.done:
            job.batch.run_chunk()
        return self.finish_prefill(job, min_new_tokens=min_new_tokens)[0]

    def prefill_job(
        self, prompts: list[tuple[ThinkerPrompt, ThinkerPast | None]], *, chunk_tokens: int = 0
    ) -> PrefillJob:
        """A prefill of several prompts as one batch (`prefill_batch.py`), `chunk_tokens`
        positions over all rows at a time (0: all at once): begin its batch, run its chunks
        until done, then `finish_prefill`. Every call on the model thread."""
        planned = [self._plan(prompt, past) for prompt, past in prompts]
        batch = BatchedPrefill(
            self.model,
            [plan.row for plan in planned],
            accept_layer=self.accept_layer,
            chunk_tokens=chunk_tokens,
        )
        return PrefillJob(planned, batch)

    def _plan(self, prompt: ThinkerPrompt, past: ThinkerPast | None) -> _Planned:
        """A prompt's mRoPE positions and what it goes on from (`past`, or a cached prefix of
        its text): the row it prefills."""
        ids = torch.tensor([prompt.input_ids])
        audio = prompt.audio
        audio_lengths = audio.mask.sum(dim=1) if audio is not None else None
        grid = prompt.vision.grid_thw if prompt.vision is not None else None
        total = ids.shape[1]
        if past is not None:
            # mRoPE goes on from the past's next position: the new part's own positions
            # (its media only) shifted there are the whole sequence's
            new = ids[:, past.length :]
            positions, deltas = self.model.get_rope_index(
                new, grid, None, torch.ones_like(new), False, audio_lengths, None
            )
            positions = positions + (past.length + past.rope_delta)
            staged = positions[:, 0, : past.staged]
            if not torch.equal(staged, _one_by_one(past.length + past.rope_delta, past.staged)):
                raise ValueError("a streamed turn's positions are not the prompt's")
            row = PrefillRow(
                prompt.input_ids[past.length + past.staged :],
                positions[:, 0, past.staged :],
                past.cache,
            )
            rope_delta = past.rope_delta + int(deltas.reshape(-1)[0])
            row = _with_media(row, prompt, past.audio_frames)
            return _Planned(prompt, row, total, rope_delta, past.hidden, None)
        positions, deltas = self.model.get_rope_index(
            ids, grid, None, torch.ones_like(ids), False, audio_lengths, None
        )
        rope_delta = int(deltas.reshape(-1)[0])
        text_end = next(
            (i for i, t in enumerate(prompt.input_ids) if t in MULTIMODAL), total
        )  # positions past here depend on this turn's media, not on the ids alone
        hit = None
        if self.prefix_cache is not None:
            hit = self.prefix_cache.lookup(prompt.input_ids[: min(text_end, total - 1)])
        start = hit.length if hit is not None else 0
        row = PrefillRow(
            prompt.input_ids[start:], positions[:, 0, start:], hit.cache if hit else None
        )
        earlier = hit.hidden if hit is not None else None
        return _Planned(prompt, _with_media(row, prompt), total, rope_delta, earlier, text_end)

    @torch.inference_mode()
    def extend(
        self, past: ThinkerPast | None, ids: list[int], audio: AudioInput | None = None
    ) -> ThinkerPast:
        """Prefill `ids` (text and audio placeholders, `audio` their audio) after `past`
        (None: from the start) and keep them as staged positions of a longer past: a
        streamed turn's next part (`streamed_turns.py`). Nothing is chosen; `past` is
        left as it was. Its mRoPE positions go on one by one, as text's and audio's do."""
        job = self.staging_job([Extension(past, ids, audio)])
        while not job.batch.done:
            job.batch.run_chunk()
        return self.finish_staging(job)[0]

    def staging_job(self, parts: list[Extension], *, chunk_tokens: int = 0) -> StagingJob:
        """`extend` for several turns as one batch (begun: run its chunks, then
        `finish_staging`), `chunk_tokens` positions over all rows at a time."""
        rows = []
        for part in parts:
            if MULTIMODAL.difference({TOKENS["audio"]}).intersection(part.ids):
                raise ValueError("only text and audio are prefilled ahead")
            start = part.start()
            past = part.past.cache if part.past is not None else None
            rows.append(PrefillRow(part.ids, _one_by_one(start, len(part.ids)), past, part.audio))
        batch = BatchedPrefill(
            self.model, rows, accept_layer=self.accept_layer, chunk_tokens=chunk_tokens
        )
        batch.begin()
        return StagingJob(parts, batch)

    @torch.inference_mode()
    def finish_staging(self, job: StagingJob) -> list[ThinkerPast]:
        """Each turn's longer past, its own cache and hidden states."""
        done = []
        for part, result in zip(job.parts, job.batch.finish(), strict=True):
            hidden = to_host(result.hidden)
            empty = empty_states(self.hidden_size, hidden)
            base = part.past or ThinkerPast(result.cache, 0, 0, empty)
            frames = int(part.audio.mask.sum()) if part.audio is not None else 0
            longer = ThinkerPast(
                result.cache,
                base.length,
                base.rope_delta,
                np.concatenate((base.hidden, hidden)),
                base.staged + len(part.ids),
                base.audio_frames + frames,
            )
            done.append(longer)
        return done

    @torch.inference_mode()
    def finish_prefill(
        self, job: PrefillJob, *, min_new_tokens: int = 0
    ) -> list[tuple[ThinkerState, ThinkerHidden]]:
        """Each prompt's state (its own cache, first reply token chosen) and hidden states."""
        done = []
        results = job.batch.finish()
        self.last_prefill_tokens = sum(len(plan.row.input_ids) for plan in job.planned)
        for plan, result in zip(job.planned, results, strict=True):
            hidden = to_host(result.hidden)
            if plan.earlier is not None:
                hidden = np.concatenate((plan.earlier, hidden))
            if self.prefix_cache is not None and plan.text_end is not None:
                self.prefix_cache.store(
                    plan.prompt.input_ids[: plan.text_end], result.cache, hidden
                )
            generator = None
            if self.sampling.temperature > 0:
                generator = torch.Generator().manual_seed(self.seed)
            state = ThinkerState(
                cache=result.cache,
                rope_delta=plan.rope_delta,
                length=plan.total,
                next_token=-1,
                generator=generator,
            )
            state.next_token = self._choose(state, result.logits, min_new_tokens)
            done.append((state, ThinkerHidden(list(plan.prompt.input_ids), hidden)))
        return done

    @torch.inference_mode()
    def step(self, state: ThinkerState, *, min_new_tokens: int = 0) -> ThinkerHidden:
        """Feed `state.next_token`; return its hidden states and choose the next token."""
        if self.slots is not None:
            return self.step_batch([state], min_new_tokens=min_new_tokens)[0]
        return self._step_one(state, min_new_tokens)

    def _step_one(self, state: ThinkerState, min_new_tokens: int) -> ThinkerHidden:
        fed = state.next_token
        ids = torch.tensor([[fed]], device=self.device)
        where = torch.tensor([state.length], device=self.device)
        positions = (where + state.rope_delta).view(1, 1, 1).expand(3, 1, 1)
        out = self.model(
            input_ids=ids,
            position_ids=positions,
            past_key_values=state.cache,
            use_cache=True,
            output_hidden_states=True,
            cache_position=where,
        )
        state.length += 1
        state.next_token = self._choose(state, out.logits[0, -1], min_new_tokens)
        return ThinkerHidden([fed], self._hidden(out.hidden_states))

    @torch.inference_mode()
    def step_batch(
        self, states: list[ThinkerState], *, min_new_tokens: int = 0
    ) -> list[ThinkerHidden]:
        """`step` for several requests in one forward pass (continuous batching)."""
        if self.slots is not None:
            return self._step_rows(states, min_new_tokens)
        return self._step_plain(states, min_new_tokens)

    def _step_plain(self, states: list[ThinkerState], min_new_tokens: int) -> list[ThinkerHidden]:
        """Per-request caches, padded into one batch and split again after the step."""
        self.plain_steps += len(states)
        if len(states) == 1:
            return [self._step_one(states[0], min_new_tokens)]
        fed = [state.next_token for state in states]
        ids = torch.tensor([[token] for token in fed], device=self.device)
        cache, pads = stack_caches([state.cache for state in states])
        longest = cache.get_seq_length()
        mask = padding_mask(pads, longest + 1, self.device)
        where = [state.length + state.rope_delta for state in states]
        positions = torch.tensor(where, device=self.device).view(1, -1, 1).expand(3, -1, 1)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            output_hidden_states=True,
            cache_position=torch.tensor([longest], device=self.device),
        )
        hidden = torch.stack((out.hidden_states[0], out.hidden_states[self.accept_layer]), dim=2)
        rows = to_host(hidden)
        results = []
        for row, (state, own_cache) in enumerate(
            zip(states, split_cache(cache, pads), strict=True)
        ):
            state.cache = own_cache
            state.length += 1
            state.next_token = self._choose(state, out.logits[row, -1], min_new_tokens)
            results.append(ThinkerHidden([fed[row]], rows[row]))
        return results

    def _step_rows(self, states: list[ThinkerState], min_new_tokens: int) -> list[ThinkerHidden]:
        """`step_batch` on cache rows; a request that gets no row is stepped the plain way
        where `plain_fallback` allows it, and is an error otherwise (the row gate in front
        lets no more requests run than there are rows, none longer than a row)."""
        slots = self.slots
        assert slots is not None
        seated = [state for state in states if slots.seat(state)]
        if len(seated) < len(states) and not self.plain_fallback:
            raise RuntimeError(
                f"{len(states) - len(seated)} of {len(states)} requests found no cache row "
                "(every row taken, or longer than a row) and plain_fallback is off"
            )
        results: dict[int, ThinkerHidden] = {}
        if seated:
            fed = [state.next_token for state in seated]
            hidden = slots.step(
                seated, lambda states, logits: self._choose_rows(states, logits, min_new_tokens)
            )
            rows = to_host(hidden)
            for row, state in enumerate(seated):
                results[id(state)] = ThinkerHidden([fed[row]], rows[row : row + 1])
        rest = [state for state in states if id(state) not in results]
        if rest:
            for state, done in zip(rest, self._step_plain(rest, min_new_tokens), strict=True):
                results[id(state)] = done
        return [results[id(state)] for state in states]

    def _choose_rows(
        self, states: list[ThinkerState], logits: torch.Tensor, min_new_tokens: int
    ) -> list[int]:
        """`_choose` for a batch, on the device, with one host sync."""
        early = [len(state.generated) < min_new_tokens for state in states]
        banned = None
        if any(early):
            banned = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
            banned[:, self.eos_id] = torch.tensor(early, device=logits.device)
        seen = []
        if self.sampling.repetition_penalty != 1.0:
            for state in states:
                mask = np.zeros(logits.shape[-1], dtype=np.bool_)
                mask[state.generated] = True
                seen.append(mask)
        chosen = choose_rows(logits, self.sampling, banned=banned, seen=seen)
        for state, token in zip(states, chosen, strict=True):
            state.generated.append(token)
        return chosen

    def release(self, state: ThinkerState, *, keep: bool = False) -> None:
        """The request is over: give its cache row back (with `keep`, its KV returns to
        `state.cache` first, for a session's next turn). Idempotent."""
        if self.slots is not None:
            self.slots.release(state, keep=keep)
