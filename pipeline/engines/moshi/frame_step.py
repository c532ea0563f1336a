"""Moshi's frame step: one forward every 80 ms for every live session at once.

A session holds a row of the ring cache from `join` to `leave`; each `step` takes the
sessions' microphone codes for the frame (Mimi's 8 codebooks) and gives each its text
token and, once it has a whole frame, its voice's 8 codes. Sessions join and leave between
steps, at any frame: each row has its own position, its own mask and its own past. The
sessions hold the lowest rows: one that leaves from the middle has the last row's session
moved into its place (its cache rows copied, ~1 ms at full size), so a step over `n`
sessions computes rows 0..bucket-1 and attends over views of the cache, never a gather.

Inside a step:
1. Each row's input is the sum of embeddings of its last text token, its voice's last codes
   and the user's codes, in Moshi's delayed layout: the semantic codebook (0) of this frame
   with the acoustic codebooks (1-7) of the frame before, for both streams.
2. The main transformer (the model's own decoder layers over the ring cache, not its
   `forward`, whose masks assume one shared length) gives each row a hidden state; its LM
   head gives the text token.
3. The depth transformer writes the 8 codes of the voice from that hidden state, one
   codebook after another, every row together (they are all at the same depth), over a
   small cache of its own that each frame starts afresh. Its modules are called here too:
   transformers' `forward` reads positions back to the host, which no capture allows.
4. The voice's whole frame is the semantic code of the step before with the acoustic codes
   of this one (the same one-frame delay).

On a GPU the whole of it (sampling included) is captured as a CUDA graph per batch bucket
(StepGraphs, as the Qwen3-Omni steps are) and replayed: eagerly a full-size step took
~105 ms at 8 sessions on an H200, nearly all of it kernel launches (a main layer's weights
read in ~0.1 ms took 1.9 ms). A bucket larger than the sessions is filled with free rows,
whose spare computation nothing reads. On a CPU the same function simply runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ...duplex import DuplexFull
from ..qwen3_omni.step_graphs import StepGraphs
from .ring_cache import RingCache
from .session_rows import SessionRows


@dataclass(frozen=True, slots=True)
class FrameOut:
    text: int
    """The model's text token this frame (a padding token while it says nothing)."""
    codes: torch.Tensor | None
    """The voice's codes for a whole frame ([codebooks], on the CPU); None on a session's
    first step (no whole frame yet)."""


@dataclass(frozen=True, slots=True)
class Sampling:
    """Moshi's published settings; `greedy` for tests (the same tokens however rows batch)."""

    greedy: bool = False
    text_temperature: float = 0.7
    text_top_k: int = 25
    audio_temperature: float = 0.8
    audio_top_k: int = 250


class RowsFull(DuplexFull):
    """Every row holds a session: no more sessions on this model now."""


