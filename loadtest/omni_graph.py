"""The Qwen3-Omni benchmarks' graph: `--pipeline` (qwen3_omni.yaml by default) with the
command's overrides (bench_graph.py), and where its stages run.

`--placement` and `--layouts` are overrides too, each printed with the rest: every stage in
a worker process or in the bench's own (`worker`, `main`), or the three grouped in one
worker process (`subgraph`: one process, each stage on a CUDA stream of its own); and on
which GPUs (LAYOUTS in omni_bench_options.py). Without them the stages run where the file
places them.
"""

from __future__ import annotations

import argparse
from typing import Any

from .bench_graph import BenchGraph, Override, graph_from_args

GROUP = "omni"
"""The one stage of a `subgraph` placement."""
GROUP_HANG_S = 60.0


def omni_graph(args: argparse.Namespace, layout: str = "file") -> BenchGraph:
    """The graph a run measures: the file, the command's overrides, the placement and the
    layout; checked as `parley serve` would check it."""
    graph = flat_graph(args, layout)
    if args.placement == "subgraph":
        grouped(graph, getattr(args, "switch_interval_ms", None))
    graph.check()
    return graph


def flat_graph(args: argparse.Namespace, layout: str = "file") -> BenchGraph:
    """The graph with its stages apart (a `subgraph` placement groups them after)."""
    graph = graph_from_args(args)
    if args.placement in ("worker", "main"):
        for stage in graph.stage_names():
            graph.set_placement(stage, "process", args.placement, f"--placement {args.placement}")
    if layout != "file":
        thinker, audio = layout_devices(graph, args, layout)
        for stage in graph.stage_names():
            on = thinker if stage == "thinker" else audio
            graph.set_devices(stage, on, f"--layouts {layout}")
    return graph


def layout_devices(
    graph: BenchGraph, args: argparse.Namespace, layout: str
) -> tuple[list[str], list[str]]:
    """The Thinker's devices and the Talker's and Code2Wav's in `split` or `replicas`
    (LAYOUTS in omni_bench_options.py): the first is where the file (or --device) puts the
    Thinker, the second --second-device."""
    first, second = graph.devices("thinker")[0], args.second_device
    if layout == "replicas":
        return [first, second], [second]
    return [first], [second]


def phase_devices(args: argparse.Namespace, layout: str) -> list[str]:
    """Every device a phase in `layout` runs on, each once (the GPU memory it holds)."""
    graph = flat_graph(args, layout)
    return list(dict.fromkeys(d for stage in graph.stage_names() for d in graph.devices(stage)))


def grouped(graph: BenchGraph, switch_interval_ms: float | None) -> None:
    """The stages as one `subgraph` stage in one worker process: each inner stage runs in
    that process (on the devices the file gives it), the edges and outputs inside."""
    inner = []
    for name in graph.stage_names():
        stage = graph.stage(name)
        placement = dict(stage.get("placement") or {})
        placement["process"] = "main"
        inner.append({**stage, "placement": placement})
    engine_args: dict[str, Any] = {
        "stages": inner,
        "edges": graph.data.get("edges", []),
        "outputs": graph.data["outputs"],
    }
    if switch_interval_ms is not None:
        engine_args["switch_interval_ms"] = switch_interval_ms
    hang_s = max([float(s.get("hang_s", 0)) for s in inner] + [GROUP_HANG_S])
    group = {
        "name": GROUP,
        "engine": "subgraph",
        "engine_args": engine_args,
        "placement": {"process": "worker"},
        "hang_s": hang_s,
    }
    data = {"name": graph.name, "stages": [group], "outputs": [GROUP]}
    asked = "--placement subgraph"
    if switch_interval_ms is not None:
        asked += f" --switch-interval-ms {switch_interval_ms:g}"
    was = f"{len(inner)} stages, gpu_sharing {graph.data.get('gpu_sharing', 'none')}"
    graph.replace(data, Override("placement", "one worker process (subgraph)", was, asked, None))


def engine_setting(graph: BenchGraph, stage: str, key: str, default: Any) -> Any:
    """One engine argument as the run has it (the engine's default where the file is silent)."""
    return graph.engine_args(stage).get(key, default)
