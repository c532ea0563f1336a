"""Whether the devices a graph file places its stages on exist on this host.

A graph file says which GPU each stage (each replica) runs on (`placement.devices`,
graph_config.py). A device that is not there would otherwise show up minutes later, as a
worker that fails to load its model and is restarted again and again; so `parley serve`
checks the graph's devices against the host's before Redis or any model starts, and stops
with the stage, the field and what the host has (exit status 2).

CUDA devices are counted by torch in a child process, and only when some stage names one
(the CPU-only cascade never pays for it); where torch or a driver is missing the count is 0.

`check_workers`: with `parley serve --workers N`, every server process builds the stages the
graph places in its own process; a GPU stage there would be loaded N times on the same GPU
(N times its weights and rows, N batchers that never batch together), so that is refused at
start. Stages placed in a worker are loaded once for all server processes, by a stage host
(`web/stage_hosts.py`), unless `--stage-hosts off`.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from .graph_config import GraphConfig, GraphConfigError

COUNT_TIMEOUT_S = 120.0
_COUNT = "import torch; print(torch.cuda.device_count())"


def cuda_device_count() -> int:
    """How many CUDA devices this host's stage processes will see (CUDA_VISIBLE_DEVICES
    applies). Asked of torch in a child process: the main process never loads torch (nor
    a CUDA context) for it. 0 where torch, a driver or a device is missing."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _COUNT],
            capture_output=True,
            text=True,
            timeout=COUNT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0
    lines = done.stdout.split()
    return int(lines[-1]) if done.returncode == 0 and lines and lines[-1].isdigit() else 0


def check_devices(
    config: GraphConfig,
    source: str,
    count: Callable[[], int] = cuda_device_count,
    only: str | None = None,
) -> None:
    """Raise GraphConfigError for the first stage placed on a CUDA device this host lacks.

    Remote stages are not checked: their devices are on the host that serves them, which
    checks its one stage (`only`) when `parley stage` starts there. `count`: the host's CUDA
    device count, asked once, and only if some stage names a CUDA device."""
    known: int | None = None
    for index, stage in enumerate(config.stages):
        checked_here = stage.placement.process != "remote" if only is None else stage.name == only
        if not checked_here:
            continue
        for slot, device in enumerate(stage.devices):
            if not device.startswith("cuda:"):
                continue
            if known is None:
                known = count()
            ordinal = int(device.removeprefix("cuda:"))
            if ordinal >= known:
                has = f"{known} CUDA device{'s' if known != 1 else ''}"
                if known:
                    has += f" (cuda:0 to cuda:{known - 1})"
                field = f"stages.{index}.{stage.devices_field}"
                if stage.devices_field == "placement.devices":
                    field += f".{slot}"
                raise GraphConfigError(
                    source,
                    None,
                    field,
                    f"stage {stage.name!r} is placed on {device}; this host has {has}",
                )


def check_workers(config: GraphConfig, source: str, workers: int, stage_hosts: bool) -> None:
    """Raise GraphConfigError for the first GPU stage that `workers` server processes would
    each load for themselves (see the module's docstring); nothing with one process."""
    if workers <= 1:
        return
    for index, stage in enumerate(config.stages):
        gpus = [device for device in stage.devices if device.startswith("cuda")]
        if not gpus or stage.placement.process == "remote":
            continue
        on = f"stage {stage.name!r} runs on {', '.join(gpus)}"
        if stage.placement.process == "main":
            raise GraphConfigError(
                source,
                None,
                f"stages.{index}.placement.process",
                f"{on} in the server process, so --workers {workers} would load it "
                f"{workers} times on the same GPU: place it in a worker "
                "(placement: {process: worker}; the server processes then share one copy "
                "through a stage host), or serve with --workers 1",
            )
        if not stage_hosts:
            raise GraphConfigError(
                source,
                None,
                f"stages.{index}.placement.process",
                f"{on} in a worker, and with --stage-hosts off each of the --workers "
                f"{workers} server processes would start its own: turn --stage-hosts on "
                "(one copy shared by every server process), or serve with --workers 1",
            )
