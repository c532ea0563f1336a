"""The users' speech, synthesised by Piper in a child process and cached in a file.

Piper runs on onnxruntime, whose thread pool must never live in a Locust process: with
`--processes` Locust forks its workers after importing the Locust file, each child inherits
the pool without its threads, and hangs at exit joining them. So the speech is made by
`python -m loadtest.locust.speech_cache` once (the same text gives the same file, in the
temporary folder) and the Locust processes only read the arrays.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ..voice_mic import Pcm

SYNTH_TIMEOUT_S = 180.0


def _path(texts: tuple[str, ...]) -> Path:
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"parley-locust-speech-{digest}.npz"


def cached_speech(*texts: str) -> list[Pcm]:
    """Each text spoken by Piper's joe voice at 24 kHz, trimmed (loadtest.voice_mic.spoken)."""
    path = _path(texts)
    if not path.exists():
        cmd = [sys.executable, "-m", "loadtest.locust.speech_cache", str(path), *texts]
        subprocess.run(cmd, check=True, timeout=SYNTH_TIMEOUT_S)
    with np.load(path) as data:
        return [np.asarray(data[f"t{i}"], dtype=np.int16) for i in range(len(texts))]


def main() -> None:
    from ..voice_mic import spoken

    path, texts = Path(sys.argv[1]), sys.argv[2:]
    arrays = {f"t{i}": np.asarray(spoken(text)) for i, text in enumerate(texts)}
    partial = path.with_suffix(f".{os.getpid()}.npz")
    np.savez(partial, **arrays)  # type: ignore[arg-type]
    os.replace(partial, path)  # whole or absent, even with several processes at once


if __name__ == "__main__":
    main()
