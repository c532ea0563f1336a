"""Install each peer into a venv of its own, from PyPI only, with pinned versions.

The peers (FastRTC, Pipecat) pull in dependencies that clash with ours (gradio, another
fastapi), so each gets its own venv under `PEERS_HOME` (default `~/.cache/parley/peers`);
Parley itself runs from this checkout's `.venv`. FastRTC's Silero VAD would be fetched
from a model hub when the bot starts; instead the same model (Silero v4 ONNX, the h/c
interface FastRTC expects) is unpacked here from a PyPI wheel that ships it, so nothing
is downloaded at run time.

    .venv/bin/python -m loadtest.peers.setup [fastrtc] [pipecat] [omni] [--fresh] [--freeze]

`omni` is vLLM-Omni's connector for loadtest.peers.omni_connector (see omni_stub.py).

`--freeze` writes `requirements/<peer>.lock` (pip freeze) after installing; an existing
lock is used as constraints, so a rebuild gets the measured versions.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS = ("fastrtc", "pipecat")
TARGETS = (*PEERS, "omni")
VAD_WHEEL = "faster-whisper==1.0.2"
VAD_MEMBER = "faster_whisper/assets/silero_vad.onnx"
VAD_SHA256 = "591f853590d11ddde2f2a54f9e7ccecb2533a8af7716330e8adfa6f3849787a9"


def home() -> Path:
    default = Path.home() / ".cache" / "parley" / "peers"
    return Path(os.environ.get("PEERS_HOME", default))


def venv_python(peer: str) -> Path:
    return home() / peer / "bin" / "python"


def vad_model() -> Path:
    return home() / "models" / "silero_vad_v4.onnx"


def build_venv(peer: str, fresh: bool, freeze: bool) -> None:
    where = home() / peer
    if fresh and where.exists():
        shutil.rmtree(where)
    if not venv_python(peer).exists():
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(where)], check=True)
    requirements = HERE / "requirements" / f"{peer}.txt"
    lock = HERE / "requirements" / f"{peer}.lock"
    cmd = [str(venv_python(peer)), "-m", "pip", "install", "--quiet", "-r", str(requirements)]
    if lock.exists() and not freeze:
        cmd += ["-c", str(lock)]
    print(f"setup: installing {peer} into {where}", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)
    if freeze:
        frozen = subprocess.run(
            [str(venv_python(peer)), "-m", "pip", "freeze"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        header = f"# pip freeze of the {peer} venv built by loadtest.peers.setup --freeze\n"
        lock.write_text(header + frozen)


def install_omni() -> None:
    """vLLM-Omni and what its connector imports, with no dependencies, into one folder
    that omni_stub.py puts on sys.path (Parley's venv supplies numpy and torch)."""
    requirements = HERE / "requirements" / "omni.txt"
    print(f"setup: installing omni into {home() / 'omni'}", file=sys.stderr, flush=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade"]
        + ["--target", str(home() / "omni"), "-r", str(requirements)],
        check=True,
    )


def fetch_vad() -> None:
    """Unpack Silero VAD v4 from the faster-whisper 1.0.2 wheel (PyPI), checked by sha256."""
    target = vad_model()
    if target.exists() and _sha256(target) == VAD_SHA256:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
            + ["--only-binary", ":all:", VAD_WHEEL, "-d", tmp],
            check=True,
        )
        wheel = next(Path(tmp).glob("faster_whisper-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            target.write_bytes(archive.read(VAD_MEMBER))
    if _sha256(target) != VAD_SHA256:
        target.unlink()
        raise SystemExit(f"setup: {VAD_MEMBER} from {VAD_WHEEL} has an unexpected sha256")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description="install the peers' venvs from PyPI")
    parser.add_argument("peers", nargs="*", help="fastrtc, pipecat, omni (default: all)")
    parser.add_argument("--fresh", action="store_true", help="rebuild the venvs from scratch")
    parser.add_argument("--freeze", action="store_true", help="write requirements/<peer>.lock")
    args = parser.parse_args()
    unknown = set(args.peers) - set(TARGETS)
    if unknown:
        parser.error(f"unknown peer(s): {', '.join(sorted(unknown))}")
    chosen = args.peers or TARGETS
    for peer in chosen:
        if peer == "omni":
            install_omni()
            continue
        build_venv(peer, args.fresh, args.freeze)
        if peer == "fastrtc":
            fetch_vad()
    print(f"setup: ok ({', '.join(chosen)} in {home()})", file=sys.stderr)


if __name__ == "__main__":
    main()
