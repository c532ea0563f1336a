"""Each engine on the engine contract: typed chunks out, and no request state after an abort,
a closed stream or a cancelled reader."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from pipeline.channel import Channel
from pipeline.engines.qwen3_omni.code2wav import Code2WavEngine
from pipeline.engines.qwen3_omni.talker import TalkerEngine
from pipeline.engines.qwen3_omni.thinker import ThinkerEngine
from pipeline.engines.qwen3_omni.weights import build_part
from pipeline.types import (
    AudioChunk,
    Chunk,
    CodecCodes,
    End,
    HiddenStates,
    PipelineRequest,
    StageInput,
    TextDelta,
)
from web.settings import SettingsError, parse_settings

from .conftest import camera_frame, turn_audio


def request(rid: str, rate: int = 24_000, text_only: bool = False) -> PipelineRequest:
    return PipelineRequest(
        request_id=rid,
        audio=turn_audio(1.0),
        frames=(camera_frame(0),),
        output_sample_rate=rate,
        output_text_only=text_only,
    )


@pytest.fixture
async def thinker() -> AsyncIterator[ThinkerEngine]:
    engine = ThinkerEngine(tiny=True, max_new_tokens=6, min_new_tokens=6)
    await engine.start()
    yield engine
    await engine.close()
    await engine.close()  # idempotent


@pytest.fixture
async def talker() -> AsyncIterator[TalkerEngine]:
    engine = TalkerEngine(tiny=True, max_frames=30, min_frames=30)
    await engine.start()
    yield engine
    await engine.close()


@pytest.fixture
async def code2wav() -> AsyncIterator[Code2WavEngine]:
    engine = Code2WavEngine(tiny=True, first_chunk=2, chunk=4, left_context=4, normalize_peak=0.3)
    await engine.start()
    yield engine
    await engine.close()


async def feed(chunks: list[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


async def test_thinker_streams_text_and_the_hidden_states_the_talker_needs(
    thinker: ThinkerEngine,
) -> None:
    out = [c async for c in thinker.generate("t1", request("t1"))]
    assert isinstance(out[-1], End)
    prompt = out[0]
    assert isinstance(prompt, HiddenStates) and prompt.metadata["part"] == "prompt"
    assert prompt.array.shape == (len(prompt.metadata["token_ids"]), 2, 64)
    assert prompt.metadata["tts_embeds"].shape == (3, 64)
    assert prompt.metadata["audio_feature_lengths"] == [100]  # 1 s of mel frames
    assert prompt.metadata["image_grid_thw"] == [[1, 16, 20]]  # the camera frame's patches
    text = [c for c in out if isinstance(c, TextDelta)]
    reply = [c for c in out if isinstance(c, HiddenStates) and c.metadata["part"] == "reply"]
    assert len(text) == 6 and all(t.text.startswith("tok") for t in text)
    assert len(reply) == 5  # the last token is chosen, never fed
    assert thinker.active_requests() == 0


async def test_thinker_abort_and_cancel_leave_nothing(thinker: ThinkerEngine) -> None:
    stream = thinker.generate("t2", request("t2"))
    await anext(stream)
    assert thinker.active_requests() == 1
    await thinker.abort("t2")
    assert [c async for c in stream] == []  # ends at its next step, with no End
    assert thinker.active_requests() == 0

    async def read() -> None:
        async for _ in thinker.generate("t3", request("t3")):
            await asyncio.sleep(0.005)

    task = asyncio.create_task(read())
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.wait({task})
    assert thinker.active_requests() == 0


async def test_talker_speaks_from_hidden_states_and_aborts_cleanly(
    thinker: ThinkerEngine, talker: TalkerEngine
) -> None:
    upstream = [c async for c in thinker.generate("h1", request("h1"))]
    frames = [c async for c in talker.generate("h1", StageInput(request("h1"), feed(upstream)))]
    assert isinstance(frames[-1], End)
    codes = [c for c in frames if isinstance(c, CodecCodes)]
    assert len(codes) == 30
    assert all(c.codes.shape == (1, 16) and c.codes.dtype == np.int32 for c in codes)
    assert talker.active_requests() == 0

    # abort while the Talker waits for text the Thinker has not sent yet
    held: Channel[Chunk] = Channel(16)
    for chunk in upstream[:3]:  # the prompt and the first reply token: enough to start
        await held.send(chunk)
    stream = talker.generate("h2", StageInput(request("h2"), aiter(held)))
    first = await anext(stream)
    assert isinstance(first, CodecCodes)
    assert talker.active_requests() == 1
    await talker.abort("h2")
    assert [c async for c in stream] == []  # it stops waiting, with no End
    assert talker.active_requests() == 0
    held.discard()


async def test_a_capped_reply_is_spoken_in_proportion(
    thinker: ThinkerEngine, talker: TalkerEngine
) -> None:
    """A response's `max_output_tokens` caps the Thinker's reply, `min_new_tokens` or not,
    and a random-weight Talker with `frames_per_token` speaks a reply in proportion to it:
    what lets the serve benchmark vary its answers' lengths."""
    capped = dataclasses.replace(request("m1"), max_output_tokens=3)
    upstream = [c async for c in thinker.generate("m1", capped)]
    assert len([c for c in upstream if isinstance(c, TextDelta)]) == 3  # 6 without the cap
    talker.frames_per_token = 4.0
    spoken = [c async for c in talker.generate("m1", StageInput(capped, feed(upstream)))]
    assert len([c for c in spoken if isinstance(c, CodecCodes)]) == 8  # 2 tokens fed x 4
    whole = [c async for c in thinker.generate("m2", request("m2"))]
    spoken = [c async for c in talker.generate("m2", StageInput(request("m2"), feed(whole)))]
    assert len([c for c in spoken if isinstance(c, CodecCodes)]) == 20  # 5 fed x 4 (< 30)


