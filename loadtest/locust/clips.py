"""A few answers' audio, kept for the quality figure: WAV files next to the samples.

`clip-<pid>-<n>.wav` (PCM16 mono at 24 kHz, as the WebSocket sends it) and a JSON line per
clip in `clips-<pid>.jsonl` with the protocol and the question the answer echoes.
"""

from __future__ import annotations

import json
import os
import wave
from pathlib import Path

import numpy as np

from ..voice_mic import RATE, Pcm


def write_clips(directory: Path, clips: list[tuple[str, str, bytes]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for n, (protocol, text, audio) in enumerate(clips):
        path = directory / f"clip-{os.getpid()}-{n}.wav"
        with wave.open(str(path), "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(RATE)
            out.writeframes(audio)
        lines.append(json.dumps({"protocol": protocol, "text": text, "wav": path.name}))
    if lines:
        (directory / f"clips-{os.getpid()}.jsonl").write_text("\n".join(lines) + "\n")


def read_clips(directory: Path) -> list[tuple[str, str, Pcm]]:
    """(protocol, reference text, PCM16 24 kHz) for every clip in `directory`."""
    out: list[tuple[str, str, Pcm]] = []
    for index in sorted(directory.glob("clips-*.jsonl")):
        for line in index.read_text().splitlines():
            entry = json.loads(line)
            with wave.open(str(directory / entry["wav"])) as reader:
                pcm = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2")
            out.append((entry["protocol"], entry["text"], pcm.astype(np.int16)))
    return out
