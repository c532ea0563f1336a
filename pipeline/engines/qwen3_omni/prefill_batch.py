"""Several requests' Thinker prefills as one, run a chunk of positions at a time.

One prefill at a time leaves the GPU mostly idle (a prompt of ~1,800 positions is far from
filling an H200) and makes the tenth of ten sessions that spoke at once wait for nine
prefills before its own. Here every waiting prompt goes in one batch, and the batch runs in
chunks of positions, each chunk its own call on the model thread, so that the decode steps
of sessions already answering run between two chunks instead of waiting for the whole
prefill.

The layout of the batch (columns are cache positions):

    row i: [pad ... | past_i (p_i) ][ new_i (n_i) | pad ... ]
           `------ P = max p_i ----'`------ N = max n_i ----'

A row's earlier KV (a session's past turns, or a cached prompt prefix) is right-aligned in
the first P columns, its new positions left-aligned after them, so a new position never
follows a pad: every query has real keys, padding is only masked out, and each row computes
what it would alone. A chunk covers the same columns of every row. When the batch is done,
each row's cache is its own columns cut out of the batch's, its hidden states are those of
its own positions, and its next-token logits are those of its last position.

Before the first chunk each row's media go through the audio and vision towers, one row at
a time (transformers' audio tower gives an audio batched beside a longer one slightly other
features than alone, so batching the towers would make a session's answer depend on who
else spoke): the Thinker's own forward merges their outputs into the prompt embeddings (and
gives the deepstack features of the image positions), and is stopped just before its
decoder layers, so the merge is always transformers' own, in any version. The decoder
layers, where a MoE model's time goes, run batched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from .audio_features import AudioInput
from .audio_tower import encode_rest, window_frames, windowed
from .batch_cache import row_cache, stack_caches
from .vision_input import VisionInput


@dataclass(frozen=True, slots=True)
class PrefillRow:
    """One request's share of a batched prefill."""

    input_ids: list[int]
    """the positions to compute (after the past's)"""
    positions: torch.Tensor
    """[3, len(input_ids)] mRoPE positions"""
    past: DynamicCache | None = None
    """KV of the positions before `input_ids` (a batch of one); None: none"""
    audio: AudioInput | None = None
    vision: VisionInput | None = None
    audio_from: int = 0
    """frames of `audio` whose positions are in `past` already (a streamed turn's finished
    windows): the row's audio placeholders are those of the frames after them"""


@dataclass(frozen=True, slots=True)
class RowResult:
    cache: DynamicCache
    """the row's past and new positions' KV, its own (a batch of one)"""
    hidden: torch.Tensor
    """[n, 2, hidden] on the host, float32: embedding output and accept layer's input"""
    logits: torch.Tensor
    """[vocab] at the row's last position"""


