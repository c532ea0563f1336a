"""Engine arguments that contradict each other, found when a graph file is loaded.

An engine checks its arguments when it is made, but that happens in a worker process,
after the server has started, and its ValueError names no file. The limits whose
contradiction makes a stage useless or silently slow (a reply budget as long as the whole
context, a session's KV share above what one cache row holds) are checked here as well,
on the graph file's own values, so `load_graph` refuses the file naming the file, the line
and the field (`graph_config.py`). The engines call the same checks in `__init__` (a graph
built in code is held to them too).

Each check reads the arguments as given, with the engine's defaults for those left out
(`DEFAULTS`, kept equal to the engines' signatures by a test), and raises LimitError
naming the argument to change. No torch here: a graph file is checked before any model
is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .engines.registry import ENGINES


class LimitError(ValueError):
    """`field` (an engine argument) contradicts another limit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


DEFAULTS: dict[str, dict[str, int]] = {
    "qwen3_omni.thinker": {
        "max_new_tokens": 128,
        "min_new_tokens": 0,
        "max_context": 4096,
        "session_kv_tokens": 0,
        "session_kv_max_tokens": 0,
        "prefill_batch": 8,
        "prefill_chunk_tokens": 0,
    },
    "qwen3_omni.talker": {"max_frames": 375, "min_frames": 0, "max_context": 4096},
    "cascade.thinker": {"max_new_tokens": 64, "context_tokens": 1024},
}
"""The engines' own defaults of the arguments checked here."""


def _ints(engine: str, args: Mapping[str, Any]) -> dict[str, int]:
    """The checked arguments, given or default; a value that is no whole number is left to
    the engine's own checks (which name it)."""
    values = dict(DEFAULTS[engine])
    for name in values:
        given = args.get(name)
        if isinstance(given, int) and not isinstance(given, bool):
            values[name] = given
    return values


def qwen3_omni_thinker(args: Mapping[str, Any]) -> None:
    v = _ints("qwen3_omni.thinker", args)
    context, reply = v["max_context"], v["max_new_tokens"]
    if reply >= context:
        raise LimitError(
            "max_new_tokens",
            f"{reply} reply tokens leave no room for a prompt in max_context ({context}): "
            "a request's prompt and reply together fit max_context",
        )
    if v["min_new_tokens"] > reply:
        raise LimitError(
            "min_new_tokens",
            f"{v['min_new_tokens']} is more than max_new_tokens ({reply})",
        )
    share, store = v["session_kv_max_tokens"], v["session_kv_tokens"]
    if share > context:
        raise LimitError(
            "session_kv_max_tokens",
            f"{share} is more than max_context ({context}): a session's KV is one prompt "
            "and its reply, never longer than the context; set it to max_context at most",
        )
    if store and share > store:
        raise LimitError(
            "session_kv_max_tokens",
            f"{share} is more than session_kv_tokens ({store}), the store for all sessions",
        )
    chunk, batch = v["prefill_chunk_tokens"], v["prefill_batch"]
    if 0 < chunk < batch:
        raise LimitError(
            "prefill_chunk_tokens",
            f"{chunk} positions per chunk cannot give each of prefill_batch ({batch}) "
            "prompts one; use at least prefill_batch, or 0 for whole prefills",
        )


def qwen3_omni_talker(args: Mapping[str, Any]) -> None:
    v = _ints("qwen3_omni.talker", args)
    context, frames = v["max_context"], v["max_frames"]
    if frames + 1 >= context:
        raise LimitError(
            "max_frames",
            f"{frames} frames (and the codec's end) leave no room for a prompt in "
            f"max_context ({context})",
        )
    if v["min_frames"] > frames:
        raise LimitError("min_frames", f"{v['min_frames']} is more than max_frames ({frames})")


def cascade_thinker(args: Mapping[str, Any]) -> None:
    v = _ints("cascade.thinker", args)
    if v["max_new_tokens"] >= v["context_tokens"]:
        raise LimitError(
            "max_new_tokens",
            f"{v['max_new_tokens']} reply tokens leave no room for a prompt in "
            f"context_tokens ({v['context_tokens']})",
        )


CHECKS: dict[str, Callable[[Mapping[str, Any]], None]] = {
    "qwen3_omni.thinker": qwen3_omni_thinker,
    "qwen3_omni.talker": qwen3_omni_talker,
    "cascade.thinker": cascade_thinker,
}
"""Engine name (as graph files spell it) -> its check."""


def check_engine_args(engine: str, args: Mapping[str, Any]) -> None:
    """Raise LimitError where `args` of `engine` (its name, or its `module:Class`)
    contradict each other (engines with no check here pass)."""
    name = next((known for known, spec in ENGINES.items() if spec == engine), engine)
    check = CHECKS.get(name)
    if check is not None:
        check(args)
