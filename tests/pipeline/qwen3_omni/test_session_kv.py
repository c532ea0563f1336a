"""A session's Thinker KV between its turns: the next turn prefills only what it adds and
answers as a full prefill of the same tokens would; a conversation that changed, a session
over its budget, an aborted turn and an ended session leave no entry behind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial

import numpy as np
import pytest
import redis.asyncio as aioredis
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from pipeline.engine_pipeline import EnginePipeline
from pipeline.engines.qwen3_omni.audio_features import AudioInput
from pipeline.engines.qwen3_omni.config import TOKENS
from pipeline.engines.qwen3_omni.host_states import for_the_talker
from pipeline.engines.qwen3_omni.session_kv import (
    Conversation,
    PromptMedia,
    SessionEntry,
    SessionKV,
)
from pipeline.engines.qwen3_omni.thinker import ThinkerEngine
from pipeline.engines.qwen3_omni.thinker_runner import ThinkerPrompt, ThinkerRunner
from pipeline.engines.qwen3_omni.vision_input import VisionInput
from pipeline.graph import StageGraph
from pipeline.graph_config import parse_graph
from pipeline.registry import build_engines
from pipeline.types import (
    AudioChunk,
    Chunk,
    End,
    HiddenStates,
    HistoryItem,
    PipelineRequest,
    TextDelta,
    VideoFrame,
)
from pipeline.worker import WorkerEngine
from sessions.events import Event, ResponseDone
from sessions.manager import SessionManager
from tests.fakes.sink import ClockedSink

from .conftest import camera_frame, turn_audio

REPLY = 5
"""Reply tokens per turn (random weights never stop by themselves); the last is never fed."""
CLOSE = 1e-5
PADDED = 1e-3
"""A full prefill encodes two turns' audio as one batch, the shorter padded, which the audio
tower computes to within ~2e-4 of each audio alone (audios of equal length: within 1e-7)."""


@pytest.fixture(params=[0, 3], ids=["plain-decode", "decode-on-cache-rows"])
async def thinker(request: pytest.FixtureRequest) -> AsyncIterator[ThinkerEngine]:
    engine = ThinkerEngine(
        tiny=True,
        threads=1,
        max_new_tokens=REPLY,
        min_new_tokens=REPLY,
        session_kv_tokens=4096,
        decode_rows=request.param,
        max_context=1024,
    )
    await engine.start()
    yield engine
    await engine.close()


def turn(
    rid: str,
    session: str,
    items: tuple[str, ...],
    history: tuple[HistoryItem, ...] = (),
    *,
    audio: np.ndarray | None = None,
    frames: tuple[VideoFrame, ...] = (),
    text: str | None = None,
    instructions: str = "",
) -> PipelineRequest:
    return PipelineRequest(
        request_id=rid,
        audio=audio if audio is not None else np.zeros(0, dtype=np.int16),
        text=text,
        frames=frames,
        history=history,
        instructions=instructions,
        session_id=session,
        item_ids=items,
    )


async def answer(engine: ThinkerEngine, request: PipelineRequest) -> tuple[str, list[Chunk]]:
    """The reply as the session records it (deltas joined, stripped), and every chunk."""
    chunks = [c async for c in engine.generate(request.request_id, request)]
    assert isinstance(chunks[-1], End)
    return "".join(c.text for c in chunks if isinstance(c, TextDelta)).strip(), chunks


def entry(engine: ThinkerEngine, session: str) -> SessionEntry:
    assert engine.sessions is not None
    found = engine.sessions.get(session)
    assert found is not None
    return found


def plain_runner(engine: ThinkerEngine) -> ThinkerRunner:
    """A runner of the engine's model with no cache of any kind: full prefills."""
    assert engine.config is not None
    return ThinkerRunner(engine.model, engine.config)


def prefilled(engine: ThinkerEngine) -> int:
    assert engine.runner is not None
    return engine.runner.last_prefill_tokens


