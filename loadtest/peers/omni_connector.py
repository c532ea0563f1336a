"""vLLM-Omni's shared-memory connector next to ours and the plain shared-memory floor.

One transfer = the thinker -> talker hand-off of Qwen2.5-Omni (hidden states 200 x 3584
float32, 2.87 MB, plus 200 prompt ids), and the talker -> code2wav one (600 codec ids), from
one process to a spawned one, one at a time; latency is send start -> payload rebuilt in the
other process (perf_counter_ns is CLOCK_MONOTONIC, the same clock in both).

- `omni`: vLLM-Omni 0.30.0's own `SharedMemoryConnector` (from PyPI, see omni_stub.py) on
  its orchestrator path: `put(from, to, key, payload)` in the producer (their msgpack
  serializer, a new shm segment per transfer, a lock file), the returned metadata over a
  `multiprocessing.Pipe`, `get(..., metadata=...)` in the consumer. The payload is the dict
  their Qwen2.5-Omni stage builders send (`hidden_states`/`ids`/`meta`, torch tensors).
- `parley`: our ShmLink (loadtest/connector_bench.py's `shm`);
- `floor`: one `np.copyto` into a preallocated segment plus a notice over a Pipe
  (connector_bench.py's `floor_xproc`): the least any cross-process transfer costs here;
- `copy`: that copy alone, in one process (`floor_shm_copy`), for reference: the plain
  shared-memory copy that vLLM-Omni's connector is often compared with.

    .venv/bin/python -m loadtest.peers.setup omni      # once
    .venv/bin/python -m loadtest.peers.omni_connector [--n 300] [--warmup 50]

Prints each path's p50 / p99 and p50 / floor (the cross-process floor), all from this run.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import secrets
import time
from typing import Any

import torch

from loadtest import connector_bench as ours
from loadtest.peers import omni_stub

STAGES = ("0", "1")


def omni_payload(name: str) -> dict[str, Any]:
    """The same arrays as connector_bench.payload(name), shaped as vLLM-Omni sends them."""
    chunk = ours.payload(name)
    if name == "t2t_hidden":
        return {
            "hidden_states": {"output": torch.from_numpy(chunk.array)},
            "ids": {"prompt": list(range(200)), "output": []},
            "meta": {"next_stage_prompt_len": 202},
        }
    return {"codes": {"audio": torch.from_numpy(chunk.codes)}, "meta": {"finished": True}}


def _omni_consumer(conn: Any) -> None:
    connector = omni_stub.install()({"stage_id": 1})
    while (message := conn.recv()) is not None:
        sent, key, metadata = message
        got = connector.get(*STAGES, key, metadata=metadata)
        done = time.perf_counter_ns()
        conn.send(done - sent if got is not None else -1)


def omni(name: str, n: int, warmup: int) -> tuple[float, float]:
    connector = omni_stub.install()({"stage_id": 0})
    data = omni_payload(name)
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_omni_consumer, args=(child,), daemon=True)
    process.start()
    samples = []
    try:
        for i in range(n + warmup):
            key = f"parley_bench_{secrets.token_hex(6)}"
            sent = time.perf_counter_ns()
            ok, _, metadata = connector.put(*STAGES, key, data)
            if not ok:
                raise RuntimeError("vLLM-Omni's put failed")
            parent.send((sent, key, metadata))
            latency = parent.recv()
            if latency < 0:
                raise RuntimeError("vLLM-Omni's get found nothing")
            if i >= warmup:
                samples.append(latency)
    finally:
        parent.send(None)
        process.join(10)
        connector.close()
    return ours._stats(samples)


async def run(n: int, warmup: int) -> list[dict[str, Any]]:
    rows = []
    for name in ours.PAYLOADS:
        chunk = ours.payload(name)
        floor = ours.floor_xproc(chunk, n, warmup)
        paths = {
            "copy": ours.floor_shm_copy(chunk, n, warmup),
            "floor": floor,
            "parley": await ours.shm(chunk, n, warmup),
            "omni": omni(name, n, warmup),
        }
        rows.extend(ours.result_rows(name, int(ours.bulk(chunk).nbytes), paths, floor[0]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description="vLLM-Omni's shm connector vs ours vs a copy")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--json", action="store_true", help="one JSON line instead of a table")
    args = parser.parse_args()
    ours.print_rows(asyncio.run(run(args.n, args.warmup)), args.json)


if __name__ == "__main__":
    main()
