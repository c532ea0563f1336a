"""FastRTC 0.0.34 bot: `ReplyOnPause` (FastRTC's Silero VAD and pause detection at their
defaults, interruptible) answering every turn with the fixed reply (reply.py), served by
FastRTC's own FastAPI mount (`POST /webrtc/offer`).

FastRTC fetches its Silero model from a model hub on first use; the bot points FastRTC's
loader at the copy that `python -m loadtest.peers.setup fastrtc` unpacked from a PyPI wheel.

    ~/.cache/parley/peers/fastrtc/bin/python -m loadtest.peers.bots.fastrtc_bot
Env: PORT, PROBE_PORT (probe.py), REPLY_S, PEERS_HOME.
"""

# mypy: allow-subclassing-any, allow-untyped-decorators
# The framework lives in its own venv: mypy may or may not find it where it runs.

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import uvicorn  # type: ignore[import-not-found, unused-ignore]
from fastapi import FastAPI  # type: ignore[import-not-found, unused-ignore]
from fastrtc import ReplyOnPause, Stream  # type: ignore[import-not-found, unused-ignore]
from fastrtc.pause_detection import silero  # type: ignore[import-not-found, unused-ignore]

from loadtest.peers import probe  # loopback ICE and the frame clock
from loadtest.peers.bots.reply import RATE, pieces, reply_seconds, sweep

HOME = Path(os.environ.get("PEERS_HOME", Path.home() / ".cache" / "parley" / "peers"))
VAD = HOME / "models" / "silero_vad_v4.onnx"
if not VAD.exists():
    raise SystemExit(f"{VAD} is missing: run python -m loadtest.peers.setup fastrtc")
silero.SileroVADModel.download_model = staticmethod(lambda: str(VAD))

PIECES = pieces(sweep(reply_seconds()))


def answer(turn: tuple[int, npt.NDArray[np.int16]]) -> Iterator[tuple[int, npt.NDArray[np.int16]]]:
    for piece in PIECES:
        yield RATE, piece.reshape(1, -1)


def app() -> FastAPI:
    stream = Stream(
        handler=ReplyOnPause(answer, can_interrupt=True, output_sample_rate=RATE),
        modality="audio",
        mode="send-receive",
        concurrency_limit=1000,
        server_rtc_configuration={"iceServers": []},
    )
    served = FastAPI()
    stream.mount(served)
    return served


if __name__ == "__main__":
    probe.install_from_env()
    uvicorn.run(app(), host="127.0.0.1", port=int(os.environ["PORT"]), log_level="warning")