async def test_talker_says_nothing_for_a_text_only_response(talker: TalkerEngine) -> None:
    out = [
        c async for c in talker.generate("h3", StageInput(request("h3", text_only=True), feed([])))
    ]
    assert out == [End()]


async def test_code2wav_streams_pcm_at_the_requested_rate_and_aborts_cleanly(
    code2wav: Code2WavEngine,
) -> None:
    rng = np.random.default_rng(1)
    frames: list[Chunk] = [
        CodecCodes(codes=rng.integers(0, 2048, (1, 16), dtype=np.int32)) for _ in range(10)
    ]
    out = [
        c async for c in code2wav.generate("c1", StageInput(request("c1", 16_000), feed(frames)))
    ]
    assert isinstance(out[-1], End)
    audio = [c for c in out if isinstance(c, AudioChunk)]
    assert len(audio) == 3  # 2 frames, then 4 and 4 with left context
    assert all(a.sample_rate == 16_000 for a in audio)
    pcm = np.concatenate([a.pcm for a in audio])
    assert abs(len(pcm) - 10 * 1280) < 3 * 1280 and np.abs(pcm).max() > 1000  # noise, not silence

    stream = code2wav.generate("c2", StageInput(request("c2"), feed(frames)))
    assert isinstance(await anext(stream), AudioChunk)
    assert code2wav.active_requests() == 1
    await code2wav.abort("c2")
    assert [c async for c in stream] == []
    assert code2wav.active_requests() == 0


async def test_a_checkpoint_named_by_parley_model_path_is_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved, config = build_part("code2wav", tiny=True, seed=9)
    config.save_pretrained(tmp_path)
    weights = {f"code2wav.{k}": v.contiguous() for k, v in saved.state_dict().items()}
    save_file(weights, tmp_path / "model.safetensors")
    monkeypatch.setenv("PARLEY_MODEL_PATH", "")  # restored (unset) after the test
    _, settings = parse_settings(["serve", "--model-path", str(tmp_path)])  # as `parley serve`
    assert os.environ["PARLEY_MODEL_PATH"] == str(tmp_path)
    engine = Code2WavEngine(tiny=True)  # the checkpoint wins over random weights
    await engine.start()
    try:
        loaded = engine.model.state_dict()
        assert all(torch.equal(loaded[k[len("code2wav.") :]], v) for k, v in weights.items())
    finally:
        await engine.close()
    with pytest.raises(SettingsError, match="not a directory"):
        parse_settings(["serve", "--model-path", str(tmp_path / "missing")])
