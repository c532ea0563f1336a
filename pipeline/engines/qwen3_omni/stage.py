"""What the three Qwen3-Omni engines share: model settings, the model thread, request state.

The engines are thin adapters from the engine contract (`pipeline/types.py`: the Thinker is
an EntryEngine, the Talker and Code2Wav StreamEngines) to the plain runners. This base holds
what every one of them repeats: building its part of the model on its thread at start, the
table of requests in flight (`active_requests`, `abort`), and an idempotent close.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import torch
from transformers import Qwen3OmniMoeConfig

from ...capacity import Capacity, RowLoad
from ...memory_plan import MemoryPlan, TokenCache, rows_setting
from ...requests import RequestTracker
from ...row_gate import RowGate, RowsBusy
from ...types import Engine, ErrorChunk
from ..gpu_memory import MemoryQuery, SizingSettings
from .memory import neighbours_setting, plan_stage
from .model_thread import ModelThread
from .row_lengths import SHORTEST
from .step_batcher import StepBatcher
from .weights import Part, build_part

StateT = TypeVar("StateT")

log = logging.getLogger("parley.pipeline.qwen3_omni")

MODEL_PATH_ENV = "PARLEY_MODEL_PATH"
"""A checkpoint directory for stages whose graph names none (`parley serve --model-path`)."""

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


STREAM_PRIORITIES = ("normal", "high")
HIGHEST_PRIORITY = -100
"""Lower is more urgent; torch clamps it to the device's most urgent level."""


def use_own_stream(device: str, priority: str = "normal") -> None:
    """On a stage's model thread: all its GPU work goes to a CUDA stream of its own.

    Stages that share a process (a `subgraph`) then overlap on the GPU: a Thinker step and a
    Talker step are in flight at once, where stages in separate processes time-slice the
    device. The stream is the thread's current one (torch keeps one per thread), so every
    kernel, copy and graph replay the stage issues goes there; a copy to the host waits for
    this stream alone. Nothing else uses it, so no other stage's tensors cross it.

    `priority` "high": the GPU schedules this stream's waiting kernels before those of
    normal streams. The stages that make the audio (Talker, Code2Wav) run ahead of the Thinker
    so: their steps are what a listener waits for, and the Thinker, whose text is seconds ahead
    of the speech, loses little by waiting a kernel."""
    if torch.device(device).type == "cuda":
        # torch maps a priority past the device's range to its nearest end: the highest
        level = HIGHEST_PRIORITY if priority == "high" else 0
        stream = torch.cuda.Stream(device, priority=level)  # type: ignore[no-untyped-call]
        torch.cuda.set_stream(stream)


