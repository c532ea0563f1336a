"""Parley's Qwen3-Omni answers as transformers' generate() answers, at tiny size and greedy:
the same reply tokens, all 16 codes of every codec frame, and the waveform, for a typed turn,
a spoken one and a spoken one with camera frames, one session alone and several stepped
together, on the plain steps and on cache rows (`reference.py` says how both are driven).

A reply of 4 tokens and 7 frames: the Talker's text runs out (the third frame step takes
tts_eos, the later ones tts_pad), as in every real answer, whose speech outlasts its text.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

from pipeline.engines.qwen3_omni.audio_features import AudioFeatures
from pipeline.engines.qwen3_omni.code2wav_runner import FrameChunker, window_lengths
from pipeline.engines.qwen3_omni.frame_predictor import FramePredictor
from pipeline.engines.qwen3_omni.prefix_cache import PrefixCache
from pipeline.engines.qwen3_omni.prompt import ByteVocab, chat_prompt
from pipeline.engines.qwen3_omni.slot_decoder import SlotDecoder
from pipeline.engines.qwen3_omni.talker_runner import TalkerRunner
from pipeline.engines.qwen3_omni.thinker_runner import ThinkerPrompt, ThinkerRunner
from pipeline.engines.qwen3_omni.thinker_slots import ThinkerSlots
from pipeline.engines.qwen3_omni.vision_input import FrameImages

from .conftest import camera_frame, turn_audio
from .reference import (
    GREEDY,
    HEADS,
    TALKER_CHOICE,
    Answer,
    Parts,
    Reference,
    recorded_logits,
    speak,
    stream_wav,
)

REPLY, FRAMES = 4, 7
LOGITS = 1e-5
"""Logits of every head at every step, against the reference's (peaks ~0.8): float
rounding (measured ~3e-7)."""
WAVE = 1e-5
"""Waveform samples, as a share of the answer's peak: float rounding."""
CASES = ("typed", "spoken", "spoken_with_frames")
INSTRUCTIONS = "Be brief."
ROWS = 4


def case_prompt(case: str) -> ThinkerPrompt:
    """A typed turn after an exchange; a spoken turn; a spoken turn with two camera frames."""
    if case == "typed":
        history = [("user", "hi"), ("assistant", "hello")]
        ids = chat_prompt(
            ByteVocab(),
            instructions=INSTRUCTIONS,
            history=history,
            audio_tokens=0,
            text="and then?",
        )
        return ThinkerPrompt(ids)
    audio = AudioFeatures()(turn_audio(1.0, seed=3))
    frames = [camera_frame(0, seed=4), camera_frame(80, seed=5)]
    vision = FrameImages()(frames) if case == "spoken_with_frames" else None
    assert audio is not None
    ids = chat_prompt(
        ByteVocab(),
        instructions=INSTRUCTIONS,
        history=[],
        audio_tokens=audio.tokens,
        text=None,
        image_tokens=vision.tokens if vision else (),
    )
    return ThinkerPrompt(ids, audio, vision)


@pytest.fixture(scope="module")
def reference(
    tiny_parts: Parts,
) -> dict[str, tuple[Answer, dict[str, torch.Tensor]]]:
    """Each case's answer from generate(), with every head's logits as it stepped."""
    model = Reference(tiny_parts)
    answers = {}
    for case in CASES:
        with recorded_logits(tiny_parts) as logits:
            answer = model.answer(case_prompt(case), tokens=REPLY, frames=FRAMES)
        answers[case] = (answer, {head: torch.stack(rows) for head, rows in logits.items()})
    return answers


def runners(parts: Parts, path: str) -> tuple[ThinkerRunner, TalkerRunner]:
    """Parley's Thinker and Talker runners, greedy as the reference is: `plain` steps (each
    request's own cache; a batch padded together), or decode on `rows` as the shipped graph
    does (static cache rows, the code predictor's frame as one step, a prefix cache), with
    the predictor's layers `compiled` as the shipped graph has them (`compile_predictor`)."""
    (thinker_model, config), (talker_model, _) = parts["thinker"], parts["talker"]
    if path == "plain":
        thinker = ThinkerRunner(thinker_model, config)
        talker = TalkerRunner(
            talker_model,
            config,
            codec_sampling=TALKER_CHOICE,
            predictor_sampling=GREEDY,
            min_frames=FRAMES,
        )
        return thinker, talker
    accept = int(config.talker_config.accept_hidden_layer)
    slots = ThinkerSlots(
        thinker_model, rows=ROWS, max_length=512, accept_layer=accept, reserve=REPLY, capture=False
    )
    thinker = ThinkerRunner(thinker_model, config, slots=slots, prefix_cache=PrefixCache(4096))
    talker = TalkerRunner(
        talker_model,
        config,
        codec_sampling=TALKER_CHOICE,
        predictor_sampling=GREEDY,
        min_frames=FRAMES,
        decoder=SlotDecoder(talker_model.model, rows=ROWS, max_length=512, capture=False),
        predictor=FramePredictor(
            talker_model, rows=ROWS, sampling=GREEDY, capture=False, compile=path == "compiled"
        ),
        reserve=FRAMES + 1,
    )
    return thinker, talker


