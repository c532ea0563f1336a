"""A benchmark's graph: a graph file as it ships, with each override the command asked for
written down, so that a figure never passes for the shipped graph's when it is not.

Every GPU benchmark (`omni_bench`, `omni_timeline`, `omni_serve_bench`, `moshi_steps`,
`duplex_latency`) measures a graph file, `--pipeline NAME|PATH` (a shipped one by default),
and takes every engine setting from it: context per stage, rows, batches, session KV, the
codec's chunks. What the command changes is an `Override`: the field, the value, the file's
own value and the option that asked for it. The overrides go into the report's header
(`report()`), and `note()` gives the line printed beside each figure they affect: only
those of the stages it depends on, and those of the whole graph.

The options every benchmark shares (`add_graph_options`):

- `--pipeline`: the graph file, a shipped name or a path;
- `--set STAGE.KEY=VALUE` (repeated): one engine argument of one stage (the value read as
  YAML: `--set thinker.max_context=4096`, `--set code2wav.max_batch=32`); `--set KEY=VALUE`
  for a key of the whole graph (`--set gpu_sharing=none`);
- `--device`: every stage on this device; `--model-path`: every stage's checkpoint;
- with answer lengths (Qwen3-Omni: random weights never stop by themselves):
  `--think-tokens` (the Thinker's reply, minimum and maximum) and `--speech-s` (the Talker's
  speech, minimum and maximum).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

FRAME_RATE_HZ = 12.5
"""Qwen3-Omni's codec frames per second of speech (a Talker frame is 80 ms of it)."""
UNSET = "unset"
"""What an override's `was` says where the file did not set the field."""


@dataclass(frozen=True, slots=True)
class Override:
    """One field the command set differently from the graph file."""

    field: str
    """`STAGE.KEY` for an engine argument, `STAGE.placement.KEY` for a placement, `KEY`
    for the whole graph."""
    value: Any
    was: Any
    """The file's value (UNSET where it had none)."""
    asked_by: str
    """The option that asked for it, as given (`--think-tokens 128`)."""
    stage: str | None
    """The stage it changes; None: the whole graph."""

    def line(self) -> str:
        return f"{self.short()} ({self.asked_by})"

    def short(self) -> str:
        return f"{self.field}={_show(self.value)} (file: {_show(self.was)})"


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