class ModelStage(Engine, Generic[StateT]):
    name = "qwen3_omni"
    part: Part

    def __init__(
        self,
        *,
        model_path: str | None = None,
        tiny: bool = False,
        seed: int = 0,
        device: str = "cpu",
        dtype: str = "float32",
        threads: int | None = None,
        max_batch: int = 8,
        decode_rows: int | str = 0,
        max_context: int = 4096,
        capture_graphs: bool | None = None,
        stream_priority: str = "normal",
        plain_fallback: bool = False,
        waiting: int | None = None,
        row_wait_s: float = 10.0,
        shortest_attention: int = SHORTEST,
        max_rows: int = 32,
        gpu_memory_utilization: float = 0.9,
        kv_share: float = 1.0,
        shares_gpu_with: Sequence[str] = (),
        memory_query: MemoryQuery | None = None,
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}")
        self.model_path = model_path or os.environ.get(MODEL_PATH_ENV) or None
        """A checkpoint (Hugging Face layout) to load; it overrides `tiny`. None: random."""
        self.tiny = tiny
        self.seed = seed
        self.device = device
        self.dtype = DTYPES[dtype]
        self.thread = ModelThread(f"parley-{self.name}", threads)
        self.max_batch = max_batch
        """Decode steps of this many requests run as one batch at most."""
        if max_context < 1:
            raise ValueError("max_context must be at least 1")
        # --- sizing to the card (gpu_memory.py, memory.py) ---
        self.rows_asked = rows_setting(decode_rows, "decode_rows")
        """The file's `decode_rows`: an integer (a demand, refused at start if it does not
        fit the card) or `auto` (as many as fit, up to `max_rows`)."""
        self.sizing = SizingSettings.of(
            max_rows=max_rows,
            gpu_memory_utilization=gpu_memory_utilization,
            kv_share=kv_share,
            memory_query=memory_query,
        )
        self.shares_gpu_with = neighbours_setting(shares_gpu_with)
        """The parts of the other stages on this stage's GPU (their weights are counted)."""
        self.memory_plan: MemoryPlan | None = None
        """What sizing decided at start (None: not sized, on the CPU)."""
        self._held_before = 0
        """What this process's allocator held before the weights (stages sharing a process)."""
        asked = self.rows_asked
        self.decode_rows = asked if isinstance(asked, int) else self.sizing.max_rows
        """The rows this engine has: requests whose decode runs on a static cache row, batched
        in place and captured as CUDA graphs on a GPU (slot_cache.py); 0: every step the
        plain transformers way. With `auto`, `max_rows` until start sizes it on a GPU."""
        self.max_context = max_context
        """Positions one cache row holds (prompt plus reply); a longer request fails with
        `context_length_exceeded` (with `plain_fallback`: it goes the plain way)."""
        self.plain_fallback = plain_fallback
        """A request that finds no free row (or is longer than a row) is stepped the plain
        transformers way inside the batched step, holding up every other request's step
        (the old behaviour, only where a graph file asks for it). False: a request takes a
        row before it runs, waiting for one (`waiting`, `row_wait_s`) or failing with
        `server_busy` (`row_gate.py`)."""
        if waiting is not None and waiting < 0:
            raise ValueError("waiting must be at least 0")
        if row_wait_s < 0:
            raise ValueError("row_wait_s must be at least 0")
        self.waiting = waiting
        """Requests that may wait for a row at once (None: as many as there are rows)."""
        self.row_wait_s = row_wait_s
        """How long a request waits for a row before it fails with `server_busy`."""
        self.rows: RowGate | None = None
        """The gate in front of the cache rows (None: no rows, or `plain_fallback`)."""
        self.capture_graphs = capture_graphs
        if shortest_attention < 1:
            raise ValueError("shortest_attention must be at least 1")
        self.shortest_attention = shortest_attention
        """A decode step on cache rows attends over the smallest length bucket (this many
        positions, doubling up to max_context) that holds its longest row (row_lengths.py);
        max_context: whole rows, one captured graph per batch size."""
        if stream_priority not in STREAM_PRIORITIES:
            raise ValueError(f"stream_priority must be one of {', '.join(STREAM_PRIORITIES)}")
        self.stream_priority = stream_priority
        """On a GPU: "high" puts the stage's kernels ahead of normal streams' (use_own_stream)."""
        """Capture decode steps as CUDA graphs (None: on a CUDA device)."""
        self.batcher: StepBatcher[Any, Any] | None = None
        self.model: Any = None
        self.config: Qwen3OmniMoeConfig | None = None
        self._requests: RequestTracker[StateT] = RequestTracker()

    async def start(self) -> None:
        if self.model is not None:
            return
        self.thread.start()
        await self.thread.call(use_own_stream, self.device, self.stream_priority)
        held = await self.thread.call(self.sizing.figures, self.device)  # sizing: before weights
        self._held_before = held.allocated if held is not None else 0
        self.model, self.config = await self.thread.call(
            build_part,
            self.part,
            model_path=self.model_path,
            tiny=self.tiny,
            seed=self.seed,
            dtype=self.dtype,
            device=self.device,
        )
        await self.thread.call(self._loaded)
        if torch.device(self.device).type == "cuda":
            # sizing: the warm-up's cached blocks go back, so that the next stage on this GPU
            # measures its free memory without them (each stage's headroom covers its peak)
            await self.thread.call(torch.cuda.empty_cache)
        if self.decode_rows and not self.plain_fallback:
            self.rows = RowGate(
                self.name, self.decode_rows, waiting=self.waiting, wait_s=self.row_wait_s
            )
        self.batcher = self._batcher()
        if self.batcher is not None:
            self.batcher.start()
        if (capacity := self.capacity()) is not None:
            log.info("%s", capacity.line())
        elif self.decode_rows:
            log.warning(
                "%s: %d cache rows of %d positions, and plain steps past them (plain_fallback): "
                "admission is not held to the rows",
                self.name,
                self.decode_rows,
                self.max_context,
            )

    def _row_memory(self) -> int:
        """Device memory of the stage's cache rows (0: none)."""
        return 0

    async def _take_row(self, request_id: str) -> ErrorChunk | bool | None:
        """Before a request runs: its row (None: it holds one, or there is no gate), an
        ErrorChunk (`server_busy`) when none came in time, or False when it was aborted
        while it waited. The request gives the row back with `rows.give_back` however it
        ends."""
        if self.rows is None:
            return None
        try:
            return None if await self.rows.take(request_id) else False
        except RowsBusy as exc:
            return ErrorChunk(str(exc), self.name, code="server_busy")

    def _context_refusal(self, length: int) -> ErrorChunk | None:
        """A `context_length_exceeded` chunk when a request of `length` positions (its prompt
        and its reply's budget) cannot fit a row, else None (only behind a row gate: with
        `plain_fallback` such a request is stepped the plain way)."""
        if self.rows is None or length <= self.max_context:
            return None
        return ErrorChunk(
            f"the conversation needs {length:,} positions with its reply's budget, more "
            f"than the {self.max_context:,} of {self.name}'s context",
            self.name,
            code="context_length_exceeded",
        )

    def capacity(self) -> Capacity | None:
        """Its cache rows, one per request in flight, and the turns that may wait for one;
        None without a row gate (no rows, or `plain_fallback`: admission is not held to
        the rows then)."""
        gate = self.rows
        if gate is None:
            return None
        return Capacity(
            stage=self.name,
            rows=gate.rows,
            context=self.max_context,
            holds="turn",
            waiting=gate.waiting,
            wait_s=gate.wait_s,
            memory_bytes=self._row_memory(),
        )

    def row_load(self) -> RowLoad | None:
        return self.rows.load() if self.rows is not None else None

    def _loaded(self) -> None:
        """On the model thread, once the model is built: make the runner."""

    def _size(self, text_config: Any, caches: tuple[TokenCache, ...] = ()) -> dict[str, int]:
        """On the model thread, once the weights are loaded: on a GPU (or with a memory
        query) set `decode_rows` from the card (MemoryRefused if the file asks for more than
        fits); return the token caches' budgets."""
        figures = self.sizing.figures(self.device)
        if figures is None:  # the CPU: the file's figures (auto: max_rows)
            return {c.name: c.budget(self.decode_rows) for c in caches}
        weights = figures.allocated - self._held_before
        self.memory_plan = plan_stage(
            part=self.part,
            device=self.device,
            figures=dataclasses.replace(figures, allocated=weights),
            settings=self.sizing,
            text_config=text_config,
            dtype=self.dtype,
            rows=self.rows_asked,
            context=self.max_context,
            neighbours=self.shares_gpu_with,
            model_path=self.model_path,
            tiny=self.tiny,
            caches=caches,
        )
        self.decode_rows = self.memory_plan.rows
        return self.memory_plan.cache_tokens

    def _batcher(self) -> StepBatcher[Any, Any] | None:
        """The stage's step batcher, if its steps batch across requests."""
        return None

    async def close(self) -> None:
        if self.rows is not None:
            self.rows.close()
        self._requests.clear()
        if self.batcher is not None:
            await self.batcher.close()
            self.batcher = None
        await self.thread.close()
        self.model = None

    def active_requests(self) -> int:
        return len(self._requests)

    def stalled(self, bound_s: float) -> str | None:
        if (broken := self.broken()) is not None:
            return f"broken: {broken}"
        return self.thread.watch.stalled(bound_s)

    def broken(self) -> str | None:
        return self.thread.fatal

    async def abort(self, request_id: str) -> None:
        self._requests.abort(request_id)
        if self.rows is not None:
            self.rows.abandon(request_id)  # a request waiting for a row leaves the queue
