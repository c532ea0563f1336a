"""What the served tests of the Thinker on a model server share: the `vllm` graph pointed
at a server, spoken questions into an SDK Realtime connection, waiting for an event."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from loadtest.speech import silence, speak, trim_silence
from pipeline.registry import CONFIGS

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


VOICE_HANG_S = 30.0
"""How long one Piper clause may take before its worker counts as hung, in these tests: the
shipped 5 s (a clause takes ~60 ms) is a bound for a host whose model server has its own
cores. Here vLLM's CPU engine, Whisper, Piper, Redis and the test's own clients share two,
and on a loaded CI machine one clause once waited 5.4 s for a core: the worker was killed
as hung and the answer failed (`model_error`), which is the contract, not what these tests
are about. A host that runs its model server on its CPU sets its own `hang_s` the same way."""


def graph_for(directory: Path, **engine_args: Any) -> str:
    """The shipped `vllm` graph with its Thinker's `engine_args` changed (url, model...),
    and Piper's stage allowed `VOICE_HANG_S` a clause (see there)."""
    config = yaml.safe_load((CONFIGS / "vllm.yaml").read_text())
    config["stages"][0]["engine_args"].update(engine_args)
    for stage in config["stages"]:
        if stage["name"] == "code2wav":
            stage["hang_s"] = VOICE_HANG_S
    path = directory / "my_vllm.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


async def until(conn: Any, kind: str, within_s: float = 90) -> Any:
    """The next event of `kind` (those before it are skipped)."""
    async with asyncio.timeout(within_s):
        async for event in conn:
            if event.type == kind:
                return event
    raise AssertionError(f"the connection ended before {kind}")


async def say(conn: Any, text: str) -> None:
    """`text` spoken (espeak-ng), with a pause after it, appended at once at 24 kHz."""
    pcm = np.concatenate(
        [silence(300, 24_000), trim_silence(speak(text, rate=24_000)), silence(900, 24_000)]
    )
    raw = pcm.astype("<i2").tobytes()
    for begin in range(0, len(raw), 4800):
        chunk = base64.b64encode(raw[begin : begin + 4800]).decode()
        await conn.input_audio_buffer.append(audio=chunk)