def both_audios(first: AudioInput, second: AudioInput) -> AudioInput:
    """Two turns' audio as one prompt's (right-padded, masked), as the processor makes it."""
    frames = max(first.features.shape[2], second.features.shape[2])
    features = torch.cat(
        [F.pad(a.features, (0, frames - a.features.shape[2])) for a in (first, second)]
    )
    mask = torch.cat([F.pad(a.mask, (0, frames - a.mask.shape[1])) for a in (first, second)])
    return AudioInput(features, mask, first.tokens + second.tokens)


def both_images(first: VisionInput, second: VisionInput) -> VisionInput:
    return VisionInput(
        torch.cat((first.pixel_values, second.pixel_values)),
        torch.cat((first.grid_thw, second.grid_thw)),
        first.tokens + second.tokens,
    )


def assert_same_cache(got: DynamicCache, want: DynamicCache) -> None:
    assert got.get_seq_length() == want.get_seq_length()
    for mine, theirs in zip(got.layers, want.layers, strict=True):
        assert mine.keys is not None and theirs.keys is not None
        assert mine.values is not None and theirs.values is not None
        torch.testing.assert_close(mine.keys, theirs.keys, atol=CLOSE, rtol=0)
        torch.testing.assert_close(mine.values, theirs.values, atol=CLOSE, rtol=0)


@dataclass
class TwoTurns:
    first: SessionEntry
    second: SessionEntry
    prompt: ThinkerPrompt
    """the second turn's whole prompt, with both turns' media"""
    chunks: list[Chunk]
    reply: str


async def two_spoken_turns(engine: ThinkerEngine, seconds: float) -> TwoTurns:
    """Two spoken turns with a camera frame each (the second `seconds` long), one session."""
    audio1, audio2 = turn_audio(1.0, seed=1), turn_audio(seconds, seed=2)
    frame1, frame2 = camera_frame(0, seed=1), camera_frame(500, seed=2)
    reply1, _ = await answer(engine, turn("r1", "s", ("u1",), audio=audio1, frames=(frame1,)))
    first = entry(engine, "s")
    assert first.tail[-2:] == [TOKENS["im_end"], TOKENS["newline"]]
    said = (HistoryItem("assistant", reply1, "a1"),)
    second_turn = turn("r2", "s", ("u1", "a1", "u2"), said, audio=audio2, frames=(frame2,))
    reply2, chunks = await answer(engine, second_turn)
    second = entry(engine, "s")
    ids = second.token_ids[: second.tokens - (REPLY - 1)]
    assert ids[: first.tokens + len(first.tail)] == first.token_ids + first.tail
    assert prefilled(engine) == len(ids) - first.tokens  # only the new part
    features, images = engine.features, engine.images
    assert features is not None and images is not None
    audio = both_audios(*[a for a in (features(audio1), features(audio2)) if a is not None])
    vision = both_images(*[v for v in (images((frame1,)), images((frame2,))) if v is not None])
    return TwoTurns(first, second, ThinkerPrompt(ids, audio, vision), chunks, reply2)