class FrameStepper:
    def __init__(
        self,
        model: Any,
        *,
        rows: int,
        window: int | None = None,
        sampling: Sampling | None = None,
        capture: bool | None = None,
    ) -> None:
        config = model.config
        body = model.decoder.model
        parameter = next(model.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.model, self.body, self.sampling = model, body, sampling or Sampling()
        self.codebooks = int(config.num_codebooks)
        self.text_bos = int(config.vocab_size)  # the extra embedding row: nothing said yet
        self.audio_bos = int(config.audio_vocab_size)
        heads = int(config.num_attention_heads)
        self.cache = RingCache(
            layers=len(body.layers),
            rows=rows,
            heads=int(config.num_key_value_heads),
            window=window or int(config.sliding_window),
            head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
            dtype=self.dtype,
            device=self.device,
        )
        depth = model.depth_decoder
        depth_config = depth.config
        depth_heads = int(depth_config.num_attention_heads)
        self.depth_cache = RingCache(
            layers=len(depth.layers),
            rows=rows,
            heads=int(getattr(depth_config, "num_key_value_heads", None) or depth_heads),
            window=self.codebooks,
            head_dim=int(
                getattr(depth_config, "head_dim", None) or depth_config.hidden_size // depth_heads
            ),
            dtype=self.dtype,
            device=self.device,
        )
        self._codebook = [torch.tensor([k], device=self.device) for k in range(self.codebooks)]
        self.rows = rows
        self._heard = torch.zeros(rows, self.codebooks, dtype=torch.long, device=self.device)
        self.graphs: StepGraphs[tuple[torch.Tensor, torch.Tensor]] = StepGraphs(
            self._frame, largest=rows, device=self.device, capture=capture
        )
        self._sessions = SessionRows(rows, reset=self._reset_row, move=self._move_row)
        """Session -> its row: always rows 0..sessions-1."""
        shape = (rows, self.codebooks)
        self._text = torch.full((rows,), self.text_bos, dtype=torch.long, device=self.device)
        self._voice = torch.full(shape, self.audio_bos, dtype=torch.long, device=self.device)
        self._user = torch.full(shape, self.audio_bos, dtype=torch.long, device=self.device)
        self._semantic = torch.full((rows,), -1, dtype=torch.long, device=self.device)
        """Per row: the voice's semantic code of the step before (-1: none yet)."""

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    def join(self, session_id: str) -> None:
        """Give `session_id` a row from the next step on; RowsFull if none is free."""
        if not self._sessions.join(session_id):
            raise RowsFull(f"all {self.rows} rows hold sessions")

    def leave(self, session_id: str) -> None:
        """Free the session's row (idempotent); the last row's session moves into it."""
        self._sessions.leave(session_id)

    def _reset_row(self, row: int) -> None:
        self.cache.clear(row)
        self._text[row] = self.text_bos
        self._voice[row] = self.audio_bos
        self._user[row] = self.audio_bos
        self._semantic[row] = -1

    def _move_row(self, last: int, row: int) -> None:
        with torch.inference_mode():
            self.cache.move(last, row)
            for state in (self._text, self._voice, self._user, self._semantic):
                state[row] = state[last]

    def warm(self) -> None:
        """Capture every bucket now (before the model is ready), so no session waits on one."""
        self.graphs.warm()

    @torch.inference_mode()
    def step(self, user_codes: Mapping[str, torch.Tensor]) -> dict[str, FrameOut]:
        """One frame for each session in `user_codes` (its microphone's [codebooks] codes)."""
        if not user_codes:
            return {}
        if set(user_codes) != self._sessions.ids():
            raise ValueError("a step takes a frame from every session that joined, and no other")
        ids = self._sessions.in_row_order(user_codes)  # row order: 0..n-1
        n = len(ids)
        self._heard[:n].copy_(torch.stack([user_codes[s] for s in ids]).to(self.device, torch.long))
        text_all, voice_all = self.graphs.run(n)
        text, voice = text_all[:n].clone(), voice_all[:n].clone()
        self.cache.written[:n] += 1
        self._user[:n] = self._heard[:n]
        self._text[:n] = text
        self._voice[:n] = voice
        previous = self._semantic[:n].clone()
        self._semantic[:n] = voice[:, 0]
        whole = torch.cat([previous[:, None], voice[:, 1:]], dim=1).cpu()
        texts = text.tolist()
        firsts = (previous < 0).tolist()
        return {s: FrameOut(texts[i], None if firsts[i] else whole[i]) for i, s in enumerate(ids)}

    def _frame(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The step over the first `size` rows (the sessions', then free ones), from static
        buffers only: each row's text token and voice codes (`step` updates their state)."""
        user = self._heard[:size]
        delayed_user = torch.cat([user[:, :1], self._user[:size, 1:]], dim=1)
        hidden = self._embed(size, delayed_user)[:, None]
        positions = self.cache.written[:size][:, None]
        mask = self.cache.mask(size)
        for layer in self.body.layers:
            out = layer(
                hidden,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=self.cache,
                use_cache=True,
            )
            hidden = out[0] if isinstance(out, tuple) else out
        hidden = self.body.norm(hidden)
        text_logits = self.model.decoder.lm_head(hidden)[:, -1].float()
        s = self.sampling
        text = self._pick(text_logits, s.text_temperature, s.text_top_k)
        return text, self._depth(size, hidden, text)

    def _embed(self, size: int, user: torch.Tensor) -> torch.Tensor:
        embeds = self.body.embed_tokens(self._text[:size])
        tables = self.model.embed_tokens
        for k in range(self.codebooks):
            embeds = embeds + tables[k](self._voice[:size, k])
            embeds = embeds + tables[self.codebooks + k](user[:, k])
        return embeds  # type: ignore[no-any-return]

    def _depth(self, size: int, hidden: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """The voice's codes for the frame, codebook by codebook: [rows, codebooks]. Input k
        is the text token (k = 0) or code k-1, plus the main hidden state through codebook
        k's projection; each codebook has its own weights (transformers' flexible linears)."""
        depth = self.model.depth_decoder
        cache = self.depth_cache
        cache.written[:size].zero_()  # each frame's depth starts afresh
        step_input = depth.text_embed_tokens(text[:, None])
        codes: list[torch.Tensor] = []
        s = self.sampling
        for k in range(self.codebooks):
            index = self._codebook[k]
            x = step_input + depth.input_projections(hidden, index)
            positions = cache.written[:size][:, None]
            mask = cache.mask(size)
            for layer in depth.layers:
                out = layer(
                    x,
                    attention_mask=mask,
                    position_ids=positions,
                    past_key_values=cache,
                    use_cache=True,
                    cache_position=index,  # transformers 4.x names the codebook so
                    codebook_idx=index,  # and 5.x so
                )
                x = out[0] if isinstance(out, tuple) else out
            cache.written[:size] += 1
            logits = depth.lm_heads(x, index)[:, -1].float()  # no final norm in the depth
            token = self._pick(logits, s.audio_temperature, s.audio_top_k)
            codes.append(token)
            if k + 1 < self.codebooks:
                step_input = depth.embed_tokens[k](token[:, None])
        return torch.stack(codes, dim=1)

    def _pick(self, logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
        if self.sampling.greedy:
            return logits.argmax(dim=-1)
        top = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1)
        probs = torch.softmax(top.values / temperature, dim=-1)
        return top.indices.gather(-1, torch.multinomial(probs, 1)).squeeze(-1)
