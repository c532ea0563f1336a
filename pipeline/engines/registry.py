"""Engines by name, for graph files: `engine: echo`, or any `module:Class`."""

from __future__ import annotations

from typing import Any

from ..imports import import_object
from ..types import Engine, EntryEngine, StreamEngine

ENGINES: dict[str, str] = {
    "echo": "pipeline.engines.echo:EchoEngine",
    "subgraph": "pipeline.engines.subgraph:SubgraphEngine",
    "cascade.thinker": "pipeline.engines.cascade.thinker:ThinkerEngine",
    "cascade.talker": "pipeline.engines.cascade.talker:TalkerEngine",
    "cascade.code2wav": "pipeline.engines.cascade.code2wav:Code2WavEngine",
    "qwen3_omni.thinker": "pipeline.engines.qwen3_omni.thinker:ThinkerEngine",
    "qwen3_omni.talker": "pipeline.engines.qwen3_omni.talker:TalkerEngine",
    "qwen3_omni.code2wav": "pipeline.engines.qwen3_omni.code2wav:Code2WavEngine",
    "moshi.duplex": "pipeline.engines.moshi.duplex_stage:MoshiStage",
    "openai_chat.thinker": "pipeline.engines.openai_chat.thinker:ChatThinkerEngine",
}


class EngineNotFound(LookupError):
    pass


def engine_class(name: str) -> type[Any]:
    spec = ENGINES.get(name, name)
    if ":" not in spec:
        known = ", ".join(sorted(ENGINES))
        raise EngineNotFound(f"unknown engine {name!r}; known engines: {known}, or module:Class")
    try:
        cls = import_object(spec)
    except ValueError as exc:
        raise EngineNotFound(f"engine {name!r}: {exc}") from None
    if not isinstance(cls, type):
        raise EngineNotFound(f"engine {name!r}: {spec} is not a class")
    return cls


def create_engine(name: str, args: dict[str, Any] | None = None) -> Engine:
    engine = engine_class(name)(**(args or {}))
    if not isinstance(engine, EntryEngine | StreamEngine):
        raise EngineNotFound(
            f"engine {name!r} does not implement the engine contract "
            "(an EntryEngine or a StreamEngine, pipeline/types.py)"
        )
    return engine