async def test_a_second_turn_prefills_only_its_new_tokens_and_matches_a_full_prefill(
    thinker: ThinkerEngine,
) -> None:
    """The second of two spoken turns prefills only its own tokens and ends with the KV,
    hidden states and tokens of a full prefill of the same ids with both turns' media."""
    turns = await two_spoken_turns(thinker, seconds=1.0)
    second, ids = turns.second, turns.prompt.input_ids
    plain = plain_runner(thinker)
    full_state, full = await thinker.thread.call(plain.prefill, turns.prompt)
    assert plain.last_prefill_tokens == len(ids)
    np.testing.assert_allclose(second.hidden[: len(ids)], full.states, atol=CLOSE)
    for fed in range(REPLY - 1):
        step = await thinker.thread.call(plain.step, full_state)
        np.testing.assert_allclose(second.hidden[len(ids) + fed], step.states[0], atol=CLOSE)
    assert second.token_ids[len(ids) :] + second.tail[:1] == full_state.generated
    assert turns.reply == "".join(f"tok{t} " for t in full_state.generated).strip()
    assert second.rope_delta == full_state.rope_delta
    assert_same_cache(second.cache, full_state.cache)

    # the Talker gets every user position (the first turn's spoken item too, as generate()
    # builds its prompt; not the first reply's) with both turns' audio lengths and image
    # grids, to place them
    prompt_chunk = turns.chunks[0]
    assert isinstance(prompt_chunk, HiddenStates) and prompt_chunk.metadata["part"] == "prompt"
    talker_ids, talker_states = for_the_talker(ids, full.states)
    assert len(talker_ids) < len(ids)
    assert prompt_chunk.metadata["token_ids"] == talker_ids
    np.testing.assert_allclose(prompt_chunk.array, talker_states, atol=CLOSE)
    audio, vision = turns.prompt.audio, turns.prompt.vision
    assert audio is not None and vision is not None
    assert prompt_chunk.metadata["audio_feature_lengths"] == audio.mask.sum(dim=1).tolist()
    assert prompt_chunk.metadata["image_grid_thw"] == vision.grid_thw.tolist()


async def test_the_new_part_takes_the_positions_of_a_full_rope_index(
    thinker: ThinkerEngine,
) -> None:
    """mRoPE: the new part's own positions (its audio and image only), shifted to the entry's
    next position, are those a get_rope_index of the whole sequence gives (which needs every
    audio's length and every image's grid); the turn answers as the full prefill does."""
    turns = await two_spoken_turns(thinker, seconds=0.6)
    first, model = turns.first, thinker.model
    audio, vision = turns.prompt.audio, turns.prompt.vision
    assert audio is not None and vision is not None
    whole = torch.tensor([turns.prompt.input_ids])
    lengths = audio.mask.sum(dim=1)
    positions, delta = model.get_rope_index(
        whole, vision.grid_thw, None, torch.ones_like(whole), False, lengths, None
    )
    new = whole[:, first.tokens :]
    own, _ = model.get_rope_index(
        new, vision.grid_thw[1:], None, torch.ones_like(new), False, lengths[1:], None
    )
    assert torch.equal(own + first.tokens + first.rope_delta, positions[:, :, first.tokens :])
    plain = plain_runner(thinker)
    full_state, full = await thinker.thread.call(plain.prefill, turns.prompt)
    assert full_state.rope_delta == int(delta.reshape(-1)[0])
    length = len(turns.prompt.input_ids)
    np.testing.assert_allclose(turns.second.hidden[:length], full.states, atol=PADDED)
    for _ in range(REPLY - 1):
        await thinker.thread.call(plain.step, full_state)
    assert turns.second.token_ids[length:] + turns.second.tail[:1] == full_state.generated
    assert turns.second.rope_delta == full_state.rope_delta


async def typed_turn(engine: ThinkerEngine) -> tuple[str, SessionEntry]:
    reply, _ = await answer(engine, turn("r1", "s", ("u1",), text="hello"))
    return reply, entry(engine, "s")


@pytest.mark.parametrize("change", ["truncated", "deleted", "edited", "instructions"])
async def test_a_conversation_that_changed_falls_back_to_a_full_prefill(
    thinker: ThinkerEngine, change: str
) -> None:
    """A reply cut short (barge-in), a deleted item, an edited one or new instructions: the
    entry does not match, the turn is prefilled from its history, and its entry replaces it."""
    said = "earlier"
    await answer(thinker, turn("r0", "s", ("u0",), text=said))
    before = (HistoryItem("user", said, "u0"), HistoryItem("assistant", "whatever", "a0"))
    items: tuple[str, ...] = ("u0", "a0", "u1")
    reply, _ = await answer(thinker, turn("r1", "s", items, before, text="hello"))
    first = entry(thinker, "s")
    assert first.conversation.item_ids == items
    history: tuple[HistoryItem, ...] = (
        *before,
        HistoryItem("user", "hello", "u1"),
        HistoryItem("assistant", reply, "a1"),
    )
    instructions = ""
    match change:
        case "truncated":
            history = (*history[:-1], HistoryItem("assistant", reply[:9], "a1"))
        case "deleted":
            history, items = history[1:], items[1:]
        case "edited":
            history = (HistoryItem("user", "changed", "u0"), *history[1:])
        case "instructions":
            instructions = "Answer in French."
    request = turn("r2", "s", (*items, "a1", "u2"), history, text="more", instructions=instructions)
    await answer(thinker, request)
    second = entry(thinker, "s")
    assert second.conversation.item_ids == request.item_ids
    assert second.token_ids[: first.tokens] != first.token_ids
    assert prefilled(thinker) == second.tokens - (REPLY - 1)  # the whole prompt


