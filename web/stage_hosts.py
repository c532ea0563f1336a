"""The stage hosts of `parley serve --workers N`: each worker-placed stage loaded once.

Without them, every server process would start its own worker for each such stage: N copies
of each model in memory, and N batchers that never batch together. The parent instead starts
one stage host per stage (`pipeline/stage_host.py`) before the server processes, on a unix
socket in a private directory, and hands every server process the sockets
(`--shared-stages`); each builds those stages as `SharedStageEngine`s. A stage with
replicas on several devices gets a host per replica, and each server process spreads its
sessions over them (`pipeline/replicas.py`). Stages in the main process or on another host
are unchanged.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.gpu_sharing import MpsDaemon
from pipeline.graph_config import load_graph
from pipeline.registry import graph_path, hosted_stages, worker_spec
from pipeline.stage_host import launch_args
from pipeline.worker_main import WorkerSpec

from .leftover_dirs import STAGES_PREFIX, sweep_stale_dirs, write_owner


@dataclass(frozen=True)
class HostedStage:
    spec: WorkerSpec
    path: str
    """The unix socket the host listens on."""
    log_level: str

    def command(self, ready_fd: int) -> list[str]:
        return launch_args(self.spec, self.path, ready_fd, self.log_level)


class StageHosts:
    """Which stages to host and where; a private directory for their sockets (removed by
    `close`, idempotent). `pipeline` None: none (`--stage-hosts off`). Where the graph file
    asks for `gpu_sharing: mps`, the MPS daemon the hosts share the GPU through is started
    here, before any host, and quit by `close`."""

    def __init__(self, pipeline: str | None, log_level: str = "info") -> None:
        self.stages: Sequence[HostedStage] = ()
        self._dir: str | None = None
        self.gpu: MpsDaemon | None = None
        if pipeline is None:
            return
        config = load_graph(graph_path(pipeline))
        names = hosted_stages(config)
        if not names:
            return
        sweep_stale_dirs(STAGES_PREFIX)  # what servers killed before their stop left
        self._dir = tempfile.mkdtemp(prefix=STAGES_PREFIX)  # mode 0700: ours alone
        write_owner(Path(self._dir))
        self.stages = [
            HostedStage(
                worker_spec(config, name, device),
                os.path.join(self._dir, f"{name}.{replica}.sock"),
                log_level,
            )
            for name in names
            for replica, device in enumerate(config.stage(name).devices)
        ]
        if config.gpu_sharing == "mps":
            self.gpu = MpsDaemon()
            try:
                self.gpu.start()
            except BaseException:
                self.close()
                raise

    def worker_option(self) -> list[str]:
        """What each server process is started with to use the hosts."""
        if not self.stages:
            return []
        sockets: dict[str, list[str]] = {}
        for stage in self.stages:  # a replicated stage's hosts in its devices' order
            sockets.setdefault(stage.spec.stage, []).append(stage.path)
        return ["--shared-stages", json.dumps(sockets)]

    def close(self) -> None:
        gpu, self.gpu = self.gpu, None
        if gpu is not None:
            gpu.close()
        directory, self._dir = self._dir, None
        if directory is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(directory)
