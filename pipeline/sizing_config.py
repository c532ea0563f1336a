"""The graph file's sizing settings, checked at load (graph_config.py names the file and line).

A stage's `engine_args` may size its KV to the card (docs/engines/sizing.md): `decode_rows` /
`rows` and the Thinker's `session_kv_tokens` / `prefix_cache_tokens` are `auto` or an integer
>= 0, `max_rows` an integer >= 1, `gpu_memory_utilization` and `kv_share` numbers in (0, 1],
`shares_gpu_with` the Qwen3-Omni parts of the other stages on the stage's GPU. Across the
stages that hold KV on one GPU, the shares sum to at most 1 and the utilization is one figure
(each stage computes the same device pool from it), and a Qwen3-Omni stage lists its
neighbours; a stage with integer rows that states neither share nor neighbours (a
benchmark's graph) is checked against the card alone. Pure: no torch at graph load.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from .memory_plan import DEFAULT_UTILIZATION, count_setting, fraction_setting, rows_setting

ROWS_FIELDS = ("decode_rows", "rows", "session_kv_tokens", "prefix_cache_tokens")
FRACTION_FIELDS = ("gpu_memory_utilization", "kv_share")
KV_FIELDS = ("decode_rows", "rows")
OMNI_PARTS = ("thinker", "talker", "code2wav")
OMNI_ENGINE = "qwen3_omni."

Problem = tuple[tuple[str | int, ...], str]
"""Where in the file (a path of keys) and what is wrong."""


class SizedStage(Protocol):
    @property
    def engine(self) -> str: ...
    @property
    def engine_args(self) -> dict[str, Any]: ...
    @property
    def devices(self) -> tuple[str, ...]: ...


def engine_args_problem(args: Mapping[str, Any]) -> Problem | None:
    """The first sizing setting of one stage that is not of its form."""
    checks: list[tuple[str, Callable[[object, str], object]]]
    checks = [(name, rows_setting) for name in ROWS_FIELDS]
    checks += [(name, fraction_setting) for name in FRACTION_FIELDS]
    checks.append(("max_rows", count_setting))
    for name, check in checks:
        if name in args:
            try:
                check(args[name], name)
            except ValueError as exc:
                return ("engine_args", name), str(exc)
    given = args.get("shares_gpu_with", [])
    if not isinstance(given, list) or any(part not in OMNI_PARTS for part in given):
        return ("engine_args", "shares_gpu_with"), (
            f"must list parts of {', '.join(OMNI_PARTS)}, not {given!r}"
        )
    return None


def shared_gpu_problem(stages: Sequence[SizedStage]) -> Problem | None:
    """The first disagreement between the stages that share a GPU."""
    on: dict[str, list[int]] = {}
    for index, stage in enumerate(stages):
        for device in stage.devices:
            if device.startswith("cuda"):
                on.setdefault(device, []).append(index)
    for device, indexes in on.items():
        holding = [i for i in indexes if any(stages[i].engine_args.get(f) for f in KV_FIELDS)]
        utilizations = {
            stages[i].engine_args.get("gpu_memory_utilization", DEFAULT_UTILIZATION)
            for i in holding
        }
        if len(utilizations) > 1:
            return ("stages", holding[-1], "engine_args", "gpu_memory_utilization"), (
                f"the stages holding KV on {device} give different gpu_memory_utilization "
                f"({', '.join(str(u) for u in sorted(utilizations))}): give them one figure"
            )
        sized = [i for i in holding if _auto_sized(stages[i].engine_args)]
        shares = sum(float(stages[i].engine_args.get("kv_share", 1.0)) for i in sized)
        if shares > 1.0 + 1e-9:
            return ("stages", sized[-1], "engine_args", "kv_share"), (
                f"the kv_share of the stages holding KV on {device} sum to {shares:g}, more than 1"
            )
        parts = {i: stages[i].engine.removeprefix(OMNI_ENGINE) for i in indexes}
        omni = [i for i in indexes if stages[i].engine.startswith(OMNI_ENGINE)]
        for i in omni:
            if i not in sized:
                continue
            expected = sorted(parts[j] for j in omni if j != i)
            given = sorted(stages[i].engine_args.get("shares_gpu_with", []))
            if given != expected:
                return ("stages", i, "engine_args", "shares_gpu_with"), (
                    f"{device} also holds {expected or 'no other part'}; the stage's sizing "
                    f"counts their weights, so shares_gpu_with must list them (it gives {given})"
                )
    return None


def _auto_sized(args: Mapping[str, Any]) -> bool:
    """Rows taken from the card (`auto`), or a stage that states its share or neighbours:
    its share and neighbours must add up with the others'. A stage with an integer and
    neither (a benchmark's graph) asks for its rows and is checked against the card alone."""
    given = ("kv_share", "shares_gpu_with")
    return any(args.get(f) == "auto" for f in KV_FIELDS) or any(f in args for f in given)