async def test_a_matching_turn_goes_on_and_new_items_come_before_it(
    thinker: ThinkerEngine,
) -> None:
    """Items added since the last turn (a system message here) are fed before the turn."""
    reply, first = await typed_turn(thinker)
    history = (
        HistoryItem("user", "hello", "u1"),
        HistoryItem("assistant", reply, "a1"),
        HistoryItem("system", "Be brief.", "n1"),
    )
    await answer(thinker, turn("r2", "s", ("u1", "a1", "n1", "u2"), history, text="more"))
    second = entry(thinker, "s")
    assert second.token_ids[: first.tokens] == first.token_ids
    added = second.token_ids[first.tokens + len(first.tail) :]
    assert added[:2] == [TOKENS["im_start"], TOKENS["system"]]
    assert prefilled(thinker) == second.tokens - (REPLY - 1) - first.tokens


async def test_an_aborted_turn_leaves_no_entry(thinker: ThinkerEngine) -> None:
    reply, _ = await typed_turn(thinker)
    history = (HistoryItem("user", "hello", "u1"), HistoryItem("assistant", reply, "a1"))
    request = turn("r2", "s", ("u1", "a1", "u2"), history, text="more")
    stream = thinker.generate("r2", request)
    async for chunk in stream:
        if isinstance(chunk, TextDelta):
            break
    await stream.aclose()
    assert thinker.sessions is not None and "s" not in thinker.sessions
    assert thinker.active_requests() == 0


async def test_a_session_over_its_budget_is_evicted_and_its_next_turn_prefills_in_full(
    thinker: ThinkerEngine,
) -> None:
    assert thinker.sessions is not None
    reply, first = await typed_turn(thinker)
    thinker.sessions.max_tokens = first.tokens + 30  # the next turn will not fit
    history: tuple[HistoryItem, ...] = (
        HistoryItem("user", "hello", "u1"),
        HistoryItem("assistant", reply, "a1"),
    )
    long = "tell me everything about it, at length, please"
    reply2, _ = await answer(thinker, turn("r2", "s", ("u1", "a1", "u2"), history, text=long))
    assert prefilled(thinker) < 60  # it went on from the first turn
    assert "s" not in thinker.sessions and thinker.sessions.tokens == 0
    assert thinker.sessions.evicted == 1

    history += (HistoryItem("user", long, "u2"), HistoryItem("assistant", reply2, "a2"))
    third = turn("r3", "s", ("u1", "a1", "u2", "a2", "u3"), history, text="and?")
    _, chunks = await answer(thinker, third)
    prompt = chunks[0]
    assert isinstance(prompt, HiddenStates)
    ids = thinker._fitted_prompt(third, None).prompt.input_ids  # noqa: SLF001
    assert prefilled(thinker) == len(ids)  # no entry: the whole prompt, from its history
    plain = plain_runner(thinker)
    state, full = await thinker.thread.call(plain.prefill, ThinkerPrompt(ids))
    talker_ids, talker_states = for_the_talker(ids, full.states)
    assert prompt.metadata["token_ids"] == talker_ids
    np.testing.assert_allclose(prompt.array, talker_states, atol=CLOSE)
    assert f"tok{state.next_token} " == next(c for c in chunks if isinstance(c, TextDelta)).text
    assert "s" not in thinker.sessions  # the third turn is over the budget too


