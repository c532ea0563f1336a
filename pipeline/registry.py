"""Pipelines by name or path, for `parley serve --pipeline NAME|PATH`.

A name is a graph file shipped in `pipeline/configs/`; anything else is read as a path.
Stages placed in a worker process are wrapped in a `WorkerEngine` (or, where the parent of
several server processes hosts them once for all, in a `SharedStageEngine`), remote ones in a
`RemoteEngine`; the engine on the far side is checked against its stage's kind when it starts,
the others when the `StageGraph` is built.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from .engines.registry import create_engine
from .gpu_sharing import MpsDaemon
from .graph import StageGraph
from .graph_config import GraphConfig, StageConfig, load_graph
from .metrics import PipelineMetrics
from .mps_restart import MpsStages
from .remote import RemoteEngine
from .replicas import StageReplicas
from .shared_stage import SharedStageEngine
from .types import Engine, Pipeline
from .worker import WorkerEngine
from .worker_main import WorkerSpec

CONFIGS = Path(__file__).parent / "configs"
DEFAULT_PIPELINE = "cascade"


class PipelineNotFound(LookupError):
    pass


def available() -> list[str]:
    return sorted(p.stem for p in CONFIGS.glob("*.yaml"))


def graph_path(name_or_path: str) -> Path:
    shipped = CONFIGS / f"{name_or_path}.yaml"
    if shipped.is_file():
        return shipped
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    raise PipelineNotFound(
        f"unknown pipeline {name_or_path!r}; available: {', '.join(available())}, "
        "or a path to a graph file"
    )


def link_name(config: GraphConfig, stage: str) -> str:
    """The Redis link a remote stage is reached on: its `link`, or `<graph>.<stage>`."""
    return config.stage(stage).placement.link or f"{config.name}.{stage}"


def worker_spec(config: GraphConfig, stage: str, device: str | None = None) -> WorkerSpec:
    """What a process serving `stage` (its replica on `device`, by default its first
    device) away from the main process needs to build it."""
    found = config.stage(stage)
    args = found.replica_args(device or found.devices[0])
    return WorkerSpec(stage, found.engine, config.stage_kind(stage), args, found.hang_s)


def hosted_stages(config: GraphConfig) -> list[str]:
    """The stages a stage host can serve to several server processes: those in a worker
    (a replicated one gets a host per replica)."""
    return [stage.name for stage in config.stages if stage.placement.process == "worker"]


SharedStages = Mapping[str, str | Sequence[str]]
"""Per stage served by stage hosts: the unix socket of its host, or one per replica."""


def build_engines(
    config: GraphConfig, redis_url: str | None = None, shared: SharedStages | None = None
) -> dict[str, Engine]:
    """`shared`: per stage, the unix socket of the stage host that serves it (one per
    replica). A stage placed on several devices becomes a `StageReplicas` over one engine
    per device (replicas.py)."""
    engines: dict[str, Engine] = {}
    for stage in config.stages:
        if shared and stage.name in shared:
            paths = shared[stage.name]
            hosts = [
                SharedStageEngine(stage.name, path, hang_s=stage.hang_s)
                for path in ([paths] if isinstance(paths, str) else paths)
            ]
            engines[stage.name] = (
                hosts[0] if len(hosts) == 1 else StageReplicas(stage.name, hosts, stage.devices)
            )
        elif stage.placement.process == "remote":
            if redis_url is None:
                raise PipelineNotFound(f"stage {stage.name} is remote, which needs a Redis URL")
            engines[stage.name] = RemoteEngine(stage.name, link_name(config, stage.name), redis_url)
        elif len(stage.devices) > 1:
            engines[stage.name] = StageReplicas(
                stage.name, [_local_engine(config, stage, d) for d in stage.devices], stage.devices
            )
        else:
            engines[stage.name] = _local_engine(config, stage, stage.devices[0])
    return engines


def _local_engine(config: GraphConfig, stage: StageConfig, device: str) -> Engine:
    """The stage's engine (one replica's) on `device`, in a worker or in this process."""
    if stage.placement.process == "worker":
        return WorkerEngine(worker_spec(config, stage.name, device))
    return create_engine(stage.engine, stage.replica_args(device))


def gpu_sharing(config: GraphConfig, shared: SharedStages | None = None) -> MpsDaemon | None:
    """The MPS daemon this process starts for the graph: where the graph file asks for one
    and this process runs a stage itself (in a worker it starts, or in-process); stages
    served by stage hosts or other hosts share the GPU through their own starter's."""
    if config.gpu_sharing != "mps":
        return None
    local = [
        s
        for s in config.stages
        if s.placement.process != "remote" and not (shared and s.name in shared)
    ]
    return MpsDaemon() if local else None


def load_pipeline(
    name_or_path: str,
    metrics: PipelineMetrics | None = None,
    redis_url: str | None = None,
    shared: SharedStages | None = None,
) -> Pipeline:
    """Build the named pipeline (not started yet)."""
    config = load_graph(graph_path(name_or_path))
    engines = build_engines(config, redis_url, shared)
    gpu = gpu_sharing(config, shared)
    if gpu is not None:
        restarts_together(gpu, engines.values())
    return StageGraph(config, engines, metrics=metrics, gpu=gpu)


def restarts_together(gpu: MpsDaemon, engines: Iterable[Engine]) -> MpsStages:
    """Make the worker processes started under `gpu` one group (mps_restart.py)."""
    group = MpsStages(gpu)
    for engine in engines:
        for one in engine.replicas if isinstance(engine, StageReplicas) else [engine]:
            if isinstance(one, WorkerEngine):
                one.mps = group
                group.add(one)
    return group
