"""Churn: hundreds of short sessions one after another, and what the server holds afterwards.

Each session is what a real client does, briefly: an OpenAI Realtime WebSocket session asks
one question and closes; a video chat stream sends a frame and a question and closes; a
WebRTC call connects, hears `session.created` and hangs up. A server that leaks grows in
file descriptors, threads or memory with every session; one that does not comes back to its
baseline once the sessions are gone.

    .venv/bin/python -m loadtest.churn [--websocket 300] [--video 100] [--webrtc 30] [--rounds 3]

runs `parley serve --pipeline echo` as a child process and prints its resources after a
warm-up and after each round of churn: a leak grows round after round, a warm-up does not.
The test suite runs the same clients against an in-process server (tests/web/test_churn.py),
where it also counts asyncio tasks and Redis keys.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from PIL import Image
from websockets.asyncio.client import connect

from .webrtc_client import Caller

STEP_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True)
class Resources:
    fds: int
    threads: int
    rss_mb: float

    @classmethod
    def of(cls, pid: int | str = "self") -> Resources:
        proc = Path(f"/proc/{pid}")
        rss_kb = next(
            int(line.split()[1])
            for line in (proc / "status").read_text().splitlines()
            if line.startswith("VmRSS:")
        )
        return cls(
            len(list((proc / "fd").iterdir())), len(list((proc / "task").iterdir())), rss_kb / 1024
        )

    def __str__(self) -> str:
        return f"fds {self.fds:4d}  threads {self.threads:3d}  RSS {self.rss_mb:7.1f} MB"


def _tone(seconds: float, rate: int = 24_000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return (np.sin(2 * np.pi * 220 * t) * 8000).astype("<i2").tobytes()


def _jpeg() -> str:
    out = io.BytesIO()
    Image.new("RGB", (32, 32), (40, 90, 160)).save(out, "JPEG")
    return base64.b64encode(out.getvalue()).decode()


AUDIO = base64.b64encode(_tone(0.5)).decode()
FRAME = _jpeg()


async def _until(ws: object, wanted: str) -> None:
    assert hasattr(ws, "recv")
    while True:
        event = json.loads(await ws.recv())
        if event["type"] == "error":
            raise RuntimeError(f"server error: {event}")
        if event["type"] == wanted:
            return


async def websocket_session(ws_base: str) -> None:
    """One OpenAI Realtime session: a manual turn answered, then a clean close."""
    async with connect(f"{ws_base}/v1/realtime?model=parley") as ws:
        await _until(ws, "session.created")
        update = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
        await ws.send(json.dumps({"type": "session.update", "session": update}))
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": AUDIO}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        await ws.send(json.dumps({"type": "response.create"}))
        await _until(ws, "response.done")


async def video_session(ws_base: str) -> None:
    """One video chat stream: a frame and a typed question answered, then a clean close."""
    async with connect(f"{ws_base}/v1/video/chat/stream") as ws:
        await ws.send(json.dumps({"type": "session.config"}))
        await ws.send(json.dumps({"type": "video.frame", "data": FRAME}))
        await ws.send(json.dumps({"type": "video.query", "text": "Hello"}))
        await _until(ws, "response.text.done")


async def webrtc_call(http_base: str) -> None:
    """One WebRTC call: connected, greeted with session.created, hung up."""
    async with httpx.AsyncClient(base_url=http_base) as http:
        caller = Caller(http)
        try:
            response = await caller.connect()
            if response.status_code != 201:
                raise RuntimeError(f"call refused: {response.status_code} {response.text}")
            await caller.wait_for(lambda e: e["type"] == "session.created", STEP_TIMEOUT_S)
            await http.post(f"/v1/realtime/calls/{caller.call_id}/hangup")
        finally:
            await caller.close()


async def run_many(
    session: Callable[[str], Awaitable[None]], base: str, count: int, concurrency: int
) -> None:
    """`count` sessions, at most `concurrency` at a time; the first failure ends the run."""
    limit = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with limit, asyncio.timeout(STEP_TIMEOUT_S):
            await session(base)

    async with asyncio.TaskGroup() as group:
        for _ in range(count):
            group.create_task(one())


async def churn(http_base: str, websocket: int, video: int, webrtc: int, concurrency: int) -> None:
    ws_base = "ws" + http_base.removeprefix("http")
    await run_many(websocket_session, ws_base, websocket, concurrency)
    await run_many(video_session, ws_base, video, concurrency)
    await run_many(webrtc_call, http_base, webrtc, concurrency)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _wait_ready(base: str) -> None:
    async with httpx.AsyncClient(base_url=base) as http, asyncio.timeout(120):
        while True:
            try:
                if (await http.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)


async def _sessions(base: str) -> int:
    async with httpx.AsyncClient(base_url=base) as http:
        return int((await http.get("/readyz")).json()["sessions"])


async def main_async(args: argparse.Namespace) -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(  # noqa: ASYNC220 - started once, before any session
        [str(Path(sys.executable).parent / "parley"), "serve", "--pipeline", "echo"]
        + ["--port", str(port), "--log-level", "warning"],
    )
    try:
        await _wait_ready(base)
        await churn(base, 8, 4, 2, args.concurrency)  # warm-up: imports, pools, caches
        await asyncio.sleep(1.0)
        before = Resources.of(server.pid)
        total = args.websocket + args.video + args.webrtc
        print(f"churn: {args.rounds} rounds of {total} sessions ({args.concurrency} at a time)")
        print(f"  after warm-up  {before}")
        for round_ in range(1, args.rounds + 1):
            started = time.monotonic()
            await churn(base, args.websocket, args.video, args.webrtc, args.concurrency)
            took = time.monotonic() - started
            await asyncio.sleep(args.settle_s)
            after = Resources.of(server.pid)
            print(
                f"  round {round_:<2} {after}  ({after.rss_mb - before.rss_mb:+.1f} MB)"
                f"   live sessions {await _sessions(base)}   {took:.1f} s"
            )
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description="session churn against parley serve (echo)")
    parser.add_argument("--websocket", type=int, default=300)
    parser.add_argument("--video", type=int, default=100)
    parser.add_argument("--webrtc", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle-s", type=float, default=3.0)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
