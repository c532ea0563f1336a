"""Benchmark: the Talker's prompt states across one worker link, by conversation length.

Qwen3-Omni's Talker takes the whole conversation's user items as its prompt and keeps no KV
between turns, so every turn the Thinker's prompt hidden states (two layers, 2,048 wide)
cross a worker link to the server and another on to the Talker's worker. This times one
hop (`ShmLink` over a socketpair, both ends in this process: no spawn, the link's own
copies), as float32 and as bfloat16 bits (what a bfloat16 Thinker sends,
`pipeline/engines/qwen3_omni/host_states.py`), median of `--reps` sends:

    .venv/bin/python -m loadtest.prompt_states_bench [--positions 600,2000,3800,8000]

What a buffer costs depends on where it goes: within the link's 16 MiB ring, one copy; past
the ring's room, a one-off shared-memory block (`pipeline/connectors/shm.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import time

import numpy as np

from pipeline.connectors.shm import ShmLink
from pipeline.types import HiddenStates

WIDTH = 2048
"""Qwen3-Omni 30B-A3B's Thinker hidden size."""


async def hop_ms(positions: int, dtype: type[np.generic], reps: int) -> float:
    """Median milliseconds for one prompt's states to cross one link and be read."""
    a, b = socket.socketpair()
    out, back, spec = ShmLink.create_rings()
    left = await ShmLink.open(a, out, back)
    right = await ShmLink.attach(b, spec)
    states = np.ones((positions, 2, WIDTH), dtype=dtype)
    times = []
    try:
        for _ in range(reps):
            chunk = HiddenStates(array=states, metadata={"part": "prompt"})
            start = time.perf_counter()
            _, got = await asyncio.gather(left.send(chunk), right.recv())
            np.asarray(got.array).sum()  # read it, as the Talker's copy to its device does
            times.append((time.perf_counter() - start) * 1e3)
            del got
    finally:
        await left.close()
        await right.close()
    return statistics.median(times)


async def run(positions: list[int], reps: int) -> list[dict[str, float]]:
    rows = []
    for count in positions:
        row: dict[str, float] = {"positions": count}
        for name, dtype in (("float32", np.float32), ("bf16_bits", np.uint16)):
            row[f"{name}_mib"] = count * 2 * WIDTH * np.dtype(dtype).itemsize / 2**20
            row[f"{name}_ms"] = await hop_ms(count, dtype, reps)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", default="600,2000,3800,8000")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="one JSON line")
    args = parser.parse_args(argv)
    positions = [int(p) for p in args.positions.split(",") if p]
    rows = asyncio.run(run(positions, args.reps))
    if args.json:
        print(json.dumps(rows))
        return 0
    print("positions   float32: MiB    ms   bf16 bits: MiB    ms")
    for row in rows:
        print(
            f"{row['positions']:9.0f} {row['float32_mib']:14.1f} {row['float32_ms']:6.1f}"
            f" {row['bf16_bits_mib']:16.1f} {row['bf16_bits_ms']:6.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
