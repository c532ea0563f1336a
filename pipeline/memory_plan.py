"""How many cache rows (and KV tokens) a GPU stage takes: decided from the card, not the file.

vLLM sizes its KV cache as `total x gpu_memory_utilization - weights - activations` and logs
what that holds. A graph here may put several stage processes on one GPU (the Qwen3-Omni
Thinker, Talker and Code2Wav under MPS), and each must not take the whole free memory, nor
depend on which of them started first or restarted last. So the pool is the device's, fixed
from figures every stage can know:

    pool  = total x utilization - weights of every stage on the device - their headroom
    stage = pool x kv_share          (each KV-holding stage's share; shares sum to <= 1)

`weights` are the stage's own, measured after loading, plus its neighbours' counted from
their configurations (`SizingInputs.neighbour_weights`); `headroom` covers what is not KV
nor weights (CUDA context, activations, CUDA graphs, the allocator's slack). The result is the
same in every process and after any restart. Then the stage checks the device's free memory
now (after its weights) holds its KV and headroom, and refuses otherwise: a card shared with
something else is told, with the figures, not run out of memory later.

Within its share a stage takes rows of `row_bytes` each (`rows: auto`: as many as fit, up to
`max_rows`; an integer: exactly that, refused when it does not fit) and token caches: an
integer budget is taken first, an `auto` one grows with the rows (`per_row_tokens` for
each row). Pure: no torch; the engines hand it their figures (gpu_memory.py measures them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

GIB = 1 << 30
AUTO: Final = "auto"
Auto = Literal["auto"]
DEFAULT_UTILIZATION = 0.9
"""vLLM's default `gpu_memory_utilization`: the share of the card a graph's stages may use."""


def rows_setting(value: object, name: str) -> int | Auto:
    """A rows or tokens setting: `auto` or an integer >= 0 (ValueError otherwise)."""
    if value == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be 'auto' or an integer >= 0, not {value!r}")
    return value


def fraction_setting(value: object, name: str) -> float:
    """A share of memory: a number in (0, 1] (ValueError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(f"{name} must be a number in (0, 1], not {value!r}")
    return float(value)


def count_setting(value: object, name: str) -> int:
    """A cap: an integer >= 1 (ValueError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, not {value!r}")
    return value


class MemoryRefused(RuntimeError):
    """What a stage was asked for does not fit the card: the message has the figures."""


@dataclass(frozen=True, slots=True)
class TokenCache:
    """A KV store counted in tokens (the Thinker's session KV, its prefix cache)."""

    name: str
    tokens: int | Auto
    """An integer: this many tokens, taken before the rows. `auto`: `per_row_tokens` a row."""
    per_row_tokens: int = 0

    def budget(self, rows: int) -> int:
        """Its tokens beside `rows` rows."""
        return self.tokens if isinstance(self.tokens, int) else rows * self.per_row_tokens


@dataclass(frozen=True, slots=True)
class SizingInputs:
    stage: str
    device: str
    total: int
    """The device's memory, bytes."""
    free: int
    """Free on the device now, after this stage's weights are loaded (bytes)."""
    weights: int
    """This stage's weights (and what else it allocated before sizing), bytes."""
    headroom: int
    """This stage's memory beside weights and KV: CUDA context, activations, graphs."""
    row_bytes: int
    """One cache row's KV (`context` positions), bytes."""
    context: int
    """Positions a row holds."""
    rows: int | Auto
    max_rows: int
    token_bytes: int = 0
    """One token's KV in the token caches (bytes)."""
    caches: tuple[TokenCache, ...] = ()
    utilization: float = DEFAULT_UTILIZATION
    kv_share: float = 1.0
    neighbour_weights: int = 0
    """The weights of the other stages on this device (counted, not measured: they may not
    have started yet)."""
    neighbour_headroom: int = 0


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    stage: str
    device: str
    total: int
    usable: int
    """total x utilization"""
    weights: int
    device_weights: int
    """Every stage's on the device, this one's included."""
    headroom: int
    """Every stage's on the device."""
    pool: int
    """What the device has for KV over all its stages."""
    share: int
    """This stage's part of the pool (bytes)."""
    rows: int
    context: int
    row_bytes: int
    cache_tokens: dict[str, int] = field(default_factory=dict)
    kv_bytes: int = 0
    """What this stage allocates for KV: rows and token caches."""

    def line(self) -> str:
        """The start-up log line (one per stage): memory, rows x context, sessions."""
        caches = "".join(
            f", {name} {tokens:,} tokens" for name, tokens in self.cache_tokens.items()
        )
        return (
            f"{self.stage} GPU memory on {self.device}: total {_gib(self.total)}, usable "
            f"{_gib(self.usable)}, weights {_gib(self.weights)} "
            f"(device {_gib(self.device_weights)}), headroom {_gib(self.headroom)}, "
            f"KV pool {_gib(self.pool)}, this stage's KV "
            f"{_gib(self.kv_bytes)} of {_gib(self.share)}; KV cache: {self.rows} rows x "
            f"{self.context:,} positions = {self.rows * self.context:,} tokens{caches}; "
            f"maximum concurrency at {self.context:,} positions: {self.rows} sessions"
        )


def plan_memory(inputs: SizingInputs) -> MemoryPlan:
    """The stage's rows and cache budgets, or MemoryRefused saying what did not fit."""
    i = inputs
    if not 0.0 < i.utilization <= 1.0 or not 0.0 < i.kv_share <= 1.0:
        raise ValueError("utilization and kv_share must be in (0, 1]")
    usable = int(i.total * i.utilization)
    device_weights = i.weights + i.neighbour_weights
    headroom = i.headroom + i.neighbour_headroom
    pool = usable - device_weights - headroom
    share = int(max(pool, 0) * i.kv_share)
    fixed = sum(c.budget(0) for c in i.caches) * i.token_bytes
    per_row = i.row_bytes + sum(c.budget(1) - c.budget(0) for c in i.caches) * i.token_bytes
    fitting = max(0, (share - fixed) // per_row) if per_row else i.max_rows
    figures = (
        f"{i.stage} on {i.device}: total {_gib(i.total)} x utilization {i.utilization} = "
        f"{_gib(usable)}; weights {_gib(device_weights)} (this stage {_gib(i.weights)}), "
        f"headroom {_gib(headroom)}: KV pool {_gib(pool)}, this stage's share "
        f"{i.kv_share} = {_gib(share)}; a row of {i.context:,} positions takes "
        f"{_gib(per_row)}{_fixed_text(fixed)}: {fitting} rows fit"
    )
    if isinstance(i.rows, int):
        rows = i.rows
        if rows > fitting:
            raise MemoryRefused(f"{rows} rows asked for do not fit: {figures}")
    else:
        rows = min(i.max_rows, fitting)
        if rows < 1:
            raise MemoryRefused(
                f"not one cache row fits: {figures} (a smaller max_context, a larger "
                "gpu_memory_utilization or kv_share, or a larger card)"
            )
    tokens = {c.name: c.budget(rows) for c in i.caches}
    kv_bytes = rows * i.row_bytes + sum(tokens.values()) * i.token_bytes
    if kv_bytes + i.headroom > i.free:
        raise MemoryRefused(
            f"{i.stage} on {i.device}: its KV {_gib(kv_bytes)} and headroom {_gib(i.headroom)} "
            f"exceed the {_gib(i.free)} free now (total {_gib(i.total)}): something else holds "
            f"memory on this device ({figures})"
        )
    return MemoryPlan(
        stage=i.stage,
        device=i.device,
        total=i.total,
        usable=usable,
        weights=i.weights,
        device_weights=device_weights,
        headroom=headroom,
        pool=pool,
        share=share,
        rows=rows,
        context=i.context,
        row_bytes=i.row_bytes,
        cache_tokens=tokens,
        kv_bytes=kv_bytes,
    )


def _fixed_text(fixed: int) -> str:
    return f", fixed token caches {_gib(fixed)}" if fixed else ""


def _gib(size: int) -> str:
    return f"{size / GIB:.2f} GiB"
