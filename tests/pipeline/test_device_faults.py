"""Sticky device errors: which errors leave a process's CUDA context unusable, and a stage
whose engine meets one ends its process, which is started again.

Real sticky errors need a GPU: here the model thread's test hook (`INJECT_ENV`) raises the
message a device-side assert gives, in a worker process running `tests.fakes.stage_engines:
Breaking` (steps on a real `ModelThread`)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.device_faults import (
    INJECT_ENV,
    DeviceLost,
    InjectedDeviceFault,
    injected_fault,
    sticky_reason,
)
from pipeline.graph import StageGraph
from pipeline.graph_config import parse_graph
from pipeline.registry import build_engines
from pipeline.types import End, ErrorChunk, PipelineRequest
from pipeline.worker import WorkerEngine
from pipeline.worker_main import BROKEN_EXIT

STICKY = [
    "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be ...",
    "CUDA error: device-side assert triggered",
    "CUDA error: unspecified launch failure",
    "CUDA error: uncorrectable ECC error encountered",
    "CUDA error: misaligned address",
]
NOT_STICKY = [
    "CUDA out of memory. Tried to allocate 2.00 GiB",
    "The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 1",
    "Expected all tensors to be on the same device",
]


@pytest.mark.parametrize("message", STICKY)
def test_the_errors_that_leave_the_context_failed_are_sticky(message: str) -> None:
    reason = sticky_reason(RuntimeError(message))
    assert reason is not None and reason.startswith("RuntimeError: CUDA error: ")
    assert "\n" not in reason


@pytest.mark.parametrize("message", NOT_STICKY)
def test_an_error_of_one_call_is_not_sticky(message: str) -> None:
    assert sticky_reason(RuntimeError(message)) is None


def test_a_wrapped_sticky_error_is_found_and_other_types_are_not_read() -> None:
    outer = ValueError("the Talker's step failed")
    outer.__cause__ = RuntimeError("CUDA error: device-side assert triggered")
    assert sticky_reason(outer) == "RuntimeError: CUDA error: device-side assert triggered"
    assert sticky_reason(ValueError("an illegal memory access was encountered")) is None
    assert sticky_reason(DeviceLost("the device failed earlier (illegal memory access)")) is None


def test_the_hook_fires_once_for_the_thread_its_file_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert injected_fault("parley-x") is None  # unset: nothing checked
    flag = tmp_path / "fault"
    monkeypatch.setenv(INJECT_ENV, str(flag))
    assert injected_fault("parley-x") is None  # no file yet
    flag.write_text("talker")
    assert injected_fault("parley-qwen3_omni.thinker") is None
    fault = injected_fault("parley-qwen3_omni.talker")
    assert isinstance(fault, InjectedDeviceFault) and sticky_reason(fault) is not None
    assert not flag.exists() and injected_fault("parley-qwen3_omni.talker") is None


GRAPH = """\
name: breaks
stages:
  - name: thinker
    engine: "tests.fakes.stage_engines:Breaking"
    engine_args: {count: 10, step_s: 0.01}
    placement: {process: worker}
outputs: [thinker]
"""


def request(rid: str) -> PipelineRequest:
    return PipelineRequest(request_id=rid, audio=np.zeros(1600, dtype=np.int16))


async def test_a_sticky_error_ends_the_worker_and_a_new_one_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = tmp_path / "fault"
    monkeypatch.setenv(INJECT_ENV, str(flag))  # the worker inherits it
    config = parse_graph(GRAPH)
    graph = StageGraph(config, build_engines(config))
    await graph.start()
    try:
        worker = graph.engines["thinker"]
        assert isinstance(worker, WorkerEngine)
        old_pid = worker.pid
        first = [chunk async for chunk in graph.generate(request("resp_1"))]
        assert isinstance(first[-1], End)
        flag.write_text("breaking")
        hit = time.monotonic()
        failed = [chunk async for chunk in graph.generate(request("resp_2"))]
        error = failed[-1]
        assert isinstance(error, ErrorChunk) and error.code == "model_error"
        assert "device-side assert triggered" in error.message
        async with asyncio.timeout(5):  # told within a heartbeat, not a hang bound
            while "thinker" not in graph.stalled_stages():
                await asyncio.sleep(0.02)
        assert "device-side assert" in graph.stalled_stages()["thinker"]
        down = [chunk async for chunk in graph.generate(request("resp_down"))]
        assert isinstance(down[-1], ErrorChunk) and down[-1].code == "model_error"
        async with asyncio.timeout(30):
            while worker.pid in (None, old_pid) or graph.stalled_stages():
                await asyncio.sleep(0.05)
        back = time.monotonic() - hit
        assert worker.last_exit == BROKEN_EXIT  # it exited by itself: not killed
        assert old_pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(old_pid, 0)
        again = [chunk async for chunk in graph.generate(request("resp_3"))]
        assert isinstance(again[-1], End)
        print(f"sticky error: served again {back:.2f} s after it")
    finally:
        await graph.close()
