"""Stage graph files: YAML in, a validated `GraphConfig` out.

A graph names its stages (each with an engine, engine arguments and a placement), the edges
between them (upstream stage, downstream stage, a transform given as `module:function`, and
the number of upstream chunks batched into one call of the transform), and the stages whose
output reaches the caller. Every error names the file, the line and the field, because a
graph file is edited by hand. The edges also say what kind each stage is: one with no upstream
edge is an entry stage (its engine takes the request), any other a stream stage (its engine
takes the upstream chunks); the runtime checks each engine against its stage's kind.

    name: cascade
    stages:
      - name: thinker
        engine: cascade.thinker
        engine_args: {max_new_tokens: 96}
        placement: {process: worker}
        hang_s: 5          # no progress for this long: hung (killed and started again)
    edges:
      - {from: thinker, to: talker, transform: pipeline.transforms:clauses, chunk: 1}
    outputs: [thinker, code2wav]
    gpu_sharing: none      # or mps: stage processes on one GPU run side by side
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .engine_limits import LimitError, check_engine_args, check_handoff, with_derived_limits
from .imports import import_object
from .sizing_config import engine_args_problem, shared_gpu_problem
from .types import EntryEngine, StreamEngine

StageKind = Literal["entry", "stream"]
"""An entry stage has no upstream edge and its engine (an EntryEngine) gets the request; every
other stage is a stream stage, whose engine (a StreamEngine) gets the upstream chunks."""


class GraphConfigError(ValueError):
    """A graph file that cannot be used: says where and what."""

    def __init__(self, source: str, line: int | None, field: str, message: str) -> None:
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")
        self.source, self.line, self.field = source, line, field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


DEVICE_PATTERN = r"^(cpu|cuda:[0-9]+)$"


class Placement(_Model):
    """Where a stage runs: this process, a worker process, or another host (`remote`,
    served by `parley stage` over the Redis link named `link`), and on which devices.

    `devices` names one device per replica of the stage: `[cuda:1]` runs it on the second
    GPU, `[cuda:0, cuda:1]` runs two replicas, one on each, with sessions spread over them
    (replicas.py). A stage on a CUDA device gets it as its engine's `device` argument."""

    process: Literal["main", "worker", "remote"] = "main"
    devices: tuple[str, ...] = Field(default=("cpu",), min_length=1, max_length=16)
    link: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")

    @field_validator("devices")
    @classmethod
    def _device_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for device in value:
            if not re.fullmatch(DEVICE_PATTERN, device):
                raise ValueError(
                    f"{device!r} is not a device: cpu, or cuda:N (cuda:0, cuda:1, ...)"
                )
        return value

    @model_validator(mode="after")
    def _replicas_stay_local(self) -> Placement:
        if self.process == "remote" and len(self.devices) > 1:
            raise _At(
                ("devices",),
                "a remote stage is one `parley stage` host: run one host per replica instead",
            )
        return self


DEFAULT_HANG_S = 5.0


