"""Churn mode: hundreds of short sessions one after another, then what the server still holds.

The sessions are loadtest.churn's (a WebSocket question, a video stream frame and question, a
WebRTC call that connects and hangs up), `--churn-concurrency` at a time, in rounds. After the
warm-up and after each round: the server's fds, threads and RSS, and its Redis keys (counted
and named) on the run's own Redis. A leak grows round after round; a warm-up does not, so
"flat" compares the last round with the first (RSS within 5 %), and no keys may be left.
The server's asyncio tasks are not exposed; tests/web/test_churn.py counts them in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from ..churn import churn
from .target import redis_key_names, redis_keys, resources


def churn_mode(args: argparse.Namespace, url: str, pid: int, redis_url: str) -> dict[str, Any]:
    """`--churn-rounds` rounds of short sessions one after another (loadtest.churn's clients),
    the server's resources and Redis keys after the warm-up and after each round: a leak
    grows round after round, a warm-up does not."""
    ws, video, webrtc = args.churn, max(1, args.churn // 3), max(1, args.churn // 10)
    asyncio.run(churn(url, 8, 4, 2, 4))  # warm-up: imports, pools, caches
    time.sleep(1.0)
    before = {**resources(pid), "redis_keys": redis_keys(redis_url)}
    names_before = redis_key_names(redis_url)
    rounds = []
    for _ in range(args.churn_rounds):
        started = time.monotonic()
        asyncio.run(churn(url, ws, video, webrtc, args.churn_concurrency))
        took = time.monotonic() - started
        time.sleep(3.0)
        rounds.append({**resources(pid), "redis_keys": redis_keys(redis_url), "s": round(took, 1)})
    first, last = rounds[0], rounds[-1]
    growth = 100 * (last["rss_mb"] - before["rss_mb"]) / before["rss_mb"]
    leak = 100 * (last["rss_mb"] - first["rss_mb"]) / first["rss_mb"]
    return {
        "sessions_per_round": {"websocket": ws, "video": video, "webrtc": webrtc},
        "concurrency": args.churn_concurrency,
        "before": before,
        "rounds": rounds,
        "rss_growth_pct": round(growth, 2),
        "rss_growth_after_first_round_pct": round(leak, 2),
        "flat": abs(leak) <= 5.0
        and last["redis_keys"] <= before["redis_keys"]
        and last["fds"] <= first["fds"]
        and last["threads"] <= first["threads"] + 2,
        "redis_key_names": {"before": names_before, "after": redis_key_names(redis_url)},
        "tasks": "not exposed by the server (tests/web/test_churn.py counts them in-process)",
    }
