"""A spoken turn streamed to the Thinker while the user speaks answers exactly as the same
turn taken whole: the same reply tokens and the same hidden states for the Talker, on a
session's first turn and on a follow-up that goes on from its KV; only the rest is left for
the turn's end. A turn dropped mid-speech leaves the session's KV as it was, and a turn the
engine does not have (a restarted stage) or cannot use is taken whole, counted."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest
import torch
from prometheus_client import generate_latest

from pipeline.engines.qwen3_omni.audio_features import AudioFeatures, audio_token_count
from pipeline.engines.qwen3_omni.talker_runner import TalkerPrompt, TalkerRunner
from pipeline.engines.qwen3_omni.thinker import ThinkerEngine
from pipeline.metrics import PipelineMetrics
from pipeline.types import (
    Chunk,
    End,
    HiddenStates,
    HistoryItem,
    PipelineRequest,
    StreamingInput,
    TextDelta,
    VideoFrame,
    streams_input,
)

from .conftest import camera_frame, turn_audio
from .reference import GREEDY, TALKER_CHOICE, Codes, Parts

REPLY = 4
FRAMES = 6
CLOSE = 1e-5
"""Hidden states against the whole turn's: float rounding (the audio tower's windows and the
decoder layers run in other shapes)."""
SECOND = 16_000
PIECE = SECOND // 5
"""The session's audio arrives in pieces of 200 ms."""


@pytest.fixture(params=[0, 3], ids=["plain-decode", "decode-on-cache-rows"])
async def thinker(request: pytest.FixtureRequest) -> AsyncIterator[ThinkerEngine]:
    engine = ThinkerEngine(
        tiny=True,
        threads=1,
        max_new_tokens=REPLY,
        min_new_tokens=REPLY,
        session_kv_tokens=8192,
        decode_rows=request.param,
        max_context=1024,
    )
    await engine.start()
    assert engine.streamed is not None
    engine.streamed.staging.gather_s = 0.01  # the tests' audio comes at once, not in seconds
    yield engine
    await engine.close()


def request(
    rid: str,
    session: str,
    items: tuple[str, ...],
    history: tuple[HistoryItem, ...] = (),
    *,
    audio: np.ndarray | None = None,
    streamed: str = "",
    frames: tuple[VideoFrame, ...] = (),
) -> PipelineRequest:
    return PipelineRequest(
        request_id=rid,
        audio=audio if audio is not None else np.zeros(0, dtype=np.int16),
        frames=frames,
        history=history,
        instructions="Be brief.",
        session_id=session,
        item_ids=items,
        streamed_turn=streamed,
    )


async def answer(engine: ThinkerEngine, turn: PipelineRequest) -> list[Chunk]:
    chunks = [c async for c in engine.generate(turn.request_id, turn)]
    assert isinstance(chunks[-1], End)
    return chunks


def reply(chunks: list[Chunk]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TextDelta)).strip()


def assert_same(got: list[Chunk], want: list[Chunk]) -> None:
    """The same reply, and the same hidden states for the Talker (prompt, then each step)."""
    assert reply(got) == reply(want) != ""
    hidden = [c for c in got if isinstance(c, HiddenStates)]
    wanted = [c for c in want if isinstance(c, HiddenStates)]
    assert len(hidden) == len(wanted) == REPLY
    prompt, whole = hidden[0], wanted[0]
    assert prompt.metadata["token_ids"] == whole.metadata["token_ids"]
    assert prompt.metadata["audio_feature_lengths"] == whole.metadata["audio_feature_lengths"]
    for mine, theirs in zip(hidden, wanted, strict=True):
        np.testing.assert_allclose(mine.array, theirs.array, atol=CLOSE, rtol=0)