class StageConfig(_Model):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    engine: str = Field(min_length=1)
    engine_args: dict[str, Any] = Field(default_factory=dict)
    placement: Placement = Placement()
    hang_s: float = Field(default=DEFAULT_HANG_S, gt=0, le=3600)
    """A stage that shows no progress for this long is hung: its process sent no heartbeat
    (stopped, or its loop blocked), or its engine's model thread spent longer than this in
    one step (a step known to be longer, a CUDA graph capture, declares its own bound). A
    hung worker or stage host is killed and started again, like one that died."""

    @model_validator(mode="after")
    def _one_device_setting(self) -> StageConfig:
        """`engine_args.device` (the older way to name a stage's device) may stay beside
        `placement.devices` only where both say the same single device."""
        given = self.engine_args.get("device")
        if given is None or "devices" not in self.placement.model_fields_set:
            return self
        if self.placement.devices != (given,):
            raise _At(
                ("engine_args", "device"),
                f"{given!r} disagrees with placement.devices {list(self.placement.devices)}: "
                "name the devices in placement.devices only",
            )
        return self

    @model_validator(mode="after")
    def _sizing_forms(self) -> StageConfig:
        """`auto` or an integer for rows and token budgets, fractions in (0, 1]: sizing_config."""
        if (problem := engine_args_problem(self.engine_args)) is not None:
            raise _At(*problem)
        return self

    @property
    def devices_field(self) -> str:
        """Where the file names the stage's devices: `placement.devices`, or the engine's
        own `engine_args.device` (the older way), whichever `devices` reads."""
        if "devices" in self.placement.model_fields_set:
            return "placement.devices"
        return "engine_args.device" if "device" in self.engine_args else "placement.devices"

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices of the stage's replicas: `placement.devices` where the file names
        them, else the engine's own `device` argument, else the CPU."""
        given = self.engine_args.get("device")
        if self.devices_field == "engine_args.device" and isinstance(given, str):
            return (given,)
        return self.placement.devices

    def replica_args(self, device: str) -> dict[str, Any]:
        """The engine arguments of the replica on `device`: a CUDA device is given to the
        engine as its `device`; on the CPU the arguments are the file's."""
        args = dict(self.engine_args)
        if device != "cpu":
            args["device"] = device
        return args


class EdgeConfig(_Model):
    source: str = Field(alias="from")
    target: str = Field(alias="to")
    transform: str | None = None
    chunk: int = Field(default=1, ge=1, le=4096)

    @field_validator("transform")
    @classmethod
    def _importable(cls, value: str | None) -> str | None:
        if value is not None:
            resolve_transform(value)
        return value


