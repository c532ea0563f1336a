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
from .prefix_cache import PrefixCache
from .sampling import Sampling, choose_rows, pick
from .thinker_slots import ThinkerSlots
from .vision_input import VisionInput

Hidden = npt.NDArray[np.float32]
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
    `length + rope_delta`). The prefill extends `cache` in place."""

    cache: DynamicCache
    length: int
    rope_delta: int
    hidden: npt.NDArray[np.floating]


@dataclass
class ThinkerState:
    cache: DynamicCache
    rope_delta: int
    length: int
    """positions in the cache"""
    next_token: int
    generated: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None


class ThinkerRunner:
    def __init__(
        self,
        model: Any,
        config: Qwen3OmniMoeConfig,
        *,
        sampling: Sampling = GREEDY,
        seed: int = 0,
        hidden_dtype: type[np.floating] = np.float32,
        prefix_cache: PrefixCache | None = None,
        slots: ThinkerSlots | None = None,
    ) -> None:
        self.model = model
        self.slots = slots
        """Decode steps on cache rows (batched in place, captured on a GPU); None: plain."""
        self.config = config
        self.sampling = sampling
        self.seed = seed
        self.hidden_dtype = hidden_dtype
        self.prefix_cache = prefix_cache
        self.last_prefill_tokens = 0
        """How many prompt positions the latest prefill computed (the rest were reused)."""
        self.accept_layer = int(config.talker_config.accept_hidden_layer)
        self.eos_id = TOKENS["im_end"]
        self.device = next(model.parameters()).device
        self.hidden_size = int(config.thinker_config.text_config.hidden_size)

    def _hidden(self, hidden_states: tuple[torch.Tensor, ...]) -> Hidden:
        both = torch.stack((hidden_states[0][0], hidden_states[self.accept_layer][0]), dim=1)
        return both.float().cpu().numpy().astype(self.hidden_dtype, copy=False)

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
        return embeds.float().cpu().numpy().astype(self.hidden_dtype, copy=False)

    @torch.inference_mode()
    def prefill(
        self, prompt: ThinkerPrompt, *, min_new_tokens: int = 0, past: ThinkerPast | None = None
    ) -> tuple[ThinkerState, ThinkerHidden]:
        """Prefill `prompt` (all of it, or with `past` only what follows `past.length`: the
        prompt's media are then the new part's) and choose the first reply token."""
        ids = torch.tensor([prompt.input_ids], device=self.device)
        mask = torch.ones_like(ids)
        audio = prompt.audio
        features = feature_mask = audio_lengths = None
        if audio is not None:
            features = audio.features.to(self.device, self.model.dtype)
            feature_mask = audio.mask.to(self.device)
            audio_lengths = feature_mask.sum(dim=1)
        pixels = grid = None
        if prompt.vision is not None:
            pixels = prompt.vision.pixel_values.to(self.device, self.model.dtype)
            grid = prompt.vision.grid_thw.to(self.device)
        total = ids.shape[1]
        hit = None
        earlier: npt.NDArray[np.floating] | None
        if past is not None:
            start, cache, earlier = past.length, past.cache, past.hidden
            # mRoPE goes on from the past's next position: the new part's own positions
            # (its media only) shifted there are the whole sequence's
            new = ids[:, start:]
            positions, deltas = self.model.get_rope_index(
                new, grid, None, torch.ones_like(new), False, audio_lengths, None
            )
            positions = positions + (start + past.rope_delta)
            rope_delta = past.rope_delta + int(deltas.reshape(-1)[0])
        else:
            positions, deltas = self.model.get_rope_index(
                ids, grid, None, mask, False, audio_lengths, None
            )
            rope_delta = int(deltas.reshape(-1)[0])
            text_end = next(
                (i for i, t in enumerate(prompt.input_ids) if t in MULTIMODAL), total
            )  # positions past here depend on this turn's media, not on the ids alone
            if self.prefix_cache is not None:
                hit = self.prefix_cache.lookup(prompt.input_ids[: min(text_end, total - 1)])
            start = hit.length if hit is not None else 0
            cache = hit.cache if hit is not None else DynamicCache()
            earlier = hit.hidden if hit is not None else None
            positions = positions[:, :, start:]
        out = self.model(
            input_ids=ids[:, start:],
            input_features=features,
            feature_attention_mask=feature_mask,
            pixel_values=pixels,
            image_grid_thw=grid,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            output_hidden_states=True,
            cache_position=torch.arange(start, total, device=self.device),
        )
        self.last_prefill_tokens = total - start
        hidden = self._hidden(out.hidden_states)
        if earlier is not None:
            hidden = np.concatenate((earlier, hidden))
        if self.prefix_cache is not None and past is None:
            self.prefix_cache.store(prompt.input_ids[:text_end], cache, hidden)
        generator = None
        if self.sampling.temperature > 0:
            generator = torch.Generator().manual_seed(self.seed)
        state = ThinkerState(
            cache=cache,
            rope_delta=rope_delta,
            length=total,
            next_token=-1,
            generator=generator,
        )
        state.next_token = self._choose(state, out.logits[0, -1], min_new_tokens)
        return state, ThinkerHidden(list(prompt.input_ids), hidden)

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
        rows = hidden.float().cpu().numpy().astype(self.hidden_dtype, copy=False)
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
        """`step_batch` on cache rows; a request that gets no row is stepped the plain way."""
        slots = self.slots
        assert slots is not None
        seated = [state for state in states if slots.seat(state)]
        results: dict[int, ThinkerHidden] = {}
        if seated:
            fed = [state.next_token for state in seated]
            hidden = slots.step(
                seated, lambda states, logits: self._choose_rows(states, logits, min_new_tokens)
            )
            rows = hidden.numpy().astype(self.hidden_dtype, copy=False)
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
