"""Stage placement on devices: what a graph file may say, and devices this host lacks.

A GPU is never needed here: the device count is given, or is what this host has (0 on CI,
whose torch is the CPU build), and the real command is asked about a GPU index no host has.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.devices import check_devices, check_workers, cuda_device_count
from pipeline.graph_config import GraphConfigError, load_graph, parse_graph
from pipeline.registry import graph_path, worker_spec
from web.settings import parse_settings
from web.stage_hosts import StageHosts

PARLEY = str(Path(sys.executable).parent / "parley")

SPLIT = """\
name: split
stages:
  - name: thinker
    engine: "tests.fakes.stage_engines:WhereAmI"
    placement: {process: worker, devices: ["cuda:0"]}
  - name: talker
    engine: "tests.fakes.stage_engines:WhereAmI"
    placement: {process: worker, devices: ["cuda:1"]}
  - name: far
    engine: "tests.fakes.stage_engines:WhereAmI"
    placement: {process: remote, devices: ["cuda:5"]}
outputs: [thinker, talker, far]
"""


def test_each_stage_gets_its_device_as_its_engines_device() -> None:
    config = parse_graph(SPLIT)
    assert worker_spec(config, "thinker").engine_args == {"device": "cuda:0"}
    assert worker_spec(config, "talker").engine_args == {"device": "cuda:1"}
    cpu = parse_graph("name: c\nstages:\n  - {name: a, engine: echo}\noutputs: [a]\n")
    assert cpu.stage("a").devices == ("cpu",)
    assert worker_spec(cpu, "a").engine_args == {}  # a CPU engine takes no device


def test_the_shipped_two_gpu_graph_splits_the_thinker_from_the_talker() -> None:
    config = load_graph(graph_path("qwen3_omni_2gpu"))
    assert [s.devices for s in config.stages] == [("cuda:0",), ("cuda:1",), ("cuda:1",)]
    assert worker_spec(config, "talker").engine_args["device"] == "cuda:1"
    one = load_graph(graph_path("qwen3_omni"))
    assert [s.devices for s in one.stages] == [("cuda:0",)] * 3


def test_the_older_engine_args_device_still_places_a_stage() -> None:
    text = SPLIT.replace(
        'placement: {process: worker, devices: ["cuda:1"]}',
        'engine_args: {device: "cuda:1"}\n    placement: {process: worker}',
    )
    assert parse_graph(text).stage("talker").devices == ("cuda:1",)
    same = SPLIT.replace(
        'placement: {process: worker, devices: ["cuda:1"]}',
        'engine_args: {device: "cuda:1"}\n    placement: {process: worker, devices: ["cuda:1"]}',
    )
    assert parse_graph(same).stage("talker").devices == ("cuda:1",)


@pytest.mark.parametrize(
    ("placement", "line", "field", "message"),
    [
        (
            'engine_args: {device: "cuda:0"}\n'
            '    placement: {process: worker, devices: ["cuda:1"]}',
            8,
            "stages.1.engine_args.device",
            "'cuda:0' disagrees with placement.devices ['cuda:1']",
        ),
        (
            'placement: {process: worker, devices: ["gpu1"]}',
            8,
            "stages.1.placement.devices",
            "'gpu1' is not a device: cpu, or cuda:N",
        ),
        (
            "placement: {process: worker, devices: []}",
            8,
            "stages.1.placement.devices",
            "at least 1",
        ),
        (
            'placement: {process: remote, devices: ["cuda:0", "cuda:1"]}',
            8,
            "stages.1.placement.devices",
            "one host per replica",
        ),
    ],
)
def test_a_bad_placement_names_its_line_and_field(
    placement: str, line: int, field: str, message: str
) -> None:
    text = SPLIT.replace('placement: {process: worker, devices: ["cuda:1"]}', placement)
    with pytest.raises(GraphConfigError) as info:
        parse_graph(text, "g.yaml")
    assert str(info.value).startswith(f"g.yaml:{line}: {field}: "), str(info.value)
    assert message in str(info.value)


def test_a_device_this_host_lacks_is_named_with_what_the_host_has() -> None:
    config = parse_graph(SPLIT)
    check_devices(config, "g.yaml", count=lambda: 2)  # the remote stage's cuda:5 is its host's
    with pytest.raises(GraphConfigError) as info:
        check_devices(config, "g.yaml", count=lambda: 1)
    assert str(info.value) == (
        "g.yaml: stages.1.placement.devices.0: stage 'talker' is placed on cuda:1; "
        "this host has 1 CUDA device (cuda:0 to cuda:0)"
    )
    with pytest.raises(GraphConfigError, match="this host has 0 CUDA devices$"):
        check_devices(config, "g.yaml", count=lambda: 0)
    # `parley stage` serving the remote stage checks that one on its own host
    with pytest.raises(GraphConfigError, match="stage 'far' is placed on cuda:5"):
        check_devices(config, "g.yaml", count=lambda: 2, only="far")


def test_the_device_count_is_asked_only_when_a_stage_names_a_gpu() -> None:
    asked: list[int] = []

    def count() -> int:
        asked.append(1)
        return 0

    cpu = parse_graph("name: c\nstages:\n  - {name: a, engine: echo}\noutputs: [a]\n")
    check_devices(cpu, "c.yaml", count=count)
    assert asked == []
    assert cuda_device_count() >= 0


def test_serve_on_a_gpu_this_host_lacks_exits_2_before_anything_starts(tmp_path: Path) -> None:
    graph = tmp_path / "gpus.yaml"
    graph.write_text(
        SPLIT.replace('devices: ["cuda:0"]', "devices: [cpu]").replace("cuda:1", "cuda:63")
    )
    result = subprocess.run(
        [PARLEY, "serve", "--port", "0", "--pipeline", str(graph)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "stage 'talker' is placed on cuda:63; this host has" in result.stderr
    assert "Parley is" not in result.stdout


def test_a_replicated_stage_gets_a_stage_host_per_replica(tmp_path: Path) -> None:
    graph = tmp_path / "replicas.yaml"
    graph.write_text(
        SPLIT.replace('devices: ["cuda:0"]', 'devices: ["cuda:0", "cuda:1"]')
        .replace(
            "  - name: far\n"
            '    engine: "tests.fakes.stage_engines:WhereAmI"\n'
            '    placement: {process: remote, devices: ["cuda:5"]}\n',
            "",
        )
        .replace("outputs: [thinker, talker, far]", "outputs: [thinker, talker]")
    )
    hosts = StageHosts(str(graph))
    try:
        specs = [(h.spec.stage, h.spec.engine_args["device"]) for h in hosts.stages]
        assert specs == [("thinker", "cuda:0"), ("thinker", "cuda:1"), ("talker", "cuda:1")]
        option = hosts.worker_option()
        sockets = json.loads(option[1])
        assert [len(sockets["thinker"]), len(sockets["talker"])] == [2, 1]
        _, settings = parse_settings(["serve", *option])
        shared = dict(settings.shared_stages)
        assert shared["thinker"] == tuple(sockets["thinker"])
        assert shared["talker"] == tuple(sockets["talker"])
    finally:
        hosts.close()
    _, older = parse_settings(["serve", "--shared-stages", json.dumps({"a": "/tmp/a.sock"})])
    assert dict(older.shared_stages) == {"a": ("/tmp/a.sock",)}


def test_workers_refuse_a_gpu_stage_each_server_process_would_load_for_itself() -> None:
    split = parse_graph(SPLIT)
    check_workers(split, "split.yaml", 4, stage_hosts=True)  # worker stages: hosted once
    check_workers(parse_graph(SPLIT.replace("process: worker", "process: main")), "x", 1, True)
    in_main = parse_graph(SPLIT.replace('process: worker, devices: ["cuda:1"]', "process: main"))
    check_workers(in_main, "x", 4, True)  # the CPU is no GPU to share
    on_gpu = parse_graph(
        SPLIT.replace(
            '{process: worker, devices: ["cuda:1"]}', ('{process: main, devices: ["cuda:1"]}')
        )
    )
    with pytest.raises(GraphConfigError) as refused:
        check_workers(on_gpu, "split.yaml", 4, True)
    assert str(refused.value).startswith("split.yaml: stages.1.placement.process: stage 'talker'")
    assert "--workers 4 would load it 4 times on the same GPU" in str(refused.value)
    assert "place it in a worker" in str(refused.value) and "--workers 1" in str(refused.value)
    with pytest.raises(GraphConfigError, match="stages.0.placement.process: .*--stage-hosts on"):
        check_workers(split, "split.yaml", 2, stage_hosts=False)


def test_serve_with_workers_and_a_gpu_stage_in_the_server_exits_2_naming_it(
    tmp_path: Path,
) -> None:
    graph = tmp_path / "moshi_like.yaml"
    graph.write_text(
        "name: m\nstages:\n  - name: moshi\n    engine: echo\n"
        '    placement: {process: main, devices: ["cuda:0"]}\noutputs: [moshi]\n'
    )
    result = subprocess.run(
        [PARLEY, "serve", "--port", "0", "--workers", "2", "--pipeline", str(graph)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert f"{graph}: stages.0.placement.process: stage 'moshi' runs on cuda:0" in result.stderr
    assert "Parley is" not in result.stdout