class GraphConfig(_Model):
    name: str
    stages: tuple[StageConfig, ...] = Field(min_length=1)
    edges: tuple[EdgeConfig, ...] = ()
    outputs: tuple[str, ...] = Field(min_length=1)
    gpu_sharing: Literal["none", "mps"] = "none"
    """How the graph's stage processes share a GPU: CUDA's time slices (`none`), or one MPS
    daemon that runs their kernels side by side (`mps`; `pipeline/gpu_sharing.py`)."""

    @model_validator(mode="before")
    @classmethod
    def _derived(cls, data: Any) -> Any:
        """Limits one stage takes from another, where the file leaves them out."""
        return with_derived_limits(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _consistent(self) -> GraphConfig:
        names = [s.name for s in self.stages]
        seen: set[str] = set()
        for index, name in enumerate(names):
            if name in seen:
                raise _At(("stages", index, "name"), f"stage {name!r} is defined twice")
            seen.add(name)
        for index, edge in enumerate(self.edges):
            for end, field in ((edge.source, "from"), (edge.target, "to")):
                if end not in seen:
                    raise _At(("edges", index, field), f"no stage named {end!r}")
        for index, name in enumerate(self.outputs):
            if name not in seen:
                raise _At(("outputs", index), f"no stage named {name!r}")
        if cycle := _find_cycle(names, self.edges):
            raise _At(("edges",), "the edges form a cycle: " + " -> ".join(cycle))
        for index, stage in enumerate(self.stages):
            try:
                check_engine_args(stage.engine, stage.engine_args)
            except LimitError as exc:
                raise _At(("stages", index, "engine_args", exc.field), exc.message) from None
        for edge in self.edges:
            source, target = self.stage(edge.source), self.stage(edge.target)
            try:
                check_handoff(source.engine, source.engine_args, target.engine, target.engine_args)
            except LimitError as exc:
                at = ("stages", names.index(edge.source), "engine_args", exc.field)
                raise _At(at, f"{exc.message} (stage {edge.target!r})") from None
        if (problem := shared_gpu_problem(self.stages)) is not None:  # sizing_config.py
            raise _At(*problem)
        return self

    def stage(self, name: str) -> StageConfig:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(f"graph {self.name} has no stage {name!r}")

    def upstream(self, name: str) -> list[EdgeConfig]:
        return [e for e in self.edges if e.target == name]

    def entry_stages(self) -> list[str]:
        """Stages with no upstream edge: they receive the request itself."""
        targets = {e.target for e in self.edges}
        return [s.name for s in self.stages if s.name not in targets]

    def stage_kind(self, name: str) -> StageKind:
        return "stream" if self.upstream(name) else "entry"


def wrong_engine_kind(stage: str, kind: StageKind, engine: object) -> str:
    """What to say when `engine` is not the kind of engine `stage` needs."""
    cls = type(engine)
    what = f"{cls.__module__}.{cls.__qualname__}"
    if isinstance(engine, EntryEngine):
        what += " is an EntryEngine"
    elif isinstance(engine, StreamEngine):
        what += " is a StreamEngine"
    else:
        what += " is neither"
    if kind == "entry":
        need = "has no upstream edge, so its engine must be an EntryEngine (takes the request)"
    else:
        need = "has an upstream edge, so its engine must be a StreamEngine (takes a StageInput)"
    return f"stage {stage!r} {need}; {what}"


class _At(ValueError):
    """A validation error that knows the path of the offending field."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


def _find_cycle(names: list[str], edges: tuple[EdgeConfig, ...]) -> list[str] | None:
    children: dict[str, list[str]] = {n: [] for n in names}
    for edge in edges:
        children[edge.source].append(edge.target)
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for child in children[node]:
            if state.get(child) == 1:
                return [*path[path.index(child) :], child] if child in path else [node, child]
            if child not in state and (found := visit(child, [*path, child])):
                return found
        state[node] = 2
        return None

    for name in names:
        if name not in state and (found := visit(name, [name])):
            return found
    return None


def resolve_transform(spec: str) -> Callable[..., Any]:
    """Import `module:function`; raises ValueError saying what is missing."""
    function = import_object(spec)
    if not callable(function):
        raise ValueError(f"{spec!r} is not a function")
    return function  # type: ignore[no-any-return]


# --- loading with line numbers ------------------------------------------------------------


def _lines(node: yaml.Node) -> dict[tuple[str | int, ...], int]:
    """Map each path in the YAML document to the (1-based) line it starts on."""
    found: dict[tuple[str | int, ...], int] = {}

    def walk(n: yaml.Node, path: tuple[str | int, ...]) -> None:
        found[path] = n.start_mark.line + 1
        if isinstance(n, yaml.MappingNode):
            for key, value in n.value:
                child = (*path, str(key.value))
                walk(value, child)
                found[child] = key.start_mark.line + 1
        elif isinstance(n, yaml.SequenceNode):
            for index, item in enumerate(n.value):
                walk(item, (*path, index))

    walk(node, ())
    return found


def _line_for(lines: dict[tuple[str | int, ...], int], loc: tuple[str | int, ...]) -> int | None:
    for cut in range(len(loc), -1, -1):  # the deepest part of the path that exists in the file
        if loc[:cut] in lines:
            return lines[loc[:cut]]
    return None


def parse_graph(text: str, source: str = "<graph>") -> GraphConfig:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise GraphConfigError(source, line, "", f"not valid YAML: {exc}") from None
    if node is None or not isinstance(data, dict):
        raise GraphConfigError(source, 1, "", "a graph file is a mapping with stages and outputs")
    return validate_graph(data, source, _lines(node))


def validate_graph(
    data: dict[str, Any],
    source: str = "<graph>",
    lines: dict[tuple[str | int, ...], int] | None = None,
) -> GraphConfig:
    """A graph given as data (a graph file's, or one nested in another's engine args):
    validated, every error naming the field (and the line, when `lines` maps them)."""
    lines = lines or {}
    try:
        return GraphConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        cause = err.get("ctx", {}).get("error")
        if isinstance(cause, _At):  # its path is below the model that raised it
            loc, message = (*loc, *cause.loc), str(cause)
        else:
            message = str(err["msg"]).removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                message = "unknown field"
        field = ".".join(str(p) for p in loc)
        raise GraphConfigError(source, _line_for(lines, loc), field, message) from None


def load_graph(path: str | Path) -> GraphConfig:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise GraphConfigError(str(path), None, "", f"cannot read: {exc.strerror}") from None
    return parse_graph(text, str(path))