class BenchGraph:
    """A graph file's contents and the overrides applied to them, in the order asked."""

    def __init__(self, source: str, data: dict[str, Any], path: Path) -> None:
        self.source = source
        """The file as named: `pipeline/configs/NAME.yaml` for a shipped graph."""
        self.path = path
        """The file itself."""
        self.data = data
        self.overrides: list[Override] = []

    @classmethod
    def load(cls, name_or_path: str) -> BenchGraph:
        from pipeline.registry import CONFIGS, graph_path

        path = graph_path(name_or_path)
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("stages"), list):
            raise SystemExit(f"{path}: not a graph file (no stages)")
        shipped = path.resolve().parent == CONFIGS.resolve()
        source = f"pipeline/configs/{path.name}" if shipped else str(path)
        return cls(source, data, path.resolve())

    @property
    def shipped(self) -> bool:
        return self.source.startswith("pipeline/configs/")

    @property
    def name(self) -> str:
        return str(self.data.get("name", Path(self.source).stem))

    def stage_names(self) -> list[str]:
        return [str(stage["name"]) for stage in self.data["stages"]]

    def stage(self, name: str) -> dict[str, Any]:
        """A copy of one stage's mapping (its engine, arguments, placement)."""
        return dict(self._stage(name))

    def stage_by_engine(self, suffix: str) -> str | None:
        """The first stage whose engine ends with `suffix` (`.thinker`), or None."""
        for stage in self.data["stages"]:
            if str(stage["engine"]).endswith(suffix):
                return str(stage["name"])
        return None

    def engine_args(self, stage: str) -> dict[str, Any]:
        return dict(self._stage(stage).get("engine_args") or {})

    def devices(self, stage: str) -> list[str]:
        """Where the stage runs, as the graph says it (its replicas' devices): its
        placement's, else its engine's own `device`, else the CPU (as graph_config reads
        them; read here without checking the rest, which may be mid-change)."""
        placement = self._stage(stage).get("placement") or {}
        if "devices" in placement:
            return [str(d) for d in placement["devices"]]
        device = self.engine_args(stage).get("device")
        return [str(device)] if isinstance(device, str) else ["cpu"]

    def engine_kwargs(self, stage: str) -> dict[str, Any]:
        """The engine's arguments for one replica (its first device), as a server builds
        them: what a benchmark that builds one engine itself passes."""
        from pipeline.graph_config import parse_graph

        found = parse_graph(self.text(), self.source).stage(stage)  # derived limits filled in
        return found.replica_args(found.devices[0])

    # --- overrides ---------------------------------------------------------------------

    def set_arg(self, stage: str, key: str, value: Any, asked_by: str) -> None:
        """One engine argument of one stage (none written where it already says so)."""
        args = self._stage(stage).setdefault("engine_args", {})
        self._set(args, f"{stage}.{key}", key, value, asked_by, stage)

    def set_graph(self, key: str, value: Any, asked_by: str) -> None:
        self._set(self.data, key, key, value, asked_by, None)

    def set_placement(self, stage: str, key: str, value: Any, asked_by: str) -> None:
        placement = self._stage(stage).setdefault("placement", {})
        self._set(placement, f"{stage}.placement.{key}", key, value, asked_by, stage)

    def _set(
        self,
        where: dict[str, Any],
        name: str,
        key: str,
        value: Any,
        asked_by: str,
        stage: str | None,
    ) -> None:
        """`where[key] = value`, recorded as an override named `name` unless it says so."""
        was = where.get(key, UNSET)
        if was == value:
            return
        where[key] = value
        self.overrides.append(Override(name, value, was, asked_by, stage))

    def set_devices(self, stage: str, devices: list[str], asked_by: str) -> None:
        """The stage's replicas on `devices`; the placement says it (an engine's own
        `device` argument, the older way, goes)."""
        args = self._stage(stage).get("engine_args") or {}
        if "device" in args:
            old = args.pop("device")
            self.overrides.append(Override(f"{stage}.device", UNSET, old, asked_by, stage))
        self.set_placement(stage, "devices", list(devices), asked_by)

    def replace(self, data: dict[str, Any], override: Override) -> None:
        """The whole graph rewritten (stages grouped into one, ...), said by `override`."""
        self.data = data
        self.overrides.append(override)

    def _stage(self, name: str) -> dict[str, Any]:
        for stage in self.data["stages"]:
            if stage["name"] == name:
                return stage  # type: ignore[no-any-return]  # the file's own mapping
        raise SystemExit(f"{self.source}: no stage {name!r} (it has {self.stage_names()})")

    # --- what is run and what is reported -----------------------------------------------

    def text(self) -> str:
        return yaml.safe_dump(self.data, sort_keys=False)

    def check(self) -> None:
        """Refused here, naming the field, where the overrides contradict the file's limits
        (as `parley serve` would refuse the file)."""
        from pipeline.graph_config import parse_graph

        parse_graph(self.text(), f"{self.source} with the overrides")

    def write(self, folder: Path) -> Path:
        """The graph as run, for `load_pipeline` or `parley serve --pipeline`: the file
        itself where nothing was changed, else a copy with the overrides."""
        if not self.overrides:
            return self.path
        path = folder / f"{self.name}_bench.yaml"
        path.write_text(self.text())
        return path

    def report(self) -> dict[str, Any]:
        """The report header's part: which file, as shipped or not, each override, the
        graph as run."""
        return {
            "file": self.source,
            "shipped": self.shipped,
            "as_shipped": self.shipped and not self.overrides,
            "overrides": [o.line() for o in self.overrides],
            "note": self.note(),
            "graph": self.text(),
        }

    def note(self, *stages: str) -> str:
        """The line beside a figure that depends on `stages` (all of them when none is
        named): the file, and the overrides that touch those stages or the whole graph."""
        picked = [o for o in self.overrides if not stages or o.stage is None or o.stage in stages]
        if not picked:
            kind = "as shipped" if self.shipped else "as the file says"
            return f"{self.source} {kind}"
        by_option: dict[str, list[str]] = {}
        for override in picked:
            by_option.setdefault(override.asked_by, []).append(override.short())
        told = "; ".join(f"{option}: {', '.join(said)}" for option, said in by_option.items())
        return f"{self.source} with {told}"