def assert_same(got: Answer, want: Answer) -> None:
    assert got.tokens == want.tokens
    np.testing.assert_array_equal(got.codes, want.codes)


@pytest.mark.parametrize("talker_early", [False, True], ids=["talker-whole", "talker-early"])
@pytest.mark.parametrize("path", ["plain", "rows"])
@pytest.mark.parametrize("case", CASES)
def test_one_session_speaks_as_generate(
    tiny_parts: Parts,
    reference: dict[str, tuple[Answer, dict[str, torch.Tensor]]],
    case: str,
    path: str,
    talker_early: bool,
) -> None:
    """One session: its reply tokens and every frame's 16 codes are the reference's, each
    head's logits at each step are within float rounding of its (the Thinker's LM head, the
    talker LM's codec head, the predictor's 15 heads), and its speech streamed as the
    Code2Wav engine streams it (growing chunks, fixed window shapes) is the reference's
    waveform. On rows, the prompt's text prefix comes from the prefix cache. `talker_early`:
    the Talker's prompt prefilled before the first reply token (all but its last position,
    which the first frame step feeds), as the engine does when that token is slow."""
    want, want_logits = reference[case]
    thinker, talker = runners(tiny_parts, path)
    prompt = case_prompt(case)
    if path == "rows":  # another session's prompt leaves its text prefix in the cache
        thinker.release(thinker.prefill(case_prompt("typed"))[0])
    with recorded_logits(tiny_parts) as logits:
        (got,) = speak(
            thinker, talker, [prompt], tokens=REPLY, frames=FRAMES, talker_early=talker_early
        )
    if path == "rows":
        assert thinker.last_prefill_tokens < len(prompt.input_ids)  # the prefix was reused
    assert_same(got, want)
    for head in HEADS:
        ours = torch.stack(logits[head])
        torch.testing.assert_close(ours, want_logits[head][: len(ours)], atol=LOGITS, rtol=0)
    assert [len(logits[head]) for head in HEADS] == [REPLY, FRAMES, FRAMES * 15]
    # chunks of 2, 4 and 1 frames, each window from frame 0 (a context of all the frames)
    chunker = FrameChunker(first_chunk=2, chunk=4, left_context=FRAMES)
    code2wav = tiny_parts["code2wav"][0]
    wav = stream_wav(code2wav, got.codes, chunker, lengths=window_lengths(2, 4, FRAMES))
    assert want.wav is not None and len(wav) == len(want.wav)
    np.testing.assert_allclose(wav, want.wav, rtol=0, atol=WAVE * np.abs(want.wav).max())


@pytest.mark.parametrize("talker_early", [False, True], ids=["talker-whole", "talker-early"])
@pytest.mark.parametrize("path", ["plain", "rows"])
def test_sessions_stepped_together_each_speak_as_generate(
    tiny_parts: Parts,
    reference: dict[str, tuple[Answer, dict[str, torch.Tensor]]],
    path: str,
    talker_early: bool,
) -> None:
    """The three sessions at once: one batched prefill (prompts of different lengths and
    media; on rows in chunks of 32 positions a row, as the shipped graph chunks longer
    ones), then every Thinker step and every Talker frame for all of them in one batch (a
    padded batch of caches on `plain`, cache rows on `rows`; `talker_early`: the Talker's
    prompts prefilled at once before the first reply tokens, their last positions fed
    together by the first frame step). Each answers as it alone does under generate()."""
    thinker, talker = runners(tiny_parts, path)
    prompts = [case_prompt(case) for case in CASES]
    chunk = 96 if path == "rows" else 0
    answers = speak(
        thinker,
        talker,
        prompts,
        tokens=REPLY,
        frames=FRAMES,
        chunk_tokens=chunk,
        talker_early=talker_early,
    )
    for case, got in zip(CASES, answers, strict=True):
        assert_same(got, reference[case][0])
    if path == "rows":
        assert thinker.plain_steps == talker.plain_steps == 0  # all on the rows


