"""The tiny random-weight Qwen3-Omni: built once per test run, graphs in or out of process.

Random weights never stop by themselves, so every length here is fixed by engine arguments.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from PIL import Image
from transformers import Qwen3OmniMoeConfig

from pipeline.engines.qwen3_omni.config import TOKENS as SPECIAL
from pipeline.engines.qwen3_omni.prompt import ByteVocab, chat_prompt
from pipeline.engines.qwen3_omni.talker_runner import TalkerPrompt, TalkerRunner, TalkerState
from pipeline.engines.qwen3_omni.thinker_runner import ThinkerPrompt, ThinkerRunner
from pipeline.engines.qwen3_omni.weights import build_part
from pipeline.types import VideoFrame

TOKENS = 12
FRAMES = 12


def graph_yaml(
    *,
    placement: str = "main",
    tokens: int = TOKENS,
    frames: int = FRAMES,
    first_chunk: int = 2,
    chunk: int = 5,
) -> str:
    """The tiny graph with its lengths and chunking set, every stage placed in `placement`
    except Code2Wav (always in this process, so tests can look at what reaches it)."""
    tiny = "tiny: true, threads: 1"
    return f"""\
name: qwen3_omni_tiny_test
stages:
  - name: thinker
    engine: qwen3_omni.thinker
    engine_args: {{{tiny}, max_new_tokens: {tokens}, min_new_tokens: {tokens},
                  prefix_cache_tokens: 4096}}
    placement: {{process: {placement}}}
  - name: talker
    engine: qwen3_omni.talker
    engine_args: {{{tiny}, max_frames: {frames}, min_frames: {frames}}}
    placement: {{process: {placement}}}
  - name: code2wav
    engine: qwen3_omni.code2wav
    engine_args: {{{tiny}, first_chunk: {first_chunk}, chunk: {chunk}, left_context: 5,
                  normalize_peak: 0.3}}
edges:
  - {{from: thinker, to: talker}}
  - {{from: talker, to: code2wav}}
outputs: [thinker, code2wav]
"""


def turn_audio(seconds: float = 1.0, seed: int = 0) -> npt.NDArray[np.int16]:
    """A turn's audio at 16 kHz: noise is all a random-weight model can tell apart."""
    rng = np.random.default_rng(seed)
    return rng.normal(0, 3000, int(16_000 * seconds)).clip(-32768, 32767).astype(np.int16)


def camera_frame(timestamp_ms: int, seed: int = 0) -> VideoFrame:
    """A 320x240 JPEG of noise."""
    pixels = np.random.default_rng(seed).integers(0, 256, (240, 320, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")
    return VideoFrame(image=out.getvalue(), timestamp_ms=timestamp_ms)


@pytest.fixture(scope="session")
def tiny_parts() -> dict[str, tuple[Any, Qwen3OmniMoeConfig]]:
    """The three parts of the tiny model, built once for the whole run. The runner tests only
    read them (a runner keeps its state, caches and rows, outside the model); a test that
    changes a model in place (fused experts) builds its own."""
    return {part: build_part(part, tiny=True) for part in ("thinker", "talker", "code2wav")}


def text_prompt(instructions: str) -> ThinkerPrompt:
    """A typed "hi" under `instructions` (prompts of different lengths batch differently)."""
    ids = chat_prompt(ByteVocab(), instructions=instructions, history=[], audio_tokens=0, text="hi")
    return ThinkerPrompt(ids)


def open_talker(
    thinker: ThinkerRunner, talker: TalkerRunner, prompt: ThinkerPrompt, reply_tokens: int
) -> TalkerState:
    """A Talker request prefilled from the Thinker's prompt and its first reply tokens."""
    tts = thinker.special_embeddings([SPECIAL["tts_bos"], SPECIAL["tts_eos"], SPECIAL["tts_pad"]])
    thinking, said = thinker.prefill(prompt)
    talking = talker.open(TalkerPrompt(said.token_ids, said.states, tts))
    for _ in range(reply_tokens):
        talker.add_reply(talking, thinker.step(thinking).states)
    talker.end_text(talking)
    talker.prefill(talking)
    return talking