def header_lines(graph: dict[str, Any]) -> list[str]:
    """The report header's graph part (`BenchGraph.report()`) as printed lines."""
    if not graph:
        return []
    kind = "shipped" if graph.get("shipped") else "not a shipped file"
    overrides = graph.get("overrides") or []
    lines = [f"graph: {graph.get('file')} ({kind}), {len(overrides)} overrides"]
    lines += [f"  override: {line}" for line in overrides]
    return lines


# --- the command line ----------------------------------------------------------------------


def add_graph_options(p: argparse.ArgumentParser, default: str, *, lengths: bool) -> None:
    """The options that say which graph is measured and what is changed in it."""
    p.add_argument(
        "--pipeline",
        default=default,
        help=f"the graph file: a shipped name or a path (default {default}, as shipped)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="STAGE.KEY=VALUE",
        help="an engine argument of one stage (VALUE read as YAML), or KEY=VALUE for the "
        "whole graph; printed in the report as an override",
    )
    p.add_argument("--device", default=None, help="every stage on this device (an override)")
    p.add_argument("--model-path", default=None, help="every stage's checkpoint (an override)")
    if lengths:
        p.add_argument(
            "--think-tokens",
            type=int,
            default=None,
            help="the Thinker's reply, exactly this many tokens (random weights never stop)",
        )
        p.add_argument(
            "--speech-s",
            type=float,
            default=None,
            help="the Talker's speech, exactly this long (random weights never stop)",
        )


def graph_from_args(args: argparse.Namespace) -> BenchGraph:
    """`--pipeline` loaded, then each override of the command line applied and recorded."""
    graph = BenchGraph.load(args.pipeline)
    for stage in graph.stage_names():
        if args.model_path:
            graph.set_arg(stage, "model_path", args.model_path, f"--model-path {args.model_path}")
        if args.device:  # where the file names the device: the engine's, the placement's
            asked = f"--device {args.device}"
            named = "device" in graph.engine_args(stage)
            if named:
                graph.set_arg(stage, "device", args.device, asked)
            if "devices" in (graph.stage(stage).get("placement") or {}) or not named:
                graph.set_placement(stage, "devices", [args.device], asked)
    think = getattr(args, "think_tokens", None)
    if think is not None and (thinker := graph.stage_by_engine(".thinker")) is not None:
        for key in ("max_new_tokens", "min_new_tokens"):
            graph.set_arg(thinker, key, think, f"--think-tokens {think}")
    speech = getattr(args, "speech_s", None)
    if speech is not None and (talker := graph.stage_by_engine(".talker")) is not None:
        frames = round(speech * FRAME_RATE_HZ)
        for key in ("max_frames", "min_frames"):
            graph.set_arg(talker, key, frames, f"--speech-s {speech:g}")
    for setting in args.set:
        apply_setting(graph, setting)
    return graph


def apply_setting(graph: BenchGraph, setting: str) -> None:
    """One `--set`: `STAGE.KEY=VALUE` (an engine argument) or `KEY=VALUE` (the graph's)."""
    name, sep, raw = setting.partition("=")
    if not sep or not name:
        raise SystemExit(f"--set {setting}: write STAGE.KEY=VALUE or KEY=VALUE")
    value = yaml.safe_load(raw)
    stage, dot, key = name.partition(".")
    if not dot:
        graph.set_graph(name, value, f"--set {setting}")
        return
    if stage not in graph.stage_names():
        raise SystemExit(f"--set {setting}: {graph.source} has no stage {stage!r}")
    if key.startswith("placement."):
        graph.set_placement(stage, key.removeprefix("placement."), value, f"--set {setting}")
    else:
        graph.set_arg(stage, key, value, f"--set {setting}")