def speech(parts: Parts, chunks: list[Chunk]) -> Codes:
    """The codec frames the Talker (tiny, greedy as the reference is) makes of an answer's
    hidden states: what the listener would hear."""
    model, config = parts["talker"]
    talker = TalkerRunner(
        model, config, codec_sampling=TALKER_CHOICE, predictor_sampling=GREEDY, min_frames=FRAMES
    )
    prompt, *replies = [c for c in chunks if isinstance(c, HiddenStates)]
    meta = prompt.metadata
    lengths = tuple(meta["audio_feature_lengths"])
    said = TalkerPrompt(meta["token_ids"], prompt.array, meta["tts_embeds"], lengths)
    state = talker.open(said)
    for reply_states in replies:
        talker.add_reply(state, reply_states.array)
    talker.end_text(state)
    talker.prefill(state)
    frames: list[Codes] = []
    for _ in range(FRAMES):
        if frames:
            talker.advance(state, frames[-1])
        codes = talker.predict(state)
        assert codes is not None
        frames.append(codes)
    talker.release(state)
    return np.stack(frames)


async def stream(
    engine: ThinkerEngine, turn_id: str, context: PipelineRequest, audio: np.ndarray
) -> None:
    """The turn opened and its audio fed as it comes; waits for the staging to catch up."""
    await engine.open_turn(turn_id, context)
    for start in range(0, len(audio), PIECE):
        await engine.feed_turn(turn_id, audio[start : start + PIECE])
    assert engine.streamed is not None
    turn = engine.streamed._turns[turn_id]
    if turn.task is not None:
        await turn.task


def prefilled(engine: ThinkerEngine) -> int:
    assert engine.runner is not None
    return engine.runner.last_prefill_tokens


def closing(frames: int, staged_frames: int) -> int:
    """Positions left at the turn's end: the audio after the staged windows, then
    `<|audio_end|><|im_end|>\\n<|im_start|>assistant\\n`."""
    return audio_token_count(frames) - audio_token_count(staged_frames) + 6


def test_the_engines_that_take_streaming_input_say_so(thinker: ThinkerEngine) -> None:
    from pipeline.engines.cascade.thinker import ThinkerEngine as CascadeThinker
    from pipeline.engines.moshi.duplex_stage import MoshiStage
    from pipeline.engines.openai_chat.thinker import ChatThinkerEngine

    assert streams_input(thinker)
    for other in (CascadeThinker, ChatThinkerEngine, MoshiStage):
        assert not issubclass(other, StreamingInput)


async def test_a_thinker_told_not_to_stream_takes_every_turn_whole() -> None:
    """`stream_turns: false` (the benchmarks' baseline): the engine says it takes no streamed
    turns, so neither a session nor a stage's link opens one on it."""
    engine = ThinkerEngine(
        tiny=True, threads=1, max_new_tokens=REPLY, min_new_tokens=REPLY, stream_turns=False
    )
    await engine.start()
    try:
        assert engine.streamed is None
        assert not streams_input(engine)
        await engine.open_turn("t1", request("s1", "whole", ()))  # let go, as documented
        turn = request("r1", "whole", ("u1",), audio=turn_audio(1.0, seed=3), streamed="t1")
        assert reply(await answer(engine, turn))  # answered from the request alone
        assert engine.streamed_turns() == {}
    finally:
        await engine.close()


def test_a_frame_is_final_once_its_window_of_samples_is_in() -> None:
    """The log-mel frames `final_frames` names are those of the whole turn, bit for bit
    from a window of frames on (what a streamed turn prefills: whole windows of 100). A
    prefix of 2 frames matches to within rounding only: MKL transforms so few frames
    another way on some CPUs (an AMD EPYC here, 2026-12-06: 6e-8 apart in 4 values)."""
    features = AudioFeatures()
    audio = turn_audio(3.0, seed=7)
    whole = features(audio)
    assert whole is not None
    for samples in (400, 16_040, 20_000, 33_333):
        final = features.final_frames(samples)
        prefix = features(audio[:samples])
        assert prefix is not None and final > 0
        got, want = prefix.features[:, :, :final], whole.features[:, :, :final]
        if final >= 100:
            assert torch.equal(got, want)
        else:
            assert torch.allclose(got, want, rtol=0, atol=1e-6)
        after = final + 1  # the next frame still waits for samples to come
        assert not torch.equal(prefix.features[:, :, :after], whole.features[:, :, :after])


