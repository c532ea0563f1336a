"""The `qwen3_omni.talker` engine: the Thinker's hidden states in, codec frames out.

The Talker starts as soon as the Thinker's first reply token has been fed, and from then on
makes one frame (one CodecCodes of shape [1, 16]) per step. A reader task drains the Thinker's
stream into the request's state the moment chunks arrive, so a Talker slower than the
Thinker never holds back the Thinker's text (the reply is bounded by the Thinker's
`max_new_tokens`); when the Talker is ahead, it waits for the text its next step needs.

Frame steps batch across requests (`StepBatcher`); when more wait than a batch takes, the
requests nearest to running out of audio go first (`Playback`: each frame is 80 ms of it).

Random weights never choose codec EOS: `min_frames` holds it off and `max_frames` ends
the reply, which gives fixed speech lengths. With `frames_per_token` (random weights only:
a real model's speech ends with its codec EOS) the speech ends once the Thinker's text has
ended and this many frames have been made per reply token, so a shorter reply (a response's
`max_output_tokens`) is spoken shorter, as a real model's would be: what lets a benchmark
vary answer lengths.

With `decode_rows`, a request takes a cache row once its first text has come, before its
prefill and first frame step, waiting for one or failing `server_busy` (`row_gate.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from ...engine_limits import qwen3_omni_talker
from ...tasks import TaskSet
from ...turn_phases import log_phases, since_ms
from ...types import (
    Chunk,
    CodecCodes,
    End,
    ErrorChunk,
    HiddenStates,
    PipelineRequest,
    StageInput,
    StreamEngine,
)
from .config import TOKENS
from .frame_predictor import FramePredictor
from .fused_moe import install_fused_moe
from .gathered_calls import GatheredCalls
from .playback import Clock, Playback
from .slot_decoder import SlotDecoder
from .stage import ModelStage
from .step_batcher import StepBatcher
from .talker_runner import PREDICTOR_SAMPLING, TalkerPrompt, TalkerRunner, TalkerState

Codes = npt.NDArray[np.int32]
FrameStep = tuple[TalkerState, Codes | None]
"""One request's share of a batched frame step: its state and the frame to feed first."""

FRAME_S = 0.08
"""The speech in one codec frame (12.5 frames a second)."""


class UpstreamError(Exception):
    """The Thinker's stream carried an error: end this request with it."""

    def __init__(self, chunk: ErrorChunk) -> None:
        super().__init__(chunk.message)
        self.chunk = chunk


