"""The Talker, frame by frame, fed by the Thinker's hidden states as they stream in.

One codec frame is 16 codes (80 ms of speech at 12.5 Hz). As in transformers'
`Qwen3OmniMoeTalkerForConditionalGeneration.generate`, the talker LM picks the first code of
a frame and the code predictor (a small dense LM, its own cache per frame) the other 15,
each conditioned on the talker's last hidden state and the codes before it. The sum of the
16 codes' embeddings plus the projected embedding of the next reply token is the talker's
next input. The Talker's prompt is the conversation's user items (text positions projected
from the Thinker's embeddings, audio/image positions from its `accept_hidden_layer` states)
and the opening of the reply: three ChatML tokens, four tts pads, tts_bos and the reply's
first token, over the codec's think/speaker/bos tokens.

Streaming changes only *when* things happen: the Talker's prompt is prefilled as soon as
the Thinker's prompt states come, but for its last position, which needs the reply's first
token (fed by the first frame step), and step `g` needs reply token `g + 2`,
tts_eos once the reply has ended, or tts_pad after that. When the Thinker is behind, the
Talker waits (`text_ready`). The runner is plain and synchronous; the engine decides when.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache, Qwen3OmniMoeConfig

from .batch_cache import padding_mask, row_cache, split_cache, stack_caches
from .config import CODEC, SPEAKERS, TOKENS
from .frame_predictor import FramePredictor
from .host_states import HostStates, to_device, user_items
from .sampling import Sampling, choose_rows, pick
from .slot_decoder import SlotDecoder

CODEC_SAMPLING = Sampling(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05)
PREDICTOR_SAMPLING = Sampling(temperature=1.0, top_k=50, top_p=0.8)
MULTIMODAL = frozenset({TOKENS["audio"], TOKENS["image"], TOKENS["video"]})


@dataclass(frozen=True, slots=True)
class TalkerPrompt:
    """What the Thinker's prefill hands over."""

    token_ids: list[int]
    states: npt.NDArray[np.floating]
    """[n, 2, thinker_hidden]: embedding output and accept layer per prompt position"""
    tts_embeds: npt.NDArray[np.floating]
    """[3, thinker_hidden]: the Thinker's embeddings of tts_bos, tts_eos, tts_pad"""
    audio_feature_lengths: tuple[int, ...] = ()
    """each audio's mel frames, in prompt order, as the Thinker heard it"""
    image_grid_thw: tuple[tuple[int, int, int], ...] = ()
    """each camera frame's patch grid, in prompt order, as the Thinker saw it (3-D positions)"""


@dataclass
class TalkerState:
    prompt: TalkerPrompt
    speaker_id: int = -1
    """the codec token of the voice this request speaks in (-1: the runner's default)"""
    reply: list[torch.Tensor] = field(default_factory=list)
    """projected embeddings of the reply tokens so far, [1, talker_hidden] each"""
    unprojected: list[npt.NDArray[np.floating]] = field(default_factory=list)
    """reply hidden states received but not yet projected ([n, thinker_hidden] each): the next
    prefill or step projects them, every request's in one call (`add_reply`)"""
    received: int = 0
    """reply positions received so far, projected or not"""
    text_done: bool = False
    cache: DynamicCache | None = None
    rope_delta: int = 0
    length: int = 0
    step: int = 0
    next_code: int = -1
    last_hidden: torch.Tensor | None = None
    codes_seen: list[int] = field(default_factory=list)
    seen_mask: npt.NDArray[np.bool_] | None = None
    """[codec vocab]: the codes chosen so far, for the batched repetition penalty"""
    frame_sum: torch.Tensor | None = None
    """[1, talker_hidden]: the last predicted frame's code embeddings summed, when the frame
    predictor gave it (the plain path sums them in `_frame_embeds`)"""
    frames: int = 0
    finished: bool = False
    """the talker chose codec EOS: no frame follows"""
    generator: torch.Generator | None = None
    tts: torch.Tensor | None = None
    """projected tts_bos, tts_eos, tts_pad: [3, talker_hidden]"""
    prompt_end: torch.Tensor | None = None
    """[1, talker_hidden]: the codec part of the prompt's last position, while that position
    waits for the reply's first token (a prompt prefilled before it came: `prefill_batch`);
    the first frame step feeds it (`advance_batch`)"""


