"""transformers' own `Qwen3OmniMoeForConditionalGeneration.generate()` as the reference, and
Parley's runners driven as its engines drive them, on the same tiny random weights.

The reference is the whole model of transformers 4.57, holding the very modules Parley's
runners hold (the session's `tiny_parts`), asked for audio: its Thinker, its Talker with
the prompt it builds itself, the code predictor's loop and Code2Wav. Both sides are greedy:

- Thinker: `thinker_do_sample=False`; Parley's default sampling is greedy.
- Talker LM: `talker_do_sample=False`. generate()'s other Talker settings stay as it sets
  them: EOS suppressed below `min_new_tokens` and the 1,023 reserved ids above the codebook
  always (Parley's `banned` masks), and its repetition penalty 1.05 over the codes chosen,
  which applies to greedy choice too (Parley's `codec_sampling` keeps the same penalty).
- Code predictor: generate() calls `code_predictor.generate(do_sample=True, top_k=50,
  top_p=0.8)` with the arguments written into the call, so no generate() argument makes it
  greedy. The reference's code predictor is wrapped to pass `do_sample=False` (the one knob
  changed inside the reference), and Parley's `predictor_sampling` is greedy.

generate() returns the Thinker's result and the waveform; the codes it decodes are taken
where they enter Code2Wav (`chunked_decode`, whose 300-frame chunks are one whole-sequence
decode for an answer this short).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration
from transformers.modeling_utils import no_init_weights

from pipeline.engines.qwen3_omni.code2wav_runner import Code2WavRunner, FrameChunker
from pipeline.engines.qwen3_omni.config import TOKENS
from pipeline.engines.qwen3_omni.sampling import Sampling
from pipeline.engines.qwen3_omni.session_kv import PromptMedia
from pipeline.engines.qwen3_omni.talker_runner import TalkerPrompt, TalkerRunner, TalkerState
from pipeline.engines.qwen3_omni.thinker_runner import ThinkerPrompt, ThinkerRunner, ThinkerState

Parts = dict[str, tuple[Any, Qwen3OmniMoeConfig]]
Codes = npt.NDArray[np.int32]
Audio = npt.NDArray[np.float32]

GREEDY = Sampling()
TALKER_CHOICE = Sampling(repetition_penalty=1.05)
"""generate()'s Talker choice made greedy: its repetition penalty stays (see above)."""


HEADS = ("thinker", "talker", "predictor")


@contextmanager
def recorded_logits(parts: Parts) -> Iterator[dict[str, list[torch.Tensor]]]:
    """Every call's logits at its last row while in the block, per head: the Thinker's LM
    head, the talker LM's codec head and the code predictor's 15 heads (in the order they
    run). For one request at a time (a batch's rows are not told apart)."""
    talker = parts["talker"][0]
    modules = {
        "thinker": [parts["thinker"][0].lm_head],
        "talker": [talker.codec_head],
        "predictor": list(talker.code_predictor.lm_head),
    }
    rows: dict[str, list[torch.Tensor]] = {head: [] for head in HEADS}
    handles = []
    for head in HEADS:

        def keep(_: Any, __: Any, out: torch.Tensor, kept: list[torch.Tensor] = rows[head]) -> None:
            kept.append(out.detach().reshape(-1, out.shape[-1])[-1].float().clone())

        handles += [module.register_forward_hook(keep) for module in modules[head]]
    try:
        yield rows
    finally:
        for handle in handles:
            handle.remove()


@dataclass(frozen=True, slots=True)
class Answer:
    tokens: list[int]
    """the Thinker's reply: every token chosen (the last is never fed)"""
    codes: Codes
    """[frames, 16]: each frame's codes, the talker LM's first and the predictor's 15"""
    wav: Audio | None = None
    """Code2Wav's waveform at 24 kHz (the reference's: one whole-sequence decode)"""


class Reference:
    """The whole transformers model around `parts` (built on the meta device, then given the
    parts' own modules: nothing is copied)."""

    def __init__(self, parts: Parts) -> None:
        config = parts["thinker"][1]
        with no_init_weights(), torch.device("meta"):
            whole = Qwen3OmniMoeForConditionalGeneration(config)
        whole.thinker = parts["thinker"][0]
        whole.talker = parts["talker"][0]
        whole.code2wav = parts["code2wav"][0]
        self.model = whole

    @contextmanager
    def _greedy_predictor(self, codes: list[torch.Tensor]) -> Iterator[None]:
        """The code predictor greedy, and the codes Code2Wav is given kept in `codes`; the
        shared modules are left as they were."""
        predictor, code2wav = self.model.talker.code_predictor, self.model.code2wav
        generate, decode = predictor.generate, code2wav.chunked_decode

        def greedy(*args: Any, **kwargs: Any) -> Any:
            return generate(*args, **{**kwargs, "do_sample": False})

        def kept(frames: torch.Tensor, **kwargs: Any) -> Any:
            codes.append(frames)
            return decode(frames, **kwargs)

        predictor.generate, code2wav.chunked_decode = greedy, kept
        try:
            yield
        finally:
            del predictor.generate, code2wav.chunked_decode  # back to the class's methods

    def answer(
        self, prompt: ThinkerPrompt, *, tokens: int, frames: int, speaker: str = "ethan"
    ) -> Answer:
        """generate() with audio out: `tokens` reply tokens, `frames` codec frames (the Talker
        chooses one code more, which is never decoded, as Parley's Talker does not)."""
        ids = torch.tensor([prompt.input_ids])
        media: dict[str, Any] = {}
        if prompt.audio is not None:
            media["input_features"] = prompt.audio.features
            media["feature_attention_mask"] = prompt.audio.mask
        if prompt.vision is not None:
            media["pixel_values"] = prompt.vision.pixel_values
            media["image_grid_thw"] = prompt.vision.grid_thw
        codes: list[torch.Tensor] = []
        with self._greedy_predictor(codes):
            thinker, wav = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                speaker=speaker,
                return_audio=True,
                thinker_max_new_tokens=tokens,
                thinker_min_new_tokens=tokens,
                thinker_do_sample=False,
                talker_do_sample=False,
                talker_max_new_tokens=frames + 1,
                talker_min_new_tokens=frames + 1,
                **media,
            )
        reply = thinker.sequences[0, len(prompt.input_ids) :].tolist()
        (decoded,) = codes
        return Answer(reply, decoded[0].T.numpy().astype(np.int32), wav[0, 0].numpy())