class TalkerEngine(ModelStage[TalkerState], StreamEngine):
    name = "qwen3_omni.talker"
    part = "talker"

    def __init__(
        self,
        *,
        max_frames: int = 375,
        min_frames: int = 0,
        frames_per_token: float = 0.0,
        speaker: str = "ethan",
        clock: Clock = time.monotonic,
        prefill_batch: int = 0,
        warm_up: bool | None = None,
        compile_predictor: bool = False,
        **model: Any,
    ) -> None:
        super().__init__(**model)
        self.compile_predictor = compile_predictor
        """Compile the code predictor's layers (torch.compile) before its frames are captured:
        a Talker frame takes about half the time, the stage about a minute longer to start
        (compiled_steps.py)."""
        self.warm_up = torch.device(self.device).type == "cuda" if warm_up is None else warm_up
        """Prefill and step a made-up turn before the stage is ready (None: on a GPU)."""
        self.warmed_rows: list[int] = []
        """The batch sizes the warm-up prefilled (empty: none ran)."""
        if prefill_batch < 0:
            raise ValueError("prefill_batch must be at least 0")
        self.prefill_batch = prefill_batch or self.max_batch
        """Prefills asked for while the model thread is busy run as one batch of at most this
        many (0: `max_batch`)."""
        if max_frames < 1:
            raise ValueError("max_frames must be at least 1")
        self.max_frames = max_frames
        self.min_frames = min_frames
        if frames_per_token < 0:
            raise ValueError("frames_per_token must be at least 0")
        self.frames_per_token = frames_per_token
        qwen3_omni_talker(
            {"max_frames": max_frames, "min_frames": min_frames, "max_context": self.max_context}
        )
        self.speaker = speaker
        self.clock = clock
        """The playback clock that frame steps are scheduled by (tests pass their own)."""
        self.runner: TalkerRunner | None = None
        self.prefills: GatheredCalls[TalkerState] | None = None
        """The prefills asked for while the model thread is busy run as one batch."""
        self._wakes: dict[str, asyncio.Event] = {}
        """per request: set when text arrives, the text ends, or the request is aborted"""

    async def start(self) -> None:
        if self.model is not None:
            return
        await super().start()
        assert self.runner is not None
        self.prefills = GatheredCalls(
            f"{self.name}:prefill",
            self.thread,
            self.runner.prefill_batch,
            max_batch=self.prefill_batch,
        )
        self.prefills.start()

    async def close(self) -> None:
        if self.prefills is not None:
            await self.prefills.close()
            self.prefills = None
        await super().close()

    def _batcher(self) -> StepBatcher[FrameStep, Codes | None]:
        runner = self.runner
        assert runner is not None

        def frames(steps: list[FrameStep]) -> list[Codes | None]:
            """Feed each request's previous frame (or, before its first, its prompt's last
            position where that waited for the reply's first token), then predict its next."""
            fed = [
                (state, codes)
                for state, codes in steps
                if codes is not None or state.prompt_end is not None
            ]
            if fed:
                runner.advance_batch([state for state, _ in fed], [codes for _, codes in fed])
            return runner.predict_batch([state for state, _ in steps])

        return StepBatcher(
            self.name, self.thread, frames, max_batch=self.max_batch, clock=self.clock
        )

    def _loaded(self) -> None:
        assert self.model is not None and self.config is not None
        decoder = predictor = None
        if self.decode_rows:
            install_fused_moe(self.model)
        self._size(self.config.talker_config.text_config)  # sizing: rows from the card (stage.py)
        if self.decode_rows:
            capture = self.capture_graphs
            decoder = SlotDecoder(
                self.model.model,
                rows=self.decode_rows,
                max_length=self.max_context,
                capture=capture,
                shortest=self.shortest_attention,
                name="talker",
            )
            predictor = FramePredictor(
                self.model,
                rows=self.max_batch,
                sampling=PREDICTOR_SAMPLING,
                capture=capture,
                compile=self.compile_predictor,
            )
            decoder.graphs.warm()
            predictor.graphs.warm()
        self.runner = TalkerRunner(
            self.model,
            self.config,
            speaker=self.speaker,
            seed=self.seed,
            min_frames=self.min_frames,
            decoder=decoder,
            predictor=predictor,
            reserve=self.max_frames + 1,
            plain_fallback=self.plain_fallback,
        )
        if self.warm_up:
            self._warm()

    def _row_memory(self) -> int:
        decoder = self.runner.decoder if self.runner is not None else None
        return decoder.cache.nbytes if decoder is not None else 0

    def _warm(self) -> None:
        """On the model thread, before the stage is ready: a made-up turn (a camera frame and
        a few words) prefilled alone and as a full batch, then a frame step for the batch, so
        that no request pays for first use. Its cache rows are given back."""
        runner, config = self.runner, self.config
        assert runner is not None and config is not None
        merge = int(config.thinker_config.vision_config.spatial_merge_size)
        grid = (1, 4 * merge, 4 * merge)
        ids = [TOKENS["im_start"], TOKENS["user"], TOKENS["newline"], TOKENS["vision_start"]]
        ids += [TOKENS["image"]] * (grid[1] * grid[2] // merge**2)
        ids += [TOKENS["vision_end"], *range(1000, 1012), TOKENS["im_end"], TOKENS["newline"]]
        ids += [TOKENS["im_start"], TOKENS["assistant"], TOKENS["newline"]]
        size = int(config.thinker_config.text_config.hidden_size)
        rng = np.random.default_rng(0)
        prompt = TalkerPrompt(
            token_ids=ids,
            states=rng.normal(0, 0.02, (len(ids), 2, size)).astype(np.float32),
            tts_embeds=rng.normal(0, 0.02, (3, size)).astype(np.float32),
            image_grid_thw=(grid,),
        )
        for rows in sorted({1, self.prefill_batch}):
            states = [runner.open(prompt) for _ in range(rows)]
            for state in states:
                runner.add_reply(state, rng.normal(0, 0.02, (2, 2, size)).astype(np.float32))
                runner.end_text(state)
            runner.prefill_batch(states)
            stepped = states[: min(self.max_batch, self.decode_rows or self.max_batch)]
            codes = runner.predict_batch(stepped)
            fed = [(s, c) for s, c in zip(stepped, codes, strict=True) if c is not None]
            if fed:
                runner.advance_batch([s for s, _ in fed], [c for _, c in fed])
            for state in states:
                runner.release(state)
        self.warmed_rows = sorted({1, self.prefill_batch})

    async def generate(self, request_id: str, inputs: StageInput, /) -> AsyncGenerator[Chunk, None]:
        runner = self.runner
        if runner is None:
            yield ErrorChunk(message="the talker was not started", stage=self.name)
            return
        if inputs.request.output_text_only:
            yield End()
            return
        self._requests.begin(request_id)
        began = time.perf_counter()
        playback = Playback(self.clock)  # from the request's arrival here
        chunks = aiter(inputs.chunks)
        # a TaskSet and not a TaskGroup: its scope spans the generator's yields
        tasks = TaskSet(f"{request_id}:talker")
        state: TalkerState | None = None
        gate = self.rows
        try:
            prompt = await _first_prompt(chunks)
            if prompt is None:
                yield End()  # the Thinker ended before its prompt: nothing to say
                return
            if self._requests.aborted(request_id):
                return  # aborted
            marks = {"prompt": time.perf_counter()}
            state = runner.open(prompt, inputs.request.voice)
            self._requests.set_state(request_id, state)
            wake = self._wakes[request_id] = asyncio.Event()
            reader = tasks.create_task(  # its error ends the request (`_until` raises it)
                self._drain(runner, state, chunks, wake),
                name=f"{request_id}:talker-reader",
                log_failure=False,
            )

            def can_start() -> bool:
                return (
                    runner.can_start(state) or state.text_done or self._requests.aborted(request_id)
                )

            def can_advance() -> bool:
                return runner.text_ready(state) or self._requests.aborted(request_id)

            # the prompt is prefilled while the Thinker chooses its first reply token: only
            # the prompt's last position, which needs that token, is left for the first frame
            if (refused := await self._take_row(request_id)) is not None:
                if isinstance(refused, ErrorChunk):
                    yield refused
                return  # a chunk saying why, or aborted while it waited
            marks["row"] = time.perf_counter()
            assert self.prefills is not None
            await self.prefills.call(state)
            marks["prefill"] = time.perf_counter()
            await _until(can_start, wake, reader)
            marks["first_reply"] = time.perf_counter()
            if self._requests.aborted(request_id):
                return  # aborted
            if not state.received:
                yield End()
                return
            length = state.length + (state.prompt_end is not None) + runner.reserve
            if (too_long := self._context_refusal(length)) is not None:
                yield too_long
                return
            assert self.batcher is not None
            previous: Codes | None = None
            with self.batcher.member():
                for frame in range(self.max_frames):
                    if previous is not None and not can_advance():
                        with self.batcher.away():  # the batch need not wait for us
                            await _until(can_advance, wake, reader)
                    if self._requests.aborted(request_id):
                        return  # aborted
                    if self._spoken(state, frame):
                        break
                    step = (state, previous)
                    codes = await self.batcher.step(step, deadline=playback.deadline())
                    if codes is None:
                        break  # codec EOS
                    playback.produced(FRAME_S)
                    if frame == 0:
                        _log_first_frame(inputs.request, began, marks, state.length)
                    yield CodecCodes(codes=codes[np.newaxis, :], metadata={"frame": frame})
                    previous = codes
            yield End()
        except UpstreamError as exc:
            yield exc.chunk
        finally:
            await tasks.close()  # the reader's error, if any, already ended the request
            self._requests.end(request_id)
            if state is not None:  # finished, aborted or cancelled: its cache row goes back
                self.thread.post(runner.release, state)
            if gate is not None:  # after the release, which the model thread runs first
                gate.give_back(request_id)
            self._wakes.pop(request_id, None)

    def _spoken(self, state: TalkerState, frames: int) -> bool:
        """With `frames_per_token`: the text has ended and `frames` speak all of it."""
        per_token = self.frames_per_token
        return bool(per_token) and state.text_done and frames >= per_token * state.received

    async def abort(self, request_id: str) -> None:
        await super().abort(request_id)
        if (wake := self._wakes.pop(request_id, None)) is not None:
            wake.set()  # a request waiting for text sees it is aborted

    async def _drain(
        self,
        runner: TalkerRunner,
        state: TalkerState,
        chunks: AsyncIterator[Chunk],
        wake: asyncio.Event,
    ) -> None:
        try:
            async for chunk in chunks:
                if isinstance(chunk, ErrorChunk):
                    raise UpstreamError(chunk)
                if isinstance(chunk, End):
                    break
                if isinstance(chunk, HiddenStates) and chunk.metadata.get("part") == "reply":
                    runner.add_reply(state, chunk.array)  # host only: no model-thread call
                    wake.set()
        finally:
            runner.end_text(state)
            wake.set()


def _log_first_frame(
    request: PipelineRequest, began: float, marks: dict[str, float], positions: int
) -> None:
    """The turn's line (`turn_phases.py`): the Thinker's prompt in, a row, the prefill (of
    all but the last position where the reply's first token had not come), the first reply
    token in, the first frame (ms, each since the one before)."""
    now = time.perf_counter()
    figures: dict[str, float] = {}
    last = began
    for phase, at in [*marks.items(), ("first_frame", now)]:
        figures[phase] = since_ms(last, at)
        last = at
    figures["in_all"] = since_ms(began, now)
    figures["positions"] = positions
    log_phases("talker", request.session_id or request.request_id, figures)


async def _first_prompt(chunks: AsyncIterator[Chunk]) -> TalkerPrompt | None:
    async for chunk in chunks:
        if isinstance(chunk, ErrorChunk):
            raise UpstreamError(chunk)
        if isinstance(chunk, End):
            return None
        if isinstance(chunk, HiddenStates) and chunk.metadata.get("part") == "prompt":
            meta = chunk.metadata
            return TalkerPrompt(
                token_ids=list(meta["token_ids"]),
                # copies: a view onto a shared-memory ring holds the sender back while kept
                states=np.array(chunk.array),
                tts_embeds=np.array(meta["tts_embeds"]),
                audio_feature_lengths=tuple(int(n) for n in meta.get("audio_feature_lengths", ())),
                image_grid_thw=tuple(tuple(g) for g in meta.get("image_grid_thw", ())),
            )
    return None


async def _until(
    ready: Callable[[], bool], wake: asyncio.Event, reader: asyncio.Task[None]
) -> None:
    """Wait until `ready()`, re-checking whenever the reader adds text; its error is ours.

    The reader sets `wake` after every piece of text and when it ends, however it ends."""
    while True:
        if reader.done() and not reader.cancelled():
            reader.result()  # raises the reader's error, if any
        if ready():
            return
        wake.clear()
        await wake.wait()