@pytest.mark.parametrize("seconds", [8.3, 10.0], ids=["rest-within-a-chunk", "rest-of-chunks"])
async def test_a_streamed_first_turn_answers_as_the_whole_turn(
    thinker: ThinkerEngine, tiny_parts: Parts, seconds: float
) -> None:
    """A session's first turn, 8.3 s or 10 s: the prompt before the audio and the tower's
    first 8 s window are prefilled while it arrives; at its end only the rest (0.3 s within
    one conv chunk, or 2 s) and the closing tokens are. The Talker speaks the same codes."""
    audio = turn_audio(seconds, seed=11)
    whole = await answer(thinker, request("w1", f"whole{seconds}", ("u1",), audio=audio))
    session = f"streamed{seconds}"
    context = request("s1", session, ("u1",))
    await stream(thinker, "t1", context, audio)
    staged = thinker.streamed.staged_positions("t1") if thinker.streamed else 0
    assert staged > audio_token_count(800)  # the lead and the first window
    turn = request("s1", session, ("u1",), audio=audio, streamed="t1")
    streamed = await answer(thinker, turn)
    frames = len(audio) // 160
    assert prefilled(thinker) == closing(frames, 800)
    assert_same(streamed, whole)
    np.testing.assert_array_equal(speech(tiny_parts, streamed), speech(tiny_parts, whole))
    assert thinker.streamed is not None and len(thinker.streamed) == 0


async def test_a_streamed_follow_up_goes_on_from_the_session_kv(
    thinker: ThinkerEngine, tiny_parts: Parts
) -> None:
    """A second turn (9 s) streamed after a first one: its lead (the tail of the first turn
    and its own opening) and first window go after the session's KV as it arrives, and it
    answers as the same turn taken whole in a session with the same first turn."""
    first = turn_audio(1.0, seed=1)
    second = turn_audio(9.0, seed=2)
    answers = {}
    for session in ("kw", "ks"):
        said = reply(await answer(thinker, request(f"{session}1", session, ("u1",), audio=first)))
        history = (HistoryItem("assistant", said, "a1"),)
        items = ("u1", "a1", "u2")
        if session == "ks":
            await stream(thinker, "t2", request("x", session, items, history), second)
        turn = request(f"{session}2", session, items, history, audio=second)
        if session == "ks":
            turn = request(f"{session}2", session, items, history, audio=second, streamed="t2")
        answers[session] = await answer(thinker, turn)
        if session == "ks":
            assert prefilled(thinker) == closing(900, 800)
    assert_same(answers["ks"], answers["kw"])
    np.testing.assert_array_equal(
        speech(tiny_parts, answers["ks"]), speech(tiny_parts, answers["kw"])
    )
    assert thinker.sessions is not None
    kept, whole = thinker.sessions.get("ks"), thinker.sessions.get("kw")
    assert kept is not None and whole is not None and kept.token_ids == whole.token_ids


async def test_a_turn_dropped_mid_speech_leaves_no_trace(thinker: ThinkerEngine) -> None:
    """Half a turn streamed (its first window prefilled), then dropped: the session's entry
    is as it was, and its next turn answers as in a session that never had it."""
    first = turn_audio(1.0, seed=3)
    said = {}
    for session in ("dn", "dd"):
        said[session] = reply(await answer(thinker, request("d1", session, ("u1",), audio=first)))
    history = (HistoryItem("assistant", said["dd"], "a1"),)
    assert thinker.sessions is not None
    before = thinker.sessions.get("dd")
    assert before is not None
    keys = [layer.keys.clone() for layer in before.cache.layers if layer.keys is not None]
    await stream(thinker, "t3", request("x", "dd", ("u1", "a1", "u2"), history), turn_audio(9.0))
    assert thinker.streamed is not None and thinker.streamed.staged_positions("t3") > 104
    await thinker.drop_turn("t3")
    await thinker.drop_turn("t3")  # idempotent
    after = thinker.sessions.get("dd")
    assert after is before and after.cache.get_seq_length() == before.tokens
    for layer, kept in zip(after.cache.layers, keys, strict=True):
        assert layer.keys is not None and torch.equal(layer.keys, kept)
    assert len(thinker.streamed) == 0
    spoken = turn_audio(2.0, seed=4)
    answers = [
        await answer(
            thinker,
            request(
                f"{s}2",
                s,
                ("u1", "a1", "u2"),
                (HistoryItem("assistant", said[s], "a1"),),
                audio=spoken,
            ),
        )
        for s in ("dn", "dd")
    ]
    assert_same(answers[1], answers[0])


