"""The real `vllm serve` these tests share (loadtest/vllm_server.py): started as the run
begins when any selected test uses it (tests/conftest.py, early_vllm.py), taken over by
the first test that asks for it, and stopped at the end of the run."""

from __future__ import annotations

import pytest

from loadtest.vllm_server import Vllm, VllmError

from .early_vllm import EARLY


@pytest.fixture(scope="session")
def vllm() -> Vllm:
    try:
        return EARLY.server()
    except VllmError as exc:
        pytest.fail(str(exc))
