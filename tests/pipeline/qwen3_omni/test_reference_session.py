"""A spoken session through the whole graph answers each turn as transformers' generate()
answers the same conversation: the second turn going on from the first on session KV, the
Thinker and the Talker decoding on cache rows (the shipped graph's paths)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from pipeline.engines.qwen3_omni.audio_features import AudioInput
from pipeline.engines.qwen3_omni.talker import TalkerEngine
from pipeline.engines.qwen3_omni.talker_runner import TalkerState
from pipeline.engines.qwen3_omni.thinker import ThinkerEngine
from pipeline.engines.qwen3_omni.thinker_runner import ThinkerPrompt
from pipeline.graph import StageGraph
from pipeline.graph_config import parse_graph
from pipeline.registry import build_engines
from pipeline.types import AudioChunk, End, HistoryItem, PipelineRequest, TextDelta, VideoFrame

from .conftest import camera_frame, turn_audio
from .reference import GREEDY, TALKER_CHOICE, Answer, Parts, Reference

REPLY, FRAMES = 4, 6
GRAPH = f"""\
name: reference_session_test
stages:
  - name: thinker
    engine: qwen3_omni.thinker
    engine_args: {{tiny: true, threads: 1, max_new_tokens: {REPLY}, min_new_tokens: {REPLY},
                  session_kv_tokens: 4096, decode_rows: 2, max_context: 1024}}
  - name: talker
    engine: qwen3_omni.talker
    engine_args: {{tiny: true, threads: 1, max_frames: {FRAMES}, min_frames: {FRAMES},
                  decode_rows: 2, max_context: 1024}}
  - name: code2wav
    engine: qwen3_omni.code2wav
    engine_args: {{tiny: true, first_chunk: 2, chunk: 4, left_context: 4}}
edges:
  - {{from: thinker, to: talker}}
  - {{from: talker, to: code2wav}}
outputs: [thinker, code2wav]
"""


@contextmanager
def greedy_frames(talker: TalkerEngine) -> Iterator[list[npt.NDArray[np.int32]]]:
    """The Talker made greedy as generate(talker_do_sample=False) and a greedy predictor
    are, and every frame it makes kept (one request at a time)."""
    runner = talker.runner
    assert runner is not None and runner.predictor is not None
    runner.codec_sampling, runner.predictor_sampling = TALKER_CHOICE, GREEDY
    runner.predictor.sampling = GREEDY
    frames: list[npt.NDArray[np.int32]] = []
    predict = runner.predict_batch

    def kept(states: list[TalkerState]) -> list[npt.NDArray[np.int32] | None]:
        made = predict(states)
        frames.extend(codes for codes in made if codes is not None)
        return made

    runner.predict_batch = kept  # type: ignore[method-assign]
    try:
        yield frames
    finally:
        del runner.predict_batch


async def spoken_turn(
    graph: StageGraph,
    frames: list[npt.NDArray[np.int32]],
    rid: str,
    items: tuple[str, ...],
    history: tuple[HistoryItem, ...],
    audio: npt.NDArray[np.int16],
    images: tuple[VideoFrame, ...] = (),
) -> Answer:
    frames.clear()
    request = PipelineRequest(
        request_id=rid, audio=audio, frames=images, history=history, session_id="s",
        item_ids=items,
    )  # fmt: skip
    out = [chunk async for chunk in graph.generate(request)]
    assert isinstance(out[-1], End) and any(isinstance(c, AudioChunk) for c in out)
    words = "".join(c.text for c in out if isinstance(c, TextDelta)).split()
    return Answer([int(word.removeprefix("tok")) for word in words], np.stack(frames))


def both(first: AudioInput, second: AudioInput) -> AudioInput:
    """Two turns' audio as one prompt's, as the processor gives them (equal lengths here: the
    audio tower computes a padded audio within ~2e-4 of alone, test_session_kv.py)."""
    assert first.features.shape == second.features.shape
    return AudioInput(
        torch.cat((first.features, second.features)),
        torch.cat((first.mask, second.mask)),
        first.tokens + second.tokens,
    )


def assert_same(got: Answer, want: Answer) -> None:
    assert got.tokens == want.tokens
    np.testing.assert_array_equal(got.codes, want.codes)


def prompt_ids(thinker: ThinkerEngine) -> list[int]:
    """The session's last turn's prompt, as its entry keeps it (less the reply's fed tokens)."""
    assert thinker.sessions is not None
    entry = thinker.sessions.get("s")
    assert entry is not None
    return entry.token_ids[: entry.tokens - (REPLY - 1)]


async def test_a_spoken_follow_up_on_session_kv_speaks_as_generate(tiny_parts: Parts) -> None:
    """Turn 1 spoken; turn 2 spoken with a camera frame, prefilled on the session's KV (only
    its new positions). Each turn's reply tokens and all 16 codes of every frame equal those
    of generate() over the whole conversation (turn 2: both turns' audio, the first reply and
    the frame), which builds the Talker's prompt from every user item, spoken ones included."""
    config = parse_graph(GRAPH)
    engines: dict[str, Any] = build_engines(config)
    graph = StageGraph(config, engines)
    await graph.start()
    thinker, talker = engines["thinker"], engines["talker"]
    assert isinstance(thinker, ThinkerEngine) and isinstance(talker, TalkerEngine)
    assert thinker.features is not None and thinker.images is not None
    reference = Reference(tiny_parts)
    audio1, audio2 = turn_audio(1.0, seed=1), turn_audio(1.0, seed=2)
    frame = camera_frame(0, seed=2)
    heard1, heard2 = thinker.features(audio1), thinker.features(audio2)
    seen = thinker.images((frame,))
    assert heard1 is not None and heard2 is not None and seen is not None
    try:
        with greedy_frames(talker) as frames:
            first = await spoken_turn(graph, frames, "r1", ("u1",), (), audio1)
            ids1 = prompt_ids(thinker)
            said = (HistoryItem("assistant", " ".join(f"tok{t}" for t in first.tokens), "a1"),)
            items = ("u1", "a1", "u2")
            second = await spoken_turn(graph, frames, "r2", items, said, audio2, (frame,))
            ids2 = prompt_ids(thinker)
        assert ids2[: len(ids1)] == ids1
        assert thinker.runner is not None
        assert thinker.runner.last_prefill_tokens < len(ids2) - len(ids1)  # on the KV
    finally:
        await graph.close()
    want1 = reference.answer(ThinkerPrompt(ids1, heard1), tokens=REPLY, frames=FRAMES)
    assert_same(first, want1)
    whole = ThinkerPrompt(ids2, both(heard1, heard2), seen)
    assert_same(second, reference.answer(whole, tokens=REPLY, frames=FRAMES))