class _Merged(Exception):
    """Raised by the hook that stops the Thinker's forward just before its decoder layers."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        super().__init__("merged")
        self.kwargs = kwargs


def _stop_before_layers(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
    raise _Merged(kwargs)


class BatchedPrefill:
    """A prefill of `rows` on `model` (the Thinker: transformers'
    Qwen3OmniMoeThinkerForConditionalGeneration), run by `begin`, `run_chunk` until `done`,
    then `finish`. Every call belongs on the model thread."""

    def __init__(
        self,
        model: Any,
        rows: list[PrefillRow],
        *,
        accept_layer: int,
        chunk_tokens: int = 0,
        pad_id: int = 0,
    ) -> None:
        if not rows or any(not row.input_ids for row in rows):
            raise ValueError("a prefill needs at least one row, each with positions")
        self.model = model
        self.rows = rows
        self.accept_layer = accept_layer
        self.pad_id = pad_id
        self.device: torch.device = next(model.parameters()).device
        self.lengths = [len(row.input_ids) for row in rows]
        self.new_columns = max(self.lengths)
        self.past_lengths = [row.past.get_seq_length() if row.past else 0 for row in rows]
        self.past_columns = max(self.past_lengths)
        self.chunk_columns = self.new_columns
        """New positions per chunk, the same for every row (`chunk_tokens` over the rows)."""
        if chunk_tokens > 0:
            self.chunk_columns = max(1, min(self.new_columns, chunk_tokens // len(rows)))
        self.done_columns = 0
        self.chunks_run = 0
        self._embeds: torch.Tensor | None = None
        self._visual_mask: torch.Tensor | None = None
        self._visual_index: torch.Tensor | None = None
        self._mask_expanded = False
        self._deepstack: list[torch.Tensor] | None = None
        self._positions: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None
        self._cache = DynamicCache()
        self._hidden: list[list[torch.Tensor]] = [[] for _ in rows]
        self._logits: list[torch.Tensor | None] = [None] * len(rows)

    @property
    def done(self) -> bool:
        return self.done_columns >= self.new_columns

    @torch.inference_mode()
    def begin(self) -> None:
        """Run the media towers and merge; lay the rows' pasts side by side."""
        rows, device = self.rows, self.device
        ids = torch.full((len(rows), self.new_columns), self.pad_id, dtype=torch.long)
        positions = torch.zeros(3, len(rows), self.new_columns, dtype=torch.long)
        mask = torch.zeros(len(rows), self.past_columns + self.new_columns, dtype=torch.long)
        for index, (row, past) in enumerate(zip(rows, self.past_lengths, strict=True)):
            count = len(row.input_ids)
            ids[index, :count] = torch.tensor(row.input_ids)
            positions[:, index, :count] = row.positions.cpu()
            mask[index, self.past_columns - past : self.past_columns + count] = 1
        self._positions = positions.to(device)
        self._mask = mask.to(device)
        self._merge(ids.to(device))
        pasts = [row.past for row in rows]
        if any(past is not None and past.get_seq_length() for past in pasts):
            self._cache, _ = stack_caches([past or DynamicCache() for past in pasts])

    def _merge(self, ids: torch.Tensor) -> None:
        """Each row's prompt embeddings with its media merged in, laid side by side."""
        merged = [
            self._merge_row(row, ids[index : index + 1, : len(row.input_ids)], index)
            for index, row in enumerate(self.rows)
        ]
        embeds = torch.zeros(
            (len(self.rows), self.new_columns, merged[0][0].shape[-1]),
            dtype=merged[0][0].dtype,
            device=self.device,
        )
        visual = torch.zeros(len(self.rows), self.new_columns, dtype=torch.bool, device=self.device)
        deepstack: list[list[torch.Tensor]] = []
        for index, (row_embeds, row_visual, row_deepstack) in enumerate(merged):
            embeds[index, : row_embeds.shape[1]] = row_embeds[0]
            if row_visual is not None and row_deepstack is not None:
                self._mask_expanded = row_visual.dim() == 3
                flat = row_visual if row_visual.dim() == 2 else row_visual[..., 0]
                visual[index, : flat.shape[1]] = flat[0]
                deepstack.append(list(row_deepstack))
        self._embeds = embeds
        if deepstack:
            # the batch's image positions in row-major order, as the decoder layers pick
            # them out of a chunk; each layer's features are the rows' in that order
            self._deepstack = [torch.cat(layer) for layer in zip(*deepstack, strict=True)]
            self._visual_mask = visual
            self._visual_index = (visual.reshape(-1).long().cumsum(0) - 1).view(visual.shape)

    def _merge_row(
        self, row: PrefillRow, ids: torch.Tensor, index: int
    ) -> tuple[torch.Tensor, torch.Tensor | None, Any]:
        """The Thinker's own forward over one row, stopped before its decoder layers: its
        embeddings, image positions and deepstack features. Rows go one at a time through
        the media towers: transformers' audio tower gives an audio batched with a longer
        one slightly different features (8e-5 on the tiny model) than alone."""
        assert self._positions is not None
        media: dict[str, Any] = {}
        dtype = self.model.dtype
        if row.audio is not None and row.audio_from:
            media["inputs_embeds"] = self._with_rest(row.audio, row.audio_from, ids)
        elif row.audio is not None:
            media["input_features"] = row.audio.features.to(self.device, dtype)
            media["feature_attention_mask"] = row.audio.mask.to(self.device)
        if row.vision is not None:
            media["pixel_values"] = row.vision.pixel_values.to(self.device, dtype)
            media["image_grid_thw"] = row.vision.grid_thw.to(self.device)
        positions = self._positions[:, index : index + 1, : ids.shape[1]]
        hook = self.model.model.register_forward_pre_hook(_stop_before_layers, with_kwargs=True)
        try:
            with windowed(self.model):
                self.model(input_ids=ids, position_ids=positions, use_cache=False, **media)
        except _Merged as merged:
            found = merged.kwargs
        else:  # pragma: no cover - the hook always fires
            raise RuntimeError("the Thinker's forward never reached its decoder layers")
        finally:
            hook.remove()
        return (
            found["inputs_embeds"],
            found.get("visual_pos_masks"),
            found.get("deepstack_visual_embeds"),
        )

    def _with_rest(self, audio: AudioInput, start: int, ids: torch.Tensor) -> torch.Tensor:
        """The row's embeddings with the audio tower's positions of the frames from `start`
        on in its audio placeholders (merged as the Thinker's forward merges an audio)."""
        embeds: torch.Tensor = self.model.get_input_embeddings()(ids)
        rest = audio.features[:, :, start : int(audio.mask.sum())]
        if rest.shape[2]:
            chunk, _ = window_frames(self.model)
            encoded = encode_rest(self.model, rest, padded=int(audio.mask.sum()) >= chunk)
            placeholders = (ids == self.model.config.audio_token_id).unsqueeze(-1)
            embeds = embeds.masked_scatter(placeholders.expand_as(embeds), encoded.to(embeds))
        return embeds

    @torch.inference_mode()
    def run_chunk(self) -> None:
        """The next chunk of columns, for every row."""
        assert self._embeds is not None and self._positions is not None and self._mask is not None
        start = self.done_columns
        end = min(self.new_columns, start + self.chunk_columns)
        deepstack: dict[str, Any] = {}
        if self._visual_mask is not None:
            assert self._visual_index is not None and self._deepstack is not None
            part = self._visual_mask[:, start:end]
            if bool(part.any()):
                chosen = self._visual_index[:, start:end][part]
                deepstack["visual_pos_masks"] = self._visual_shaped(part)
                deepstack["deepstack_visual_embeds"] = [d[chosen] for d in self._deepstack]
        out = self.model.model(
            inputs_embeds=self._embeds[:, start:end],
            attention_mask=self._mask[:, : self.past_columns + end],
            position_ids=self._positions[:, :, start:end],
            past_key_values=self._cache,
            use_cache=True,
            output_hidden_states=True,
            **deepstack,
        )
        states = out.hidden_states
        both = torch.stack((states[0], states[self.accept_layer]), dim=2).cpu()  # dtype kept
        for index, length in enumerate(self.lengths):
            if start < length:
                self._hidden[index].append(both[index, : min(end, length) - start])
            if start < length <= end:
                self._logits[index] = self.model.lm_head(
                    out.last_hidden_state[index, length - 1 - start]
                )
        self.done_columns = end
        self.chunks_run += 1

    def _visual_shaped(self, part: torch.Tensor) -> torch.Tensor:
        """A chunk's image positions as the decoder layers take them: transformers 4.x
        expands the mask over the hidden size, 5.x keeps it [batch, positions]."""
        if self._mask_expanded:
            assert self._embeds is not None
            return part.unsqueeze(-1).expand(-1, -1, self._embeds.shape[-1])
        return part

    @torch.inference_mode()
    def finish(self) -> list[RowResult]:
        """Each row's own cache, hidden states and last logits."""
        if not self.done:
            raise RuntimeError("the prefill has chunks left to run")
        results = []
        for index, (past, length) in enumerate(zip(self.past_lengths, self.lengths, strict=True)):
            first, last = self.past_columns - past, self.past_columns + length
            cache = row_cache(self._cache, index, first, last)
            logits = self._logits[index]
            assert logits is not None
            results.append(RowResult(cache, torch.cat(self._hidden[index]), logits))
        self._cache = DynamicCache()  # the batch's tensors are let go
        return results
