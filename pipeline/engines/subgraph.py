"""The `subgraph` engine: several stages run together as one, in whatever process holds it.

A graph file places each stage in the main process, a worker process or another host. Stages
that share one GPU gain from sharing one process too: each keeps its own model thread (and,
on a GPU, its own CUDA stream, `stage.py`), so a Thinker step and a Talker step run at the
same time instead of time-slicing the device between processes, and their hand-offs are
references in memory instead of copies through a shared-memory link. This engine holds such a
group: its `engine_args` are a graph of their own (`stages`, `edges`, `outputs`, every stage in
`process: main`), built and started here, and the group answers as one entry stage whose
output is the inner graph's (text, tool calls and audio). Placed `process: worker`, the whole
group lives in one worker process, which a crash or a hang takes down and restarts as one.

    - name: omni
      engine: subgraph
      engine_args:
        stages: [{name: thinker, engine: qwen3_omni.thinker}, ...]
        edges: [{from: thinker, to: talker}, ...]
        outputs: [thinker, code2wav]
      placement: {process: worker}

The inner stages' own metrics (time to first chunk, batch sizes) are kept where they run;
the outer graph sees the group as one stage.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import AsyncGenerator
from typing import Any

from ..capacity import Capacity, RowLoad, StageCapacity
from ..graph import StageGraph
from ..graph_config import GraphConfig, GraphConfigError, validate_graph
from ..requests import RequestTracker
from ..types import Chunk, End, EntryEngine, ErrorChunk, PipelineRequest
from .registry import create_engine


class SubgraphEngine(EntryEngine):
    name = "subgraph"

    def __init__(
        self,
        *,
        stages: list[dict[str, Any]],
        edges: list[dict[str, Any]] | None = None,
        outputs: list[str],
        name: str = "subgraph",
        switch_interval_ms: float | None = None,
    ) -> None:
        """`switch_interval_ms`: how long a thread of this process may keep the GIL while
        another waits for it (Python's default is 5 ms). The group's model threads and its
        event loop share one GIL; a step that must wait for a stage busy in Python for the
        whole interval waits that long. Set only where the group has its process to itself
        (placed in a worker): it is process-wide."""
        if switch_interval_ms is not None and not 0.05 <= switch_interval_ms <= 100:
            raise ValueError("switch_interval_ms must be between 0.05 and 100")
        self.switch_interval_ms = switch_interval_ms
        body = {"name": name, "stages": stages, "edges": edges or [], "outputs": outputs}
        self.config: GraphConfig = validate_graph(body, f"subgraph {name}")
        away = [s.name for s in self.config.stages if s.placement.process != "main"]
        if away:
            raise GraphConfigError(
                f"subgraph {name}",
                None,
                "stages",
                f"{', '.join(away)}: a subgraph's stages run where the subgraph runs "
                "(placement process: main); place the subgraph itself instead",
            )
        self.graph: StageGraph | None = None
        self._requests: RequestTracker[None] = RequestTracker()

    async def start(self) -> None:
        if self.graph is not None:
            return
        if self.switch_interval_ms is not None:
            sys.setswitchinterval(self.switch_interval_ms / 1000)
        engines = {s.name: create_engine(s.engine, dict(s.engine_args)) for s in self.config.stages}
        graph = StageGraph(self.config, engines)
        await graph.start()
        self.graph = graph

    async def close(self) -> None:
        graph, self.graph = self.graph, None
        self._requests.clear()
        if graph is not None:
            await graph.close()

    def active_requests(self) -> int:
        return len(self._requests)

    async def abort(self, request_id: str) -> None:
        """The request's stream ends at its next chunk; closing it ends every inner stage."""
        self._requests.abort(request_id)

    def stalled(self, bound_s: float) -> str | None:
        """An inner stage stuck in a step stalls the group (whose process the watch then
        kills and restarts whole); each inner stage is judged by its own `hang_s`, the
        group's bound only where that is longer."""
        if self.graph is None:
            return None
        for stage in self.config.stages:
            reason = self.graph.engines[stage.name].stalled(max(bound_s, stage.hang_s))
            if reason is not None:
                return f"{stage.name}: {reason}"
        return None

    def broken(self) -> str | None:
        """An inner stage broken breaks the group (their process is one)."""
        if self.graph is None:
            return None
        for stage in self.config.stages:
            if (reason := self.graph.engines[stage.name].broken()) is not None:
                return f"{stage.name}: {reason}"
        return None

    async def forget_session(self, session_id: str) -> None:
        if self.graph is not None:
            await self.graph.forget_session(session_id)

    def capacity(self) -> Capacity | None:
        """The inner stage that serves the fewest sessions, as `<group>.<stage>`: the group
        serves no more than it (an engine states one set of figures; the inner stages'
        own lines are logged where they start)."""
        binding = self._binding()
        if binding is None:
            return None
        figures = binding.capacity
        return dataclasses.replace(figures, stage=f"{self.config.name}.{figures.stage}")

    def row_load(self) -> RowLoad | None:
        """The binding inner stage's rows (see `capacity`)."""
        binding = self._binding()
        if binding is None or self.graph is None:
            return None
        return self.graph.engines[binding.capacity.stage].row_load()

    def _binding(self) -> StageCapacity | None:
        stated = self.graph.capacity() if self.graph is not None else None
        if stated is None:
            return None
        return min(stated.stages, key=lambda stage: stage.sessions())

    async def generate(
        self, request_id: str, request: PipelineRequest, /
    ) -> AsyncGenerator[Chunk, None]:
        graph = self.graph
        if graph is None:
            yield ErrorChunk(message="the subgraph was not started", stage=self.name)
            return
        # the inner stages know the request by the id it has here (a stage host prefixes it)
        stream = graph.generate(dataclasses.replace(request, request_id=request_id))
        self._requests.begin(request_id)
        try:
            async for chunk in stream:
                yield chunk
                if isinstance(chunk, End | ErrorChunk) or self._requests.aborted(request_id):
                    return
        finally:
            # let go first (at once, as every engine does when its stream is closed), then
            # wait while the inner graph cancels and awaits its stages' tasks
            self._requests.end(request_id)
            await stream.aclose()
