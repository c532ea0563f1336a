"""`vllm serve` started as the run begins, in a thread, when any selected test uses it.

vLLM's CPU build takes 35-45 s to serve on two cores. Started at the first test that asks
for it, the run waited that long; started when collection has finished, it comes up while
the tests before the vLLM ones run, and the `vllm` fixture takes it over (waiting only for
what is left of its start). The run stops it at its end, used or not, and removes its
working directory.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from loadtest.vllm_server import Vllm, start, stop

FIXTURE = "vllm"


class EarlyVllm:
    """One `vllm serve`, starting in a thread of its own from `begin()` on."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._starting: Future[Vllm] | None = None
        self._workdir: Path | None = None

    def begin(self) -> None:
        if self._starting is not None:
            return
        self._workdir = Path(tempfile.mkdtemp(prefix="parley-test-vllm-"))
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="early-vllm")
        self._starting = self._pool.submit(start, self._workdir)

    def server(self) -> Vllm:
        """The server, once it serves (VllmError if it cannot); started now if it was not."""
        self.begin()
        assert self._starting is not None
        return self._starting.result()

    def end(self) -> None:
        """Stop the server (waiting for its start to finish first). Idempotent."""
        starting, self._starting = self._starting, None
        if starting is not None:
            with contextlib.suppress(Exception):  # one that never came up: nothing to stop
                stop(starting.result())
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None


EARLY = EarlyVllm()
