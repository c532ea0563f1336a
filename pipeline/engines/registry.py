"""Engines by name, for graph files: `engine: echo`, or any `module:Class`."""

from __future__ import annotations

import importlib
from typing import Any

from ..types import Engine

ENGINES: dict[str, str] = {
    "echo": "pipeline.engines.echo:EchoEngine",
    "cascade.thinker": "pipeline.engines.cascade.thinker:ThinkerEngine",
    "cascade.talker": "pipeline.engines.cascade.talker:TalkerEngine",
    "cascade.code2wav": "pipeline.engines.cascade.code2wav:Code2WavEngine",
}


class EngineNotFound(LookupError):
    pass


def engine_class(name: str) -> type[Any]:
    spec = ENGINES.get(name, name)
    module_name, sep, attr = spec.partition(":")
    if not sep:
        known = ", ".join(sorted(ENGINES))
        raise EngineNotFound(f"unknown engine {name!r}; known engines: {known}, or module:Class")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EngineNotFound(f"engine {name!r}: cannot import {module_name}: {exc}") from None
    cls = getattr(module, attr, None)
    if not isinstance(cls, type):
        raise EngineNotFound(f"engine {name!r}: {module_name} has no class {attr}")
    return cls


def create_engine(name: str, args: dict[str, Any] | None = None) -> Engine:
    engine = engine_class(name)(**(args or {}))
    if not isinstance(engine, Engine):
        raise EngineNotFound(f"engine {name!r} does not implement the engine contract")
    return engine