@pytest.mark.parametrize("case", ["missing", "changed", "frames"])
async def test_a_turn_it_cannot_use_is_taken_whole_and_counted(
    thinker: ThinkerEngine, case: str
) -> None:
    """`missing`: the request names a turn the engine does not have (its stage restarted);
    `changed`: what was streamed is not the turn's audio; `frames`: the turn came with a
    camera frame (taken whole for now: its image goes before the audio). Each is answered
    from the request alone, as the whole turn is, and counted in the stage's metrics."""
    audio = turn_audio(9.0, seed=5)
    frames = (camera_frame(0, seed=3),) if case == "frames" else ()
    whole = await answer(thinker, request("c1", f"cw{case}", ("u1",), audio=audio, frames=frames))
    assert thinker.streamed is not None
    outcome = "changed" if case == "frames" else case
    counted = thinker.streamed_turns()[outcome]
    session = f"cs{case}"
    if case != "missing":
        streamed_audio = turn_audio(9.0, seed=6) if case == "changed" else audio
        await stream(thinker, "t4", request("x", session, ("u1",)), streamed_audio)
    else:  # streamed, then the stage restarts: what it staged is gone with it
        await stream(thinker, "t4", request("x", session, ("u1",)), audio)
        await thinker.close()
        await thinker.start()
        assert thinker.streamed is not None
        counted = thinker.streamed_turns()[case]
    turn = request("c1", session, ("u1",), audio=audio, streamed="t4", frames=frames)
    streamed = await answer(thinker, turn)
    whole_prompt = thinker._fitted_prompt(turn, None).prompt.input_ids  # noqa: SLF001
    assert prefilled(thinker) == len(whole_prompt)
    assert_same(streamed, whole)
    assert thinker.streamed_turns()[outcome] == counted + 1
    metrics = PipelineMetrics()
    metrics.watch_engine("thinker", thinker)
    line = f'parley_stage_streamed_turns_total{{outcome="{outcome}",stage="thinker"}} '
    assert f"{line}{counted + 1}.0" in generate_latest(metrics.registry).decode()


async def test_a_turn_judged_unfinished_at_a_pause_goes_on_streaming(
    thinker: ThinkerEngine,
) -> None:
    """The user pauses after 5 s: the transcription asked then (`judge_turn_end`) names the
    turn and leaves it open; the user goes on, and the turn's answer is the whole turn's."""
    audio = turn_audio(10.0, seed=8)
    whole = await answer(thinker, request("p1", "pw", ("u1",), audio=audio))
    half = 5 * SECOND
    await stream(thinker, "t5", request("x", "ps", ("u1",)), audio[:half])
    pause = PipelineRequest(
        request_id="p0",
        audio=audio[:half],
        session_id="ps",
        item_ids=("u1",),
        transcribe_only=True,
        judge_turn_end=True,
        streamed_turn="t5",
    )
    assert [c async for c in thinker.generate("p0", pause)] == [End()]
    assert thinker.streamed is not None and len(thinker.streamed) == 1  # still open
    for start in range(half, len(audio), PIECE):
        await thinker.feed_turn("t5", audio[start : start + PIECE])
    streamed = await answer(thinker, request("p1", "ps", ("u1",), audio=audio, streamed="t5"))
    assert prefilled(thinker) == closing(len(audio) // 160, 800)
    assert_same(streamed, whole)
