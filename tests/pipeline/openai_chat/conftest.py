"""The real `vllm serve` these tests share (loadtest/vllm_server.py), started at the first
test that asks for it and stopped at the end of the run."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from loadtest.vllm_server import Vllm, VllmError, start, stop


@pytest.fixture(scope="session")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vllm]:
    workdir = tmp_path_factory.mktemp("vllm")
    try:
        server = start(workdir)
    except VllmError as exc:
        pytest.fail(str(exc))
    try:
        yield server
    finally:
        stop(server)
        shutil.rmtree(workdir, ignore_errors=True)