@dataclass
class Turn:
    """One session's turn in Parley: the Thinker's and the Talker's request state."""

    thinking: ThinkerState
    talking: TalkerState
    frames: list[Codes] = field(default_factory=list)


def talker_prompt(
    prompt: ThinkerPrompt, token_ids: list[int], states: npt.NDArray[np.floating], tts: Any
) -> TalkerPrompt:
    """What the Thinker engine's prompt chunk gives the Talker for `prompt` (its own media)."""
    media = PromptMedia().then(prompt.audio, prompt.vision)
    return TalkerPrompt(token_ids, states, tts, media.audio_lengths, media.image_grids)


def speak(
    thinker: ThinkerRunner,
    talker: TalkerRunner,
    prompts: Sequence[ThinkerPrompt],
    *,
    tokens: int,
    frames: int,
    chunk_tokens: int = 0,
    talker_early: bool = False,
) -> list[Answer]:
    """Every prompt answered at once, as the engines do it: one batched prefill (in chunks of
    `chunk_tokens` positions over all rows, 0: whole), then the
    Thinker's steps for all rows together, the Talker starting after the first reply token
    and stepping its frames for all rows together whenever every row has the text its next
    frame needs (the Thinker's last token is chosen, never fed). `talker_early`: the
    Talker's prompts are prefilled before the first reply token, as the engine does when
    that token has not come yet, and the first frame step feeds their last positions."""
    tts = thinker.special_embeddings([TOKENS["tts_bos"], TOKENS["tts_eos"], TOKENS["tts_pad"]])
    job = thinker.prefill_job([(prompt, None) for prompt in prompts], chunk_tokens=chunk_tokens)
    job.batch.begin()
    while not job.batch.done:
        job.batch.run_chunk()
    turns = []
    for prompt, (state, said) in zip(
        prompts, thinker.finish_prefill(job, min_new_tokens=tokens), strict=True
    ):
        opened = talker.open(talker_prompt(prompt, said.token_ids, said.states, tts))
        turns.append(Turn(state, opened))
    if talker_early:
        talker.prefill_batch([t.talking for t in turns])
    started = talker_early
    for fed in range(tokens):
        if fed < tokens - 1:
            steps = thinker.step_batch([t.thinking for t in turns], min_new_tokens=tokens)
            for turn, step in zip(turns, steps, strict=True):
                talker.add_reply(turn.talking, step.states)
        else:
            for turn in turns:
                talker.end_text(turn.talking)
        if not started:
            talker.prefill_batch([t.talking for t in turns])
            started = True
        _frames(talker, turns, frames)
    for turn in turns:
        thinker.release(turn.thinking)
        talker.release(turn.talking)
    return [Answer(t.thinking.generated, np.stack(t.frames).astype(np.int32)) for t in turns]


def _frames(talker: TalkerRunner, turns: list[Turn], frames: int) -> None:
    """Frame steps while every unfinished row has its text (the Talker engine's batch)."""
    while True:
        going = [t for t in turns if len(t.frames) < frames]
        if not going or not all(talker.text_ready(t.talking) or not t.frames for t in going):
            return
        fed = [t for t in going if t.frames or t.talking.prompt_end is not None]
        if fed:
            previous = [t.frames[-1] if t.frames else None for t in fed]
            talker.advance_batch([t.talking for t in fed], previous)
        for turn, codes in zip(
            going, talker.predict_batch([t.talking for t in going]), strict=True
        ):
            assert codes is not None, "codec EOS before min_frames"
            turn.frames.append(codes)


def stream_wav(
    code2wav: Any, codes: Codes, chunker: FrameChunker, *, lengths: Sequence[int] = ()
) -> Audio:
    """Parley's Code2Wav as it streams: `codes` pushed frame by frame through `chunker`,
    each window decoded with its left context (at the fixed window `lengths` the Code2Wav
    engine decodes at, where given), the pieces joined."""
    runner = Code2WavRunner(code2wav, lengths=lengths)
    pieces = []
    for frame in codes:
        if (window := chunker.push(frame)) is not None:
            pieces.append(runner.decode(*window))
    if (rest := chunker.flush()) is not None:
        pieces.append(runner.decode(*rest))
    return np.concatenate(pieces)