@pytest.mark.timeout(120)  # Inductor compiles C++ kernels: ~40 s in CI with a cold cache
def test_a_compiled_predictor_speaks_as_generate(
    tiny_parts: Parts, reference: dict[str, tuple[Answer, dict[str, torch.Tensor]]]
) -> None:
    """The code predictor's layers compiled by torch.compile (Inductor; the only code the
    compiled path does not share with the cache rows) give the reference's codes and logits
    alone, and its codes in a batch of three. Alone, a frame's steps run at batch 1 (compiled
    with the batch static: its first step of two queries, then one query); the batch runs at
    4 (compiled again, the batch dynamic), as the captured sizes 2, 4, 8, ... run on a GPU.
    Compiling takes most of this test's time, as it did the test it replaces (compiled
    against uncompiled frames), which this proves and more: both equal the reference."""
    case = "spoken_with_frames"
    thinker, talker = runners(tiny_parts, "compiled")
    want, want_logits = reference[case]
    with recorded_logits(tiny_parts) as logits:
        (alone,) = speak(thinker, talker, [case_prompt(case)], tokens=REPLY, frames=FRAMES)
    assert_same(alone, want)
    torch.testing.assert_close(
        torch.stack(logits["predictor"]), want_logits["predictor"], atol=LOGITS, rtol=0
    )
    prompts = [case_prompt(case) for case in CASES]
    answers = speak(thinker, talker, prompts, tokens=REPLY, frames=FRAMES)
    for case, got in zip(CASES, answers, strict=True):
        assert_same(got, reference[case][0])


@pytest.fixture
def small_window_code2wav(tiny_parts: Parts) -> Any:
    """The tiny Code2Wav with a 4-frame attention window (two layers: a frame's samples
    read at most 6 frames back through it, a few more through the convolutions)."""
    config = copy.deepcopy(tiny_parts["code2wav"][1].code2wav_config)
    config.sliding_window = 4
    torch.manual_seed(5)
    return Qwen3OmniMoeCode2Wav._from_config(config, attn_implementation="sdpa").eval()


def test_streamed_code2wav_joins_into_the_whole_sequence_decode(
    small_window_code2wav: Any,
) -> None:
    """Code2Wav streamed in chunks (2, 4, 5, 5, ... frames, each window with 8 frames of left
    context before it) joins into one whole-sequence decode of the same 30 frames, sample for
    sample within float rounding: the left context covers all a frame's samples depend on.

    A window's last 555 samples (the decoder's transposed convolutions look one step ahead)
    need the frame after it; the next window, which has that frame, makes them. Parley cut
    them from both before: 23 ms of speech missing at every chunk boundary. transformers'
    own `chunked_decode` still does (a reference quirk: generate() decodes 300-frame chunks,
    so an answer over 24 s has a 555-sample hole every 24 s); shown below at 10-frame chunks.

    The shipped Code2Wav's attention window is 72 frames (8 layers), past its 25 frames of
    left context, as in `chunked_decode` (25): there the streamed speech approximates the
    whole decode (on the tiny model, within 2e-3 of the peak with 25 frames)."""
    codes = np.random.default_rng(0).integers(0, 2048, (30, 16)).astype(np.int32)
    whole = stream_wav(small_window_code2wav, codes, FrameChunker(first_chunk=30, chunk=30))
    assert len(whole) == 30 * 1920 - 555
    streamed = stream_wav(
        small_window_code2wav, codes, FrameChunker(first_chunk=2, chunk=5, left_context=8)
    )
    assert len(streamed) == len(whole)
    peak = np.abs(whole).max()
    np.testing.assert_allclose(streamed, whole, rtol=0, atol=WAVE * peak)

    with torch.inference_mode():
        frames = torch.from_numpy(codes.T[np.newaxis].astype(np.int64))
        chunked = small_window_code2wav.chunked_decode(frames, 10, 8)[0, 0].numpy()
    assert len(chunked) == len(whole) - 2 * 555  # two boundaries, a hole at each
    first = 10 * 1920 - 555
    np.testing.assert_allclose(chunked[:first], whole[:first], rtol=0, atol=WAVE * peak)
    np.testing.assert_allclose(  # after the first boundary: the whole decode 555 samples on
        chunked[first : first + 1920],
        whole[first + 555 : first + 555 + 1920],
        rtol=0,
        atol=WAVE * peak,
    )
