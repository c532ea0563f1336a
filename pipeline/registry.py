"""Pipelines by name, for `parley serve --pipeline NAME`."""

from __future__ import annotations

from collections.abc import Callable

from .engine_pipeline import EnginePipeline
from .engines.echo import EchoEngine
from .types import Pipeline

DEFAULT_PIPELINE = "echo"


class PipelineNotFound(LookupError):
    pass


def _echo() -> Pipeline:
    return EnginePipeline(EchoEngine())


BUILTIN: dict[str, Callable[[], Pipeline]] = {"echo": _echo}


def load_pipeline(name: str) -> Pipeline:
    """Build the named pipeline (not started yet)."""
    try:
        factory = BUILTIN[name]
    except KeyError:
        available = ", ".join(sorted(BUILTIN))
        raise PipelineNotFound(f"unknown pipeline {name!r}; available: {available}") from None
    return factory()