OPENAI_SPEAKERS = {
    "alloy": "chelsie",
    "coral": "chelsie",
    "marin": "chelsie",
    "sage": "chelsie",
    "shimmer": "chelsie",
    "ash": "ethan",
    "echo": "ethan",
    "verse": "ethan",
    "ballad": "aiden",
    "cedar": "aiden",
}
"""OpenAI's Realtime voices -> Qwen3-Omni's speakers, by sex (Chelsie is its female voice)
and feel (Aiden the mellower of its two male voices)."""


def speaker_id(speakers: Mapping[str, int], voice: str, default: int) -> int:
    """The codec token for a voice name: a speaker's own name, an OpenAI voice, or `default`."""
    name = voice.strip().lower()
    name = OPENAI_SPEAKERS.get(name, name)
    return int(speakers.get(name, default))


class TalkerRunner:
    def __init__(
        self,
        model: Any,
        config: Qwen3OmniMoeConfig,
        *,
        speaker: str = "ethan",
        seed: int = 0,
        codec_sampling: Sampling = CODEC_SAMPLING,
        predictor_sampling: Sampling = PREDICTOR_SAMPLING,
        min_frames: int = 0,
        decoder: SlotDecoder | None = None,
        predictor: FramePredictor | None = None,
        reserve: int = 0,
        plain_fallback: bool = False,
    ) -> None:
        self.plain_fallback = plain_fallback
        """With a decoder: a request that finds no row is stepped the plain way (only where
        a graph file asks for it); False: that is a bug in the row gate in front."""
        self.plain_steps = 0
        """Plain talker LM steps run (requests stepped without a cache row)."""
        self.decoder = decoder
        """The talker LM's steps on cache rows (batched in place, captured on a GPU)."""
        self.predictor = predictor
        """The code predictor's whole frame as one (captured) step."""
        self.reserve = reserve
        """Positions a request may add after its prefill (its frame budget)."""
        self.min_frames = min_frames
        """codec EOS is not chosen before this many frames (random weights: a fixed length)"""
        self.model = model
        self.config = config
        talker = config.talker_config
        self.speaker_id = int(talker.speaker_id.get(speaker.lower(), SPEAKERS["ethan"]))
        self.groups = int(talker.num_code_groups)
        self.seed = seed
        self.codec_sampling = codec_sampling
        self.predictor_sampling = predictor_sampling
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        vocab = int(talker.text_config.vocab_size)
        self.eos = int(talker.codec_eos_token_id)
        self.banned = torch.tensor([i for i in range(vocab - 1024, vocab) if i != self.eos])
        self.banned_with_eos = torch.tensor(list(range(vocab - 1024, vocab)))
        self.vocab = vocab
        masks = torch.zeros(2, vocab, dtype=torch.bool)
        masks[0, self.banned] = True
        masks[1, self.banned_with_eos] = True
        self.banned_masks = masks.to(self.device)
        """[2, vocab]: what may not be chosen, without and with codec EOS"""

    # --- text in ---------------------------------------------------------------------------

    def _tensor(self, array: HostStates) -> torch.Tensor:
        # a copy: inputs may be views onto a shared-memory ring (bfloat16 bits read exactly)
        return to_device(array, self.dtype, self.device)

    def open(self, prompt: TalkerPrompt, voice: str = "") -> TalkerState:
        """A request's state; `voice` names a speaker or an OpenAI voice ("": the default)."""
        generator = torch.Generator().manual_seed(self.seed)
        speaker = speaker_id(self.config.talker_config.speaker_id, voice, self.speaker_id)
        return TalkerState(prompt=prompt, speaker_id=speaker, generator=generator)

    def add_reply(self, state: TalkerState, states: npt.NDArray[np.floating]) -> None:
        """Reply positions' hidden states ([n, 2, thinker_hidden]) as the Thinker feeds them.

        Host only, from any thread: the next prefill or frame step projects what arrived, all
        its requests' at once. (Projecting each token on the model thread as it came made one
        small GPU call per token and request, queued between the frame steps: at 32 sessions
        about a thousand a second.) The list is only appended to here and only cut from the
        front on the model thread, each one operation under the GIL."""
        state.unprojected.append(np.array(states[:, 0]))  # a copy: may be a view onto a ring
        state.received += len(states)

    def _project_replies(self, states: list[TalkerState]) -> None:
        """Project the reply text that `states` received since their last step, in one call."""
        taken: list[tuple[TalkerState, list[npt.NDArray[np.floating]]]] = []
        for state in states:
            if count := len(state.unprojected):
                arrays = state.unprojected[:count]
                del state.unprojected[:count]
                taken.append((state, arrays))
        if not taken:
            return
        rows = np.concatenate([array for _, arrays in taken for array in arrays])
        pieces = self.model.text_projection(self._tensor(rows)).split(1, dim=0)
        at = 0
        for state, arrays in taken:
            count = sum(len(array) for array in arrays)
            state.reply.extend(pieces[at : at + count])
            at += count

    def end_text(self, state: TalkerState) -> None:
        state.text_done = True

    def can_start(self, state: TalkerState) -> bool:
        return state.received > 0

    def text_ready(self, state: TalkerState) -> bool:
        """Whether `advance` has the text it needs (or never will: the reply is over)."""
        return state.text_done or state.step + 1 < state.received

    # --- the talker LM ---------------------------------------------------------------------

    def _forward(self, state: TalkerState, embeds: torch.Tensor, positions: torch.Tensor) -> None:
        out = self.model.model(
            inputs_embeds=embeds,
            position_ids=positions,
            past_key_values=state.cache,
            use_cache=True,
            cache_position=torch.arange(
                state.length, state.length + embeds.shape[1], device=self.device
            ),
        )
        state.length += embeds.shape[1]
        hidden = out.last_hidden_state[:, -1:]
        state.last_hidden = hidden
        self._choose(state, self.model.codec_head(hidden)[0, -1])

    def _choose(self, state: TalkerState, logits: torch.Tensor) -> None:
        state.next_code = pick(
            logits,
            self.codec_sampling,
            state.generator,
            banned=self.banned_with_eos if self._eos_banned(state) else self.banned,
            seen=state.codes_seen,
        )
        state.codes_seen.append(state.next_code)

    def _choose_rows(self, states: list[TalkerState], logits: torch.Tensor) -> None:
        """`_choose` for a batch, on the device, with one host sync."""
        which = torch.tensor([int(self._eos_banned(s)) for s in states], device=self.device)
        seen = []
        for state in states:
            if state.seen_mask is None:
                state.seen_mask = np.zeros(self.vocab, dtype=np.bool_)
                state.seen_mask[state.codes_seen] = True
            seen.append(state.seen_mask)
        chosen = choose_rows(
            logits, self.codec_sampling, banned=self.banned_masks[which], seen=seen
        )
        for state, code in zip(states, chosen, strict=True):
            state.next_code = code
            state.codes_seen.append(code)
            assert state.seen_mask is not None
            state.seen_mask[code] = True

    def _eos_banned(self, state: TalkerState) -> bool:
        return state.frames < self.min_frames

    def _prompt_embeds(self, state: TalkerState) -> tuple[torch.Tensor, list[int]]:
        """The prompt's embeddings and its positions' rope ids. Without the reply's first
        token yet, every position but the last: that one's codec part waits in
        `state.prompt_end` (its rope id is in the list all the same)."""
        state.prompt_end = None  # a prefill run again (its batch failed) decides afresh
        prompt = state.prompt
        ids = prompt.token_ids
        embed = self._tensor(prompt.states[:, 0])
        accept = self._tensor(prompt.states[:, 1])
        parts: list[torch.Tensor] = []
        rope_ids: list[int] = []
        for begin, end in user_items(ids):  # not the system item nor earlier replies
            segment = ids[begin:end]
            mm = torch.tensor([t in MULTIMODAL for t in segment], device=self.device)
            part = self.model.text_projection(embed[begin:end])
            if bool(mm.any()):
                part[mm] = self.model.hidden_projection(accept[begin:end][mm])
            parts.append(part)
            rope_ids += segment
        last = max(i for i, t in enumerate(ids) if t == TOKENS["im_start"])
        opening = self.model.text_projection(embed[last:])  # im_start assistant \n
        state.tts = self.model.text_projection(self._tensor(prompt.tts_embeds))
        bos, _eos, pad = state.tts.split(1)
        text = torch.cat((opening[:3], pad.expand(4, -1), bos, *state.reply[:1]), dim=0)
        codec_ids = [CODEC["nothink"], CODEC["think_bos"], CODEC["think_eos"]]
        speaker = state.speaker_id if state.speaker_id >= 0 else self.speaker_id
        codec_ids += [speaker, CODEC["pad"], CODEC["bos"]]
        codec = self.model.get_input_embeddings()(torch.tensor(codec_ids, device=self.device))
        codec = torch.cat((codec.new_zeros(3, codec.shape[1]), codec), dim=0)
        rope_ids += [TOKENS["tts_pad"]] * codec.shape[0]
        if not state.reply:  # the last position waits for the reply's first token
            state.prompt_end = codec[-1:]
            codec = codec[:-1]
        parts.append(text + codec)
        return torch.cat(parts, dim=0).unsqueeze(0), rope_ids

    @torch.inference_mode()
    def prefill(self, state: TalkerState) -> None:
        self.prefill_batch([state])

    def _prompt_positions(self, state: TalkerState, rope_ids: list[int]) -> torch.Tensor:
        """The prompt's mRoPE positions [3, n]; sets the state's offset for what follows."""
        ids = torch.tensor([rope_ids], device=self.device)
        frames = state.prompt.audio_feature_lengths
        lengths = torch.tensor(frames, device=self.device) if frames else None
        grids = state.prompt.image_grid_thw
        grid = torch.tensor(grids, device=self.device) if grids else None
        positions, deltas = self.model.get_rope_index(
            ids, grid, None, torch.ones_like(ids), False, lengths, None
        )
        state.rope_delta = int(deltas.reshape(-1)[0])
        own: torch.Tensor = positions[:, 0]
        return own

    @torch.inference_mode()
    def prefill_batch(self, states: list[TalkerState]) -> None:
        """`prefill` for several requests in one forward: each prompt left-aligned and
        padded on the right (a pad only ever follows a request's own positions, so it never
        changes them); each request's cache is then its own positions' KV.

        A request whose reply has no token yet is prefilled up to its prompt's last
        position, which needs that token: its first frame step feeds that position
        (`advance_batch`, with no codes), so the prompt costs the turn's end one position
        instead of all of them. Causal attention makes the two halves the whole prompt's."""
        self._project_replies(states)
        prompts = [self._prompt_embeds(state) for state in states]
        lengths = [embeds.shape[1] for embeds, _ in prompts]
        longest = max(lengths)
        first = prompts[0][0]
        embeds = first.new_zeros(len(states), longest, first.shape[-1])
        positions = torch.zeros(3, len(states), longest, dtype=torch.long, device=self.device)
        mask = torch.zeros(len(states), longest, dtype=torch.long, device=self.device)
        for row, (state, (own, rope_ids), length) in enumerate(
            zip(states, prompts, lengths, strict=True)
        ):
            embeds[row, :length] = own[0]
            positions[:, row, :length] = self._prompt_positions(state, rope_ids)[:, :length]
            mask[row, :length] = 1
        cache = DynamicCache()
        out = self.model.model(
            inputs_embeds=embeds,
            attention_mask=mask if len(states) > 1 else None,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        )
        for row, (state, length) in enumerate(zip(states, lengths, strict=True)):
            state.cache = row_cache(cache, row, 0, length)
            state.length = length
            if state.prompt_end is not None:
                continue  # its last position, and its first code, come with the reply
            hidden = out.last_hidden_state[row : row + 1, length - 1 : length]
            state.last_hidden = hidden
            self._choose(state, self.model.codec_head(hidden)[0, -1])

    # --- one frame, for one request or a batch of them ----------------------------------

    @torch.inference_mode()
    def predict(self, state: TalkerState) -> npt.NDArray[np.int32] | None:
        """The next frame's 16 codes (None once the talker chose EOS)."""
        return self.predict_batch([state])[0]

    @torch.inference_mode()
    def predict_batch(self, states: list[TalkerState]) -> list[npt.NDArray[np.int32] | None]:
        """`predict` for several requests: every row of the code predictor starts afresh at
        the same length, so the batch needs no padding."""
        results: list[npt.NDArray[np.int32] | None] = [None] * len(states)
        if any(state.prompt_end is not None for state in states):
            raise ValueError("a prompt's last position is not fed yet (advance_batch first)")
        live = []
        for row, state in enumerate(states):
            if state.next_code == self.eos:
                state.finished = True
            else:
                live.append(row)
        if not live:
            return results
        rows = [states[row] for row in live]
        if self.predictor is not None and len(rows) <= self.predictor.cache.rows:
            last = torch.cat([state.last_hidden for state in rows if state.last_hidden is not None])
            rest, sums = self.predictor.predict(last, [state.next_code for state in rows])
            sums = sums.clone()  # the graph's buffer is overwritten by the next frame
            for index, (row, state, tail) in enumerate(zip(live, rows, rest.tolist(), strict=True)):
                state.frames += 1
                state.frame_sum = sums[index : index + 1]
                results[row] = np.asarray([state.next_code, *tail], dtype=np.int32)
            return results
        predictor = self.model.code_predictor
        tables = predictor.get_input_embeddings()
        first_ids = torch.tensor([[state.next_code] for state in rows], device=self.device)
        hidden = torch.cat([state.last_hidden for state in rows if state.last_hidden is not None])
        embeds = torch.cat((hidden, self.model.get_input_embeddings()(first_ids)), dim=1)
        codes = [[state.next_code] for state in rows]
        cache = DynamicCache()
        for group in range(self.groups - 1):
            out = predictor.model(inputs_embeds=embeds, past_key_values=cache, use_cache=True)
            logits = predictor.lm_head[group](out.last_hidden_state[:, -1])
            chosen = [
                pick(logits[r], self.predictor_sampling, state.generator)
                for r, state in enumerate(rows)
            ]
            for row_codes, code in zip(codes, chosen, strict=True):
                row_codes.append(code)
            embeds = tables[group](torch.tensor(chosen, device=self.device).view(-1, 1))
        for row, state, row_codes in zip(live, rows, codes, strict=True):
            state.frames += 1
            results[row] = np.asarray(row_codes, dtype=np.int32)
        return results

    def _text_for_step(self, state: TalkerState) -> torch.Tensor:
        assert state.tts is not None
        wanted = state.step + 1  # reply[0] went into the prompt
        if wanted < len(state.reply):
            return state.reply[wanted]
        if wanted == len(state.reply):
            return state.tts[1:2]  # tts_eos
        return state.tts[2:3]  # tts_pad

    def _frame_embeds(self, state: TalkerState, codes: npt.NDArray[np.int32]) -> torch.Tensor:
        """[1, talker_hidden]: the 16 codes' embeddings summed, plus the step's text."""
        if state.frame_sum is not None:
            summed, state.frame_sum = state.frame_sum, None
            return summed + self._text_for_step(state)
        tables = self.model.code_predictor.get_input_embeddings()
        ids = torch.from_numpy(codes.astype(np.int64)).to(self.device)
        total: torch.Tensor = self.model.get_input_embeddings()(ids[:1])
        for group in range(1, self.groups):
            total = total + tables[group - 1](ids[group : group + 1])
        return total + self._text_for_step(state)

    @torch.inference_mode()
    def advance(self, state: TalkerState, codes: npt.NDArray[np.int32]) -> None:
        """Feed the frame just predicted (with the next piece of text) to the talker LM."""
        self.advance_batch([state], [codes])

    @torch.inference_mode()
    def advance_batch(
        self, states: list[TalkerState], codes: list[npt.NDArray[np.int32] | None]
    ) -> None:
        """`advance` for several requests in one talker LM step (padded caches, own
        positions). None for a request's codes: it has no frame yet, and its prompt's last
        position is fed (with the reply's first token: `prefill_batch`), its first code
        chosen from it."""
        self._project_replies(states)
        embeds = torch.stack([self._step_embeds(s, c) for s, c in zip(states, codes, strict=True)])
        where = [state.length + state.rope_delta for state in states]
        if self.decoder is not None:
            self._forward_rows(states, embeds, where)
        else:
            self._forward_plain(states, embeds, where)
        for state, fed in zip(states, codes, strict=True):
            if fed is None:
                state.prompt_end = None
            else:
                state.step += 1

    def _step_embeds(self, state: TalkerState, codes: npt.NDArray[np.int32] | None) -> torch.Tensor:
        if codes is not None:
            return self._frame_embeds(state, codes)
        if state.prompt_end is None or not state.reply:
            raise ValueError("no frame to feed, and no prompt position waiting for its text")
        return state.reply[0] + state.prompt_end

    def _forward_plain(
        self, states: list[TalkerState], embeds: torch.Tensor, where: list[int]
    ) -> None:
        self.plain_steps += len(states)
        positions = torch.tensor(where, device=self.device).view(1, -1, 1).expand(3, -1, 1)
        if len(states) == 1:
            self._forward(states[0], embeds, positions)
        else:
            self._forward_batch(states, embeds, positions)

    def _forward_rows(
        self, states: list[TalkerState], embeds: torch.Tensor, where: list[int]
    ) -> None:
        """The talker LM step on cache rows; a request that gets no row goes the plain way
        where `plain_fallback` allows it, and is an error otherwise (see the Thinker's)."""
        decoder = self.decoder
        assert decoder is not None
        seated = [i for i, state in enumerate(states) if decoder.cache.seat(state, self.reserve)]
        if len(seated) < len(states) and not self.plain_fallback:
            raise RuntimeError(
                f"{len(states) - len(seated)} of {len(states)} requests found no cache row "
                "(every row taken, or longer than a row) and plain_fallback is off"
            )
        if seated:
            rows = decoder.step(
                [states[i] for i in seated], embeds[seated, 0], [where[i] for i in seated]
            )
            logits = self.model.codec_head(rows.last)
            # a prompt's last position chooses its first code as a whole prompt's prefill
            # does (its own generator); frames choose together, one host sync for all
            framed = [r for r, i in enumerate(seated) if states[i].prompt_end is None]
            if framed:
                self._choose_rows([states[seated[r]] for r in framed], logits[framed])
            for r, i in enumerate(seated):
                if states[i].prompt_end is not None:
                    self._choose(states[i], logits[r])
            for row, i in enumerate(seated):
                state = states[i]
                state.length += 1
                state.last_hidden = rows.last[row].view(1, 1, -1)
        rest = [i for i in range(len(states)) if i not in seated]
        if rest:
            self._forward_plain([states[i] for i in rest], embeds[rest], [where[i] for i in rest])

    def release(self, state: TalkerState) -> None:
        """The request is over: give its cache row back. Idempotent."""
        if self.decoder is not None:
            self.decoder.cache.give_back(state)

    def _forward_batch(
        self, states: list[TalkerState], embeds: torch.Tensor, positions: torch.Tensor
    ) -> None:
        cache, pads = stack_caches([state.cache for state in states if state.cache is not None])
        longest = cache.get_seq_length()
        out = self.model.model(
            inputs_embeds=embeds,
            attention_mask=padding_mask(pads, longest + 1, self.device),
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            cache_position=torch.tensor([longest], device=self.device),
        )
        hidden = out.last_hidden_state[:, -1:]
        logits = self.model.codec_head(hidden)[:, -1]
        for row, (state, own) in enumerate(zip(states, split_cache(cache, pads), strict=True)):
            state.cache = own
            state.length += 1
            state.last_hidden = hidden[row : row + 1]
            self._choose(state, logits[row])
