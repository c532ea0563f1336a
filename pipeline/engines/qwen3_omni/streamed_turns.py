"""A spoken turn prefilled while it arrives: at the turn's end only its last part is left.

A turn's audio comes over the seconds the user speaks, while the model has time to spare.
A streamed turn (`pipeline.types.StreamingInput`) uses them, on the Thinker's model thread:

- when it opens, the prompt's positions before the audio (the session's KV entry's unfed
  tail, the items added since, `<|im_start|>user\\n<|audio_start|>`; for a session with no
  entry the whole prompt so far: system item, history) are prefilled after the session's
  entry (`ThinkerRunner.extend`);
- each time an attention window of the audio tower (8 s of audio: `audio_tower.py`) is
  complete, its mel frames final (`AudioFeatures.final_frames`), its frames go through the
  tower and its positions are prefilled after those.

What is prefilled is staged: a cache and hidden states of the turn's own, which the
session's entry never sees (the prefill copies the entry's KV, `prefill_batch.py`), so a
turn dropped (cancelled, abandoned, interrupted, or replaced by the session's next) leaves
the session's KV exactly as it was. When the answer's request names the turn, the engine
builds its prompt as for any turn (`ThinkerEngine._fitted_prompt`) and `past_for` checks
the staged part against it: the same entry, the same ids, and the very mel frames the
prompt has now (a louder frame later re-clamps the quieter ones: then they differ). Only
then does the prefill go on from the staged part, computing the rest of the audio (its last
window), `<|audio_end|>` and the closing tokens; otherwise the turn is taken whole. The
answer is the same either way (tests/pipeline/qwen3_omni/test_streamed_turns.py).

Each outcome is counted (`counts`, exported as `parley_stage_streamed_turns`):
`prefilled` (the staged part was used), `missing` (the request names a turn this engine
does not have: never opened here, or lost with a restarted stage), `changed` (the turn's
request is not what was streamed: other items or instructions, camera frames, which are
taken whole for now, re-clamped frames) and `failed` (staging failed, or the turn outgrew
the context).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from ...tasks import TaskSet, cancel_all
from ...types import PipelineRequest, StreamingInput
from .audio_features import AudioFeatures, AudioInput, audio_token_count
from .audio_tower import window_frames
from .config import TOKENS
from .prompt_fit import Lead
from .session_kv import SessionEntry
from .staging_queue import StagingQueue
from .thinker_runner import Extension, ThinkerPast, ThinkerPrompt

log = logging.getLogger("parley.pipeline.qwen3_omni")
OUTCOMES = ("prefilled", "missing", "changed", "failed")


@dataclass(frozen=True, slots=True)
class Staged:
    """What a streamed turn prefilled: `ids` after its entry's tokens, in `past`, from the
    log-mel `features` of its first `past.audio_frames` frames."""

    lead: Lead
    ids: list[int]
    past: ThinkerPast
    features: torch.Tensor | None


@dataclass(eq=False)
class _Turn:
    context: PipelineRequest
    lead: Lead | None = None
    pcm: list[npt.NDArray[np.int16]] = field(default_factory=list)
    samples: int = 0
    past: ThinkerPast | None = None
    ids: list[int] = field(default_factory=list)
    features: torch.Tensor | None = None
    windows: int = 0
    led: bool = False
    """its lead is prefilled"""
    failed: bool = False
    task: asyncio.Task[None] | None = None

    @property
    def session_id(self) -> str:
        return self.context.session_id


class StreamedTurns:
    """The open streamed turns of one Thinker, at most one a session. `lead` says where a
    turn's request would go on from (None: it cannot be streamed); `max_positions` bounds
    what one turn stages."""

    def __init__(
        self,
        name: str,
        staging: StagingQueue,
        features: AudioFeatures,
        lead: Callable[[PipelineRequest], Lead | None],
        *,
        max_positions: int,
    ) -> None:
        self.name = name
        self.staging = staging
        self.features = features
        self.lead = lead
        self.max_positions = max_positions
        self.chunk_frames, self.window_frames = window_frames(staging.runner.model)
        self.counts: Counter[str] = Counter({outcome: 0 for outcome in OUTCOMES})
        self._turns: dict[str, _Turn] = {}
        self._tasks = TaskSet(f"{name}:streamed")

    def __len__(self) -> int:
        return len(self._turns)

    def staged_positions(self, turn_id: str) -> int:
        """Positions the turn has prefilled so far (0: none, or no such turn)."""
        turn = self._turns.get(turn_id)
        return len(turn.ids) if turn is not None else 0

    async def open(self, turn_id: str, context: PipelineRequest) -> None:
        await self.drop(turn_id)
        if context.session_id:
            await self.forget_session(context.session_id)  # one open turn a session
        turn = _Turn(context)  # its audio may come at once: its lead is found behind it
        self._turns[turn_id] = turn
        self._kick(turn_id, turn)

    async def feed(self, turn_id: str, pcm: npt.NDArray[np.int16]) -> None:
        turn = self._turns.get(turn_id)
        if turn is None or turn.failed or not len(pcm):
            return
        turn.pcm.append(np.array(pcm, dtype=np.int16))  # a copy: the caller's buffer may change
        turn.samples += len(pcm)
        self._kick(turn_id, turn)

    async def drop(self, turn_id: str) -> None:
        turn = self._turns.pop(turn_id, None)
        if turn is not None and turn.task is not None:
            await cancel_all([turn.task])

    async def forget_session(self, session_id: str) -> None:
        for turn_id in [
            t for t, turn in self._turns.items() if turn.context.session_id == session_id
        ]:
            await self.drop(turn_id)

    async def close(self) -> None:
        """Drop every turn and stop its staging queue. Idempotent."""
        self._turns.clear()
        await self._tasks.close()
        await self.staging.close()

    async def take(self, request: PipelineRequest) -> Staged | None:
        """The staged part of the turn `request` names, once its work in flight is done;
        the turn is no longer open. None (counted) where there is nothing to use."""
        turn = self._turns.pop(request.streamed_turn, None)
        if turn is None:
            self.counts["missing"] += 1
            return None
        if turn.task is not None and not turn.task.done():
            self.staging.hurry()  # what it waits for goes now
            await asyncio.wait({turn.task})
        if turn.failed or turn.lead is None or turn.past is None:
            self.counts["failed"] += 1
            return None
        return Staged(turn.lead, turn.ids, turn.past, turn.features)

    def past_for(
        self, staged: Staged, prompt: ThinkerPrompt, entry: SessionEntry | None
    ) -> ThinkerPast | None:
        """The staged part as the past of `prompt` (which goes on from `entry`: None, from
        its start), or None (counted) where it is not exactly the prompt's beginning."""
        if staged.lead.entry is not entry or prompt.vision is not None:
            self.counts["changed"] += 1
            return None
        before = entry.token_ids if entry is not None else []
        ids, count = prompt.input_ids, len(before)
        same = ids[:count] == before and ids[count : count + len(staged.ids)] == staged.ids
        frames = staged.past.audio_frames
        if same and frames:
            audio = prompt.audio
            same = (
                audio is not None
                and staged.features is not None
                and audio.features.shape[2] >= frames
                and torch.equal(audio.features[:, :, :frames], staged.features)
            )
        if not same or len(ids) <= count + len(staged.ids):
            self.counts["changed"] += 1
            return None
        self.counts["prefilled"] += 1
        return staged.past

    # --- staging, behind the turn's audio ------------------------------------------------

    def _kick(self, turn_id: str, turn: _Turn) -> None:
        """Stage what is ready, unless that is under way."""
        if turn.failed or (turn.task is not None and not turn.task.done()):
            return
        if turn.led and self._ready(turn) <= turn.windows:
            return
        turn.task = self._tasks.create_task(self._stage(turn), name=f"{self.name}:{turn_id}")

    def _ready(self, turn: _Turn) -> int:
        """Attention windows of the turn's audio whose frames are all final now."""
        return self.features.final_frames(turn.samples) // self.window_frames

    async def _stage(self, turn: _Turn) -> None:
        try:
            if not turn.led:
                turn.lead = await asyncio.to_thread(self.lead, turn.context)
                if turn.lead is None:  # an answer would not fit the context as it is
                    turn.failed, turn.pcm = True, []
                    return
                await self._extend(turn, list(turn.lead.ids), None, 0)
                turn.led = True
            while not turn.failed and (ready := self._ready(turn)) > turn.windows:
                pcm = np.concatenate(turn.pcm)
                audio = await asyncio.to_thread(self.features, pcm)
                assert audio is not None
                first, last = turn.windows * self.window_frames, ready * self.window_frames
                frames = audio.features[:, :, first:last].clone()
                tokens = audio_token_count(last - first)
                window = AudioInput(frames, torch.ones(1, last - first, dtype=torch.long), tokens)
                await self._extend(turn, [TOKENS["audio"]] * tokens, window, ready)
        except Exception:
            log.exception("%s: staging a streamed turn failed; it is taken whole", self.name)
            turn.failed = True

    async def _extend(
        self, turn: _Turn, ids: list[int], audio: AudioInput | None, windows: int
    ) -> None:
        assert turn.lead is not None
        entry = turn.lead.entry
        base = entry.tokens if entry is not None else 0
        if base + len(turn.ids) + len(ids) > self.max_positions:
            turn.failed, turn.pcm = True, []  # longer than it may be: taken whole
            return
        past = turn.past
        if past is None and entry is not None:
            past = ThinkerPast(entry.cache, entry.tokens, entry.rope_delta, entry.hidden)
        turn.past = await self.staging.extend(Extension(past, ids, audio))
        turn.ids = turn.ids + ids
        if audio is not None:
            parts = [turn.features] if turn.features is not None else []
            turn.features = torch.cat([*parts, audio.features], dim=2)
            turn.windows = windows


class TurnsStreamedIn(StreamingInput):
    """`StreamingInput` for an engine that keeps its open turns in `streamed` (None until
    it has started: then a turn is not streamed, and its request is taken whole)."""

    streamed: StreamedTurns | None = None
    stream_turns: bool = True
    """False: every turn is taken whole (the engine's `stream_turns` argument)."""

    async def open_turn(self, turn_id: str, context: PipelineRequest) -> None:
        if self.streamed is not None:
            await self.streamed.open(turn_id, context)

    async def feed_turn(self, turn_id: str, pcm: npt.NDArray[np.int16]) -> None:
        if self.streamed is not None:
            await self.streamed.feed(turn_id, pcm)

    async def drop_turn(self, turn_id: str) -> None:
        if self.streamed is not None:
            await self.streamed.drop(turn_id)

    def streamed_turns(self) -> dict[str, int]:
        return dict(self.streamed.counts) if self.streamed is not None else {}

    def takes_streamed_turns(self) -> bool:
        """False when the engine was asked to take every turn whole (`stream_turns: false`),
        so sessions never open turns on it; before its start it takes none either way."""
        return self.stream_turns