def stored(tokens: int) -> SessionEntry:
    cache = DynamicCache()
    cache.update(torch.zeros(1, 1, tokens, 2), torch.zeros(1, 1, tokens, 2), 0)
    return SessionEntry(
        conversation=Conversation("", (), (), ""),
        token_ids=[7] * tokens,
        tail=[TOKENS["im_end"], TOKENS["newline"]],
        cache=cache,
        hidden=np.zeros((tokens, 2, 2), dtype=np.float32),
        rope_delta=0,
    )


def test_sessions_over_the_total_budget_go_least_recently_used_first() -> None:
    sessions = SessionKV(budget_tokens=100, max_tokens=70)
    assert sessions.store("a", stored(40)) and sessions.store("b", stored(40))
    taken = sessions.take("a")  # a's next turn: taken, then stored again, longer
    assert taken is not None and sessions.tokens == 40
    assert sessions.store("a", stored(65))  # over the budget: b, the least recent, goes
    assert "b" not in sessions and "a" in sessions and sessions.tokens == 65
    assert sessions.store("c", stored(30)) and sessions.tokens == 95
    assert sessions.store("b", stored(20))  # a is now the least recent: it goes
    assert "a" not in sessions and sessions.tokens == 50
    touched = sessions.take("c")  # c's next turn makes it the most recent
    assert touched is not None and sessions.store("c", touched)
    assert sessions.store("d", stored(60))  # b goes, not c
    assert "b" not in sessions and "c" in sessions and sessions.tokens == 90
    assert not sessions.store("e", stored(71))  # over one session's budget: none kept
    assert "e" not in sessions and sessions.tokens == 90
    assert sessions.evicted == 4
    assert sessions.forget("c") and not sessions.forget("c") and sessions.forget("d")
    assert len(sessions) == 0 and sessions.tokens == 0


async def test_forget_session_drops_the_entry_and_close_drops_them_all(
    thinker: ThinkerEngine,
) -> None:
    assert thinker.sessions is not None
    await typed_turn(thinker)
    await answer(thinker, turn("o1", "other", ("x1",), text="hi"))
    await thinker.forget_session("s")
    assert "s" not in thinker.sessions and "other" in thinker.sessions
    await EnginePipeline(thinker).forget_session("other")
    assert len(thinker.sessions) == 0 and thinker.sessions.tokens == 0
    await answer(thinker, turn("o2", "other", ("x1",), text="hi"))
    await thinker.close()
    assert len(thinker.sessions) == 0


GRAPH = """\
name: session_kv_test
stages:
  - name: thinker
    engine: qwen3_omni.thinker
    engine_args: {tiny: true, threads: 1, max_new_tokens: 4, min_new_tokens: 4,
                  session_kv_tokens: 4096}
    placement: {process: worker}
  - name: talker
    engine: qwen3_omni.talker
    engine_args: {tiny: true, threads: 1, max_frames: 6, min_frames: 6}
  - name: code2wav
    engine: qwen3_omni.code2wav
    engine_args: {tiny: true, first_chunk: 2, chunk: 4, left_context: 4, normalize_peak: 0.3}
edges:
  - {from: thinker, to: talker}
  - {from: talker, to: code2wav}
outputs: [thinker, code2wav]
"""


async def spoken(
    graph: StageGraph, rid: str, session: str, items: tuple[str, ...], *history: HistoryItem
) -> str:
    """A spoken turn through the whole graph: the reply's text (and it was spoken)."""
    request = PipelineRequest(
        request_id=rid,
        audio=turn_audio(0.5, seed=len(items)),
        history=history,
        session_id=session,
        item_ids=items,
    )
    out = [chunk async for chunk in graph.generate(request)]
    assert isinstance(out[-1], End)
    assert any(isinstance(chunk, AudioChunk) for chunk in out)
    return "".join(c.text for c in out if isinstance(c, TextDelta)).strip()


