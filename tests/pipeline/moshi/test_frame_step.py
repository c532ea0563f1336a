"""Moshi's frame step on the toy model: sessions stepped together are each stepped as if
alone, whenever they join, for longer than the cache's window; its text tokens and voice
codes are those of transformers' own Moshi (its `generate`, and its depth decoder)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pipeline.engines.moshi.frame_step import FrameStepper, RowsFull, Sampling
from pipeline.engines.moshi.weights import load_moshi

STEPS = 12
WINDOW = 8  # shorter than the run: the ring wraps


@pytest.fixture(scope="module")
def model() -> Any:
    return load_moshi(tiny=True, device="cpu", dtype=torch.float32)


def microphone(seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 32, (8,), generator=generator) for _ in range(STEPS)]


Said = list[tuple[int, list[int] | None]]


def run(model: Any, joins: dict[str, int], leaves: dict[str, int] | None = None) -> dict[str, Said]:
    """Each session from its join step (its own microphone from its first frame) to its
    leave step; what each was given back, frame by frame."""
    stepper = FrameStepper(model, rows=3, window=WINDOW, sampling=Sampling(greedy=True))
    heard = {s: microphone(ord(s)) for s in joins}  # each its own voice, however run
    said: dict[str, Said] = {s: [] for s in joins}
    for t in range(STEPS):
        for s, at in joins.items():
            if at == t:
                stepper.join(s)
            if leaves and leaves.get(s) == t:
                stepper.leave(s)
        live = {
            s: heard[s][t - at]
            for s, at in joins.items()
            if at <= t and not (leaves and leaves.get(s, STEPS) <= t)
        }
        for s, out in stepper.step(live).items():
            said[s].append((out.text, None if out.codes is None else out.codes.tolist()))
    return said


def test_sessions_stepped_together_are_each_stepped_as_if_alone(model: Any) -> None:
    together = run(model, {"a": 0, "b": 5})  # b joins mid-stream
    assert together["a"] == run(model, {"a": 0})["a"]
    assert together["b"] == run(model, {"b": 0})["b"][: STEPS - 5]
    assert together["a"][0][1] is None and together["a"][1][1] is not None  # whole frames
    assert all(len(codes) == 8 for _, codes in together["a"][1:] if codes is not None)


def test_a_row_left_is_taken_fresh_and_a_full_model_says_so(model: Any) -> None:
    said = run(model, {"a": 0, "c": 6}, leaves={"a": 4})  # c takes the row a left
    assert said["c"] == run(model, {"c": 0})["c"][: STEPS - 6]
    stepper = FrameStepper(model, rows=2, sampling=Sampling(greedy=True))
    stepper.join("x")
    stepper.join("y")
    stepper.join("y")  # already in: no second row
    with pytest.raises(RowsFull):
        stepper.join("z")
    stepper.leave("x")
    stepper.leave("x")
    stepper.join("z")
    assert stepper.sessions == 2


def test_a_session_moved_into_a_row_left_in_the_middle_goes_on_as_if_alone(model: Any) -> None:
    """Sessions keep the lowest rows: when b leaves, c (in the last row) moves into b's row,
    its cache with it, and what it hears and says is as if it had been alone."""
    said = run(model, {"a": 0, "b": 1, "c": 2}, leaves={"b": 5})
    assert said["c"] == run(model, {"c": 0})["c"][: STEPS - 2]
    assert said["a"] == run(model, {"a": 0})["a"]


def test_sampling_gives_codes_in_the_vocabulary(model: Any) -> None:
    stepper = FrameStepper(model, rows=2, sampling=Sampling())
    stepper.join("a")
    frames = [stepper.step({"a": code})["a"] for code in microphone(3)[:3]]
    codes = frames[-1].codes
    assert codes is not None and int(codes.min()) >= 0 and int(codes.max()) < 32
    assert all(0 <= f.text < 64 for f in frames)


def test_the_frame_benchmark_reports_each_batch_and_the_sessions_held() -> None:
    from loadtest.moshi_steps import main

    report = main(
        ["--pipeline", "moshi_tiny", "--batches", "1,2,3", "--steps", "2", "--warm", "1"]
        + ["--set", "moshi.rows=2"]
    )
    graph = report["graph"]
    assert graph["file"] == "pipeline/configs/moshi_tiny.yaml" and report["rows"] == 2
    assert graph["overrides"] == ["moshi.rows=2 (file: 4) (--set moshi.rows=2)"]
    assert report["levels"].pop("3") == {"skipped": "the graph holds 2 sessions"}
    assert set(report["levels"]) == {"1", "2"}
    for level in report["levels"].values():
        assert level["frame_ms"]["p50"] >= level["step_ms"]["p50"] > 0
    assert report["most_sessions_in_real_time"] in (0, 1, 2)


def test_the_depth_codes_are_those_of_transformers_own_depth_decoder(model: Any) -> None:
    """The step runs the depth transformer's modules itself (its `forward` reads positions
    back to the host, which no captured graph may do): the same codes as that `forward`."""
    from transformers import DynamicCache

    stepper = FrameStepper(model, rows=3, sampling=Sampling(greedy=True))
    generator = torch.Generator().manual_seed(5)
    hidden = torch.randn(3, 1, model.config.hidden_size, generator=generator)
    text = torch.tensor([1, 7, 30])
    ours = stepper._depth(3, hidden, text)
    cache, token, theirs = DynamicCache(), text[:, None], []
    with torch.inference_mode():
        for _ in range(8):
            out = model.depth_decoder(
                input_ids=token, last_hidden_state=hidden, past_key_values=cache, use_cache=True
            )
            token = out.logits[:, -1].argmax(-1)[:, None]
            theirs.append(token[:, 0])
    assert ours.tolist() == torch.stack(theirs, dim=1).tolist()


def test_the_step_says_what_transformers_moshi_generates(model: Any) -> None:
    """Two sessions stepped together, greedy, against `MoshiForConditionalGeneration.generate`
    (greedy, its depth decoder greedy too) given the same start as a prompt: the text
    tokens and the voice's codes of every frame it generates are the step's.

    generate takes a prompt of P frames and then hears silence (Mimi's codes of a silent
    frame); the step is given the same microphone. Its prompt is the step's own first
    frames in Moshi's delayed layout (the text token and the voice's codes each step was
    given); the prompt also fixes the acoustic codes of the voice's frame P - 1 (the delay),
    so generate's own codes are compared from frame P on, its semantic code from P - 1."""
    config = model.config
    bos = int(config.audio_vocab_size)
    prompt, new = 3, 5
    with torch.inference_mode():
        silent = model.audio_encoder.encode(torch.zeros(1, 1, 1920), num_quantizers=8)[0]
    silence = silent[0, :, 0]
    generator = torch.Generator().manual_seed(11)
    heard = {  # the prompt's last frame silent too: generate hears silence's codes undelayed
        s: [torch.randint(0, 32, (8,), generator=generator) for _ in range(prompt - 1)]
        + [silence] * new
        for s in ("a", "b")
    }
    stepper = FrameStepper(model, rows=2, sampling=Sampling(greedy=True))
    texts: dict[str, list[int]] = {"a": [], "b": []}
    voices: dict[str, list[torch.Tensor]] = {"a": [], "b": []}
    for s in ("a", "b"):
        stepper.join(s)
    for t in range(prompt + new - 1):
        out = stepper.step({s: heard[s][t] for s in ("a", "b")})
        for s in ("a", "b"):
            texts[s].append(out[s].text)
            # the depth's raw codes, which the step feeds back (a FrameOut's whole frame
            # pairs them across steps and drops the first step's acoustic ones)
            voices[s].append(stepper._voice[stepper._sessions.row(s)].clone())
    moshi = torch.full((2, 8, prompt), bos)  # generate delays codebooks 1-7 by a frame itself
    for i, s in enumerate(("a", "b")):
        for j in range(prompt):
            moshi[i, 0, j] = bos if j == 0 else voices[s][j - 1][0]
            moshi[i, 1:, j] = voices[s][j][1:]
    text_ids = torch.tensor([[config.vocab_size, *texts[s][: prompt - 1]] for s in ("a", "b")])
    sequences = model.generate(
        input_ids=text_ids,
        user_audio_codes=torch.stack([torch.stack(heard[s][:prompt], 1) for s in ("a", "b")]),
        moshi_audio_codes=moshi,
        concat_unconditional_inputs=False,
        max_new_tokens=new,
        do_sample=False,
        depth_decoder_do_sample=False,
        return_audio_waveforms=False,
    )
    # what generate fed itself: the voice's codes in the delayed layout, a frame per position
    generated = model.generated_audio_codes
    for i, s in enumerate(("a", "b")):
        assert sequences[i, prompt:].tolist() == texts[s][prompt - 1 :]
        theirs = generated[i, :, prompt:].T  # positions P.. hold the voice of frames P-1..
        ours = torch.stack(voices[s][prompt - 1 : prompt - 1 + len(theirs)])
        assert len(theirs) == new - 1
        assert ours.tolist() == theirs.tolist()
