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
        "talker_prompt_tokens": 0,
    },
    "qwen3_omni.talker": {"max_frames": 375, "min_frames": 0, "max_context": 4096},
    "cascade.thinker": {"max_new_tokens": 64, "context_tokens": 1024},
}
"""The engines' own defaults of the arguments checked here."""
TALKER_PROMPT_EXTRA = 9
"""Positions the Qwen3-Omni Talker's prompt adds to the Thinker's user items: the
assistant's opening (3), four tts pads, tts_bos and the first reply token
(`talker_runner._prompt_embeds`)."""


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


def talker_prompt_room(talker: Mapping[str, Any]) -> int:
    """The prompt positions a Qwen3-Omni Talker's cache row leaves beside its reply."""
    k = _ints("qwen3_omni.talker", talker)
    return k["max_context"] - k["max_frames"] - 1 - TALKER_PROMPT_EXTRA


def qwen3_omni_handoff(thinker: Mapping[str, Any], talker: Mapping[str, Any]) -> None:
    """A Thinker feeding a Talker: the Talker's prompt (the conversation's user items and
    this turn) must fit its cache row beside `max_frames`, so the Thinker's cut to its
    context holds the Talker's share to `talker_prompt_tokens` (`with_derived_limits`
    sets it from the Talker's arguments where the file does not)."""
    room = talker_prompt_room(talker)
    given = _ints("qwen3_omni.thinker", thinker)["talker_prompt_tokens"]
    if given > room:
        raise LimitError(
            "talker_prompt_tokens",
            f"{given} is more than the Talker's cache row leaves for a prompt ({room}: its "
            f"max_context less max_frames and {TALKER_PROMPT_EXTRA + 1}); set it to {room} "
            "at most (or leave it out: then it is that), or give the Talker a longer "
            "max_context",
        )


def with_derived_limits(graph: Mapping[str, Any]) -> Mapping[str, Any]:
    """`graph` (a graph file's data, before validation) with the limits one stage takes from
    another filled in where the file leaves them out: a Qwen3-Omni Thinker feeding a Talker
    gets `talker_prompt_tokens`, the Talker's prompt room, when that is less than the
    Thinker's own (so its cuts keep the Talker's prompt within the Talker's cache row).
    Anything malformed is left as it is, for validation to name."""
    stages, edges = graph.get("stages"), graph.get("edges")
    if not isinstance(stages, list) or not isinstance(edges, list):
        return graph
    by_name = {s.get("name"): s for s in stages if isinstance(s, dict)}
    changed: dict[str, dict[str, Any]] = {}
    for edge in edges:
        if not isinstance(edge, dict):
            continue
        source, target = by_name.get(edge.get("from")), by_name.get(edge.get("to"))
        if source is None or target is None:
            continue
        pair = (_name(str(source.get("engine"))), _name(str(target.get("engine"))))
        args, talker = source.get("engine_args") or {}, target.get("engine_args") or {}
        if pair != ("qwen3_omni.thinker", "qwen3_omni.talker") or "talker_prompt_tokens" in args:
            continue
        if not isinstance(args, dict) or not isinstance(talker, dict):
            continue
        thinker = _ints("qwen3_omni.thinker", args)
        room = talker_prompt_room(talker)
        if 0 < room < thinker["max_context"] - thinker["max_new_tokens"]:
            changed[str(source["name"])] = {**args, "talker_prompt_tokens": room}
    if not changed:
        return graph
    filled = [
        {**s, "engine_args": changed[s["name"]]}
        if isinstance(s, dict) and s.get("name") in changed
        else s
        for s in stages
    ]
    return {**graph, "stages": filled}


HANDOFFS: dict[tuple[str, str], Callable[[Mapping[str, Any], Mapping[str, Any]], None]] = {
    ("qwen3_omni.thinker", "qwen3_omni.talker"): qwen3_omni_handoff,
}
"""(upstream engine, downstream engine) -> the check of an edge between them; a LimitError
names the upstream stage's argument."""


CHECKS: dict[str, Callable[[Mapping[str, Any]], None]] = {
    "qwen3_omni.thinker": qwen3_omni_thinker,
    "qwen3_omni.talker": qwen3_omni_talker,
    "cascade.thinker": cascade_thinker,
}
"""Engine name (as graph files spell it) -> its check."""


def _name(engine: str) -> str:
    """A graph file's engine (its name, or its `module:Class`) as its registered name."""
    return next((known for known, spec in ENGINES.items() if spec == engine), engine)


def check_engine_args(engine: str, args: Mapping[str, Any]) -> None:
    """Raise LimitError where `args` of `engine` contradict each other (engines with no
    check here pass)."""
    check = CHECKS.get(_name(engine))
    if check is not None:
        check(args)


def check_handoff(
    source: str, source_args: Mapping[str, Any], target: str, target_args: Mapping[str, Any]
) -> None:
    """Raise LimitError (naming a `source_args` argument) where an edge from engine `source`
    to engine `target` joins limits that contradict each other."""
    check = HANDOFFS.get((_name(source), _name(target)))
    if check is not None:
        check(source_args, target_args)
