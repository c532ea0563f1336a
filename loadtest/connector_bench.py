"""Benchmark: moving chunks between stages, in-process and across processes.

Payloads follow Qwen2.5-Omni's stage hand-offs: thinker -> talker hidden states
(200 x 3584 float32, 2.87 MB) and talker -> code2wav codec codes (600 int32). Each is sent
as the pipeline sends it: a `ChunkMessage(request_id, HiddenStates | CodecCodes)`.

Paths:
- `inprocess`: the in-process link (bounded channel, by reference);
- `shm`: the shared-memory link to a spawned process (one copy into the ring, the consumer
  gets views); latency is send start -> message rebuilt in the other process
  (CLOCK_MONOTONIC, same host), one transfer at a time;
- `floor_shm_copy`: one `np.copyto` of the same array into a preallocated shared-memory
  segment, in one process (the copy alone);
- `floor_xproc`: the cross-process floor: that copy, then a notice over a blocking
  `multiprocessing.Pipe` to a spawned process that wraps the segment as an array (no
  serialisation, no event loop): the least any cross-process transfer can cost here.

    .venv/bin/python -m loadtest.connector_bench [--n 1000] [--warmup 200]

Prints one line per payload and path: p50 / p99 in ms and the ratio to the cross-process
floor (`shm` against `floor_xproc` is the figure that matters).
vLLM-Omni's own connector is measured by ../shared/anchors/omni_shm_bench in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import time
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from pipeline.connectors.inprocess import InProcessLink
from pipeline.connectors.shm import RingSpec, ShmLink
from pipeline.link_messages import ChunkMessage
from pipeline.types import CodecCodes, HiddenStates

PAYLOADS = ("t2t_hidden", "t2v_codes")


def payload(name: str) -> Any:
    if name == "t2t_hidden":
        rng = np.random.default_rng(0)
        hidden = rng.random((200, 3584), dtype=np.float32)
        return HiddenStates(hidden, {"prompt_ids": list(range(200)), "finished": False})
    return CodecCodes(np.arange(600, dtype=np.int32), {"finished": True})


def bulk(chunk: Any) -> np.ndarray:
    return chunk.array if isinstance(chunk, HiddenStates) else chunk.codes


def _stats(samples_ns: list[int]) -> tuple[float, float]:
    ms = np.array(samples_ns) / 1e6
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def floor_shm_copy(chunk: Any, n: int, warmup: int) -> tuple[float, float]:
    array = bulk(chunk)
    shm = shared_memory.SharedMemory(create=True, size=array.nbytes)
    try:
        target = np.ndarray(array.shape, array.dtype, buffer=shm.buf)
        samples = []
        for i in range(n + warmup):
            t0 = time.perf_counter_ns()
            np.copyto(target, array)
            if i >= warmup:
                samples.append(time.perf_counter_ns() - t0)
        del target
        return _stats(samples)
    finally:
        shm.close()
        shm.unlink()


def _floor_consumer(conn: Any, name: str, shape: tuple[int, ...], dtype: str) -> None:
    shm = shared_memory.SharedMemory(name=name)
    try:
        while (sent := conn.recv()) is not None:
            view = np.ndarray(shape, np.dtype(dtype), buffer=shm.buf)
            received = time.perf_counter_ns()
            del view
            conn.send(received - sent)
    finally:
        shm.close()


def floor_xproc(chunk: Any, n: int, warmup: int) -> tuple[float, float]:
    array = bulk(chunk)
    shm = shared_memory.SharedMemory(create=True, size=max(1, array.nbytes))
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(
        target=_floor_consumer, args=(child, shm.name, array.shape, array.dtype.str), daemon=True
    )
    process.start()
    try:
        target = np.ndarray(array.shape, array.dtype, buffer=shm.buf)
        samples = []
        for i in range(n + warmup):
            sent = time.perf_counter_ns()
            np.copyto(target, array)
            parent.send(sent)
            latency = parent.recv()
            if i >= warmup:
                samples.append(latency)
        parent.send(None)
        process.join(5)
        del target
        return _stats(samples)
    finally:
        shm.close()
        shm.unlink()


async def inprocess(chunk: Any, n: int, warmup: int) -> tuple[float, float]:
    a, b = InProcessLink.pair()
    samples = []
    for i in range(n + warmup):
        t0 = time.perf_counter_ns()
        await a.send(ChunkMessage("resp_bench", chunk))
        await b.recv()
        if i >= warmup:
            samples.append(time.perf_counter_ns() - t0)
    return _stats(samples)


def _consumer(sock: socket.socket, rings: RingSpec) -> None:
    asyncio.run(_consume(sock, rings))


async def _consume(sock: socket.socket, rings: RingSpec) -> None:
    """Receive, stamp, drop the message (freeing the ring), acknowledge."""
    link = await ShmLink.attach(sock, rings)
    try:
        while True:
            message = await link.recv()
            if message == "stop":
                return
            received = time.perf_counter_ns()
            sent = int(message.request_id)  # the send time rides as the request id
            del message
            await link.send(received - sent)
    finally:
        await link.close()


async def shm(chunk: Any, n: int, warmup: int) -> tuple[float, float]:
    parent_sock, child_sock = socket.socketpair()
    out, back, rings = ShmLink.create_rings()
    process = multiprocessing.get_context("spawn").Process(
        target=_consumer, args=(child_sock, rings), daemon=True
    )
    process.start()
    child_sock.close()
    link = await ShmLink.open(parent_sock, out, back)
    samples = []
    try:
        for i in range(n + warmup):
            await link.send(ChunkMessage(str(time.perf_counter_ns()), chunk))
            latency = await link.recv()
            if i >= warmup:
                samples.append(latency)
        await link.send("stop")
    finally:
        await link.close()
        process.join(5)
    return _stats(samples)


async def run(n: int, warmup: int) -> list[dict[str, Any]]:
    rows = []
    for name in PAYLOADS:
        chunk = payload(name)
        floor = floor_xproc(chunk, n, warmup)
        results = {
            "floor_shm_copy": floor_shm_copy(chunk, n, warmup),
            "floor_xproc": floor,
            "inprocess": await inprocess(chunk, n, warmup),
            "shm": await shm(chunk, n, warmup),
        }
        rows.extend(result_rows(name, int(bulk(chunk).nbytes), results, floor[0]))
    return rows


Row = dict[str, Any]


def result_rows(
    payload: str, nbytes: int, results: dict[str, tuple[float, float]], floor_p50: float
) -> list[Row]:
    """One row per path: its p50 and p99 (ms) and its p50 over the floor's."""
    return [
        {
            "payload": payload,
            "bytes": nbytes,
            "path": path,
            "p50_ms": round(p50, 4),
            "p99_ms": round(p99, 4),
            "p50_vs_floor": round(p50 / floor_p50, 2),
        }
        for path, (p50, p99) in results.items()
    ]


def print_rows(rows: list[Row], json_line: bool) -> None:
    """The rows as one JSON line, or as a table."""
    if json_line:
        print(json.dumps(rows))
        return
    print(f"{'payload':12} {'bytes':>9} {'path':16} {'p50 ms':>9} {'p99 ms':>9} {'p50/floor':>10}")
    for r in rows:
        print(
            f"{r['payload']:12} {r['bytes']:>9} {r['path']:16} {r['p50_ms']:>9.4f} "
            f"{r['p99_ms']:>9.4f} {r['p50_vs_floor']:>10.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description="stage-to-stage transfer latency")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="one JSON line instead of a table")
    args = parser.parse_args()
    print_rows(asyncio.run(run(args.n, args.warmup)), args.json)


if __name__ == "__main__":
    main()