@pytest.mark.slow
async def test_a_session_ending_reaches_the_thinker_in_its_worker() -> None:
    """Through the graph, the Thinker in a worker process: a second spoken turn goes on from
    the first (the Talker speaks it), and after `forget_session` it is prefilled from its
    history, as a request of no session is."""
    config = parse_graph(GRAPH)
    graph = StageGraph(config, build_engines(config))
    await graph.start()
    try:
        assert isinstance(graph.engines["thinker"], WorkerEngine)
        reply = await spoken(graph, "k1", "kept", ("u1",))
        said = HistoryItem("assistant", reply, "a1")
        resumed = await spoken(graph, "k2", "kept", ("u1", "a1", "u2"), said)
        assert await spoken(graph, "f1", "forgotten", ("u1",)) == reply
        await graph.forget_session("forgotten")
        forgotten = await spoken(graph, "f2", "forgotten", ("u1", "a1", "u2"), said)
        no_session = await spoken(graph, "n2", "", ("u1", "a1", "u2"), said)
        assert forgotten == no_session != resumed  # resumed: the spoken question is still there
    finally:
        await graph.close()


def is_done(response_id: str, event: Event) -> bool:
    return isinstance(event, ResponseDone) and event.response_id == response_id


async def test_a_session_keeps_its_kv_between_turns_until_it_closes(
    redis: aioredis.Redis, thinker: ThinkerEngine
) -> None:
    """A real session in front of the Thinker: its requests carry the session and its items,
    a typed turn goes on from the spoken one before it, and closing the session forgets it."""
    assert thinker.sessions is not None
    async with (
        SessionManager(redis, EnginePipeline(thinker), max_sessions=2) as manager,
        ClockedSink() as sink,
    ):
        session = await manager.create(
            sink, {"turn_detection": None, "output_modalities": ["text"]}
        )
        kept: list[SessionEntry] = []
        for said in (None, "and then?"):
            if said is None:  # a spoken turn: no text, only in the KV kept for the next turn
                await session.append_audio(turn_audio(0.5).tobytes(), 16_000, 1)
                await session.commit_audio()
            else:
                await session.add_text(said)
            response_id = await session.create_response()
            done = await sink.wait_for(partial(is_done, response_id))
            assert isinstance(done, ResponseDone) and done.status == "completed"
            assert done.item is not None
            while session.responding:
                await asyncio.sleep(0.01)
            kept.append(entry(thinker, session.session_id))
            assert kept[-1].conversation.reply == done.item.text
        assert TOKENS["audio_start"] in kept[0].token_ids
        items = await session.history.items()
        assert kept[-1].conversation.item_ids == tuple(item.id for item in items[:3])
        user_item = 3 + len(b"and then?") + 2
        assert prefilled(thinker) == len(kept[0].tail) + user_item + 3  # + the reply's opening
        await manager.close_session(session.session_id)
        assert session.session_id not in thinker.sessions


@pytest.mark.parametrize(("last", "kept"), [(1234, True), (TOKENS["audio"], False)])
async def test_a_reply_ending_on_a_media_id_is_not_kept(
    thinker: ThinkerEngine, last: int, kept: bool
) -> None:
    """Random weights may choose any id; a last reply token that only media may carry
    cannot go into the next prompt, so such a turn leaves no entry."""
    assert thinker.runner is not None and thinker.sessions is not None
    request = turn("r1", "s", ("u1",), text="hello")
    prompt = (await thinker.thread.call(thinker._fitted_prompt, request, None)).prompt
    state, hidden = await thinker.thread.call(thinker.runner.prefill, prompt)
    state.generated[-1] = last
    thinker._remember(request, prompt, state, [hidden.states], "tok1", PromptMedia())
    assert ("s" in thinker.sessions) is kept
