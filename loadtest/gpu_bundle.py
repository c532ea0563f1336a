"""The bundle an offline GPU host needs to run `parley serve --pipeline qwen3_omni` and the
serve benchmark from a checkout: built here (PyPI and Debian's redis-server needed), carried
with the repo as the ignored folder `.gpu/`.

    python -m loadtest.gpu_bundle [--python-version 3.12] [--out .gpu]

It holds:
- `wheels/`: the manylinux x86_64 wheels, for `--python-version`, of what the server imports
  for a Qwen3-Omni graph and its WebSocket clients, and what a GPU image with torch,
  transformers, triton and numpy lacks (`WHEELS`). Not the packages transformers itself
  depends on (`IMAGE_HAS`), which the image has with it; not aiortc, PyAV, Piper,
  faster-whisper, llguidance or pocketsphinx: WebRTC, SIP and the cascade load them only when
  used. Each wheel's Requires-Dist is checked against the bundle and `IMAGE_HAS`.
- `redis/bin/redis-server`: a shell wrapper that runs this machine's redis-server
  (`redis/lib/redis-server`) with `redis/lib/` on LD_LIBRARY_PATH, which holds the shared
  libraries it links that are not glibc's or the compiler runtime's (it needs glibc 2.34 or
  later: Ubuntu 22.04, Debian 12 and newer). Only redis-server sees them: the Python
  process keeps the image's own OpenSSL. Put `redis/bin` on PATH.
- `speech.npz`: the benchmark's questions spoken by espeak-ng at 24 kHz PCM16, since the GPU
  host has no espeak-ng (`omni_serve_bench --speech .gpu/speech.npz`).

Install there with `pip install --no-index --no-deps --target DIR .gpu/wheels/*.whl` and
`PYTHONPATH=DIR:$PWD`. The total size is printed: the carry limit is 64 MiB with the repo.
"""

from __future__ import annotations

import argparse
import email.parser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

WHEELS = (
    "starlette==1.10.0",
    "uvicorn==0.55.0",
    "uvloop==0.23.0",
    "websockets==16.1.1",
    "redis==7.4.1",
    "soxr==1.0.0",
    "pillow==13.0.0",
    "webrtcvad-wheels==2.0.14.post1",
    "prometheus-client==0.26.0",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "typing-extensions==4.16.0",  # pydantic wants a newer one than an image may have
    "python-multipart==0.0.34",
    "nvidia-ml-py==13.615.71",  # GPU only: each stage process's memory (gpu_usage.py)
)
"""The versions the CPU virtualenv runs (pyproject's ranges), so both run the same code;
and NVML's bindings, which only a GPU machine can use."""
IMAGE_HAS = frozenset(
    canonicalize_name(n)
    for n in (
        "numpy", "torch", "triton", "transformers", "huggingface-hub", "tokenizers",
        "safetensors", "pyyaml", "packaging", "filelock", "fsspec", "tqdm", "regex",
        "httpx", "httpcore", "anyio", "h11", "idna", "certifi", "click", "typer",
        "hf-xet", "shellingham", "rich",
    )
)  # fmt: skip
"""Installed with torch and transformers 5 (their own requirements), so not carried."""
SYSTEM_LIBS = ("libc.so", "libm.so", "libstdc++.so", "libgcc_s.so", "ld-linux", "linux-vdso")
"""Libraries every image that runs torch has; the rest of redis-server's are carried."""
WRAPPER = """#!/bin/sh
lib="$(cd "$(dirname "$0")/../lib" && pwd)"
LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$lib/redis-server" "$@"
"""
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64")


def download(out: Path, python_version: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--no-deps"]
    cmd += ["--python-version", python_version, "--implementation", "cp", "--dest", str(out)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run([*cmd, *WHEELS], check=True)
    return sorted(out.glob("*.whl"))


def requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    return metadata.get_all("Requires-Dist") or []


def missing(wheels: list[Path], python_version: str) -> list[str]:
    """Requirements of the bundle's wheels (on Linux, `python_version`, no extras) that
    neither the bundle nor the image provides."""
    have = {canonicalize_name(w.name.split("-")[0]) for w in wheels} | IMAGE_HAS
    env: dict[str, str] = {
        **{k: str(v) for k, v in default_environment().items()},
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }
    out = []
    for wheel in wheels:
        for line in requirements(wheel):
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            if canonicalize_name(req.name) not in have:
                out.append(f"{wheel.name}: {line}")
    return out


def copy_redis(out: Path) -> None:
    found = shutil.which("redis-server")
    if found is None:
        raise SystemExit("redis-server is not installed here: apt-get install redis-server")
    (out / "bin").mkdir(parents=True, exist_ok=True)
    (out / "lib").mkdir(exist_ok=True)
    shutil.copy2(Path(found).resolve(), out / "lib" / "redis-server")
    wrapper = out / "bin" / "redis-server"
    wrapper.write_text(WRAPPER)
    wrapper.chmod(0o755)
    linked = subprocess.run(["ldd", found], capture_output=True, text=True, check=True).stdout
    for line in linked.splitlines():
        parts = line.split()
        if "=>" not in parts or len(parts) < 3 or not parts[2].startswith("/"):
            continue
        if any(parts[0].startswith(name) for name in SYSTEM_LIBS):
            continue
        shutil.copy2(Path(parts[2]).resolve(), out / "lib" / parts[0])


def write_speech(path: Path) -> None:
    """The serve benchmark's questions, spoken as it would speak them itself."""
    from .omni_serve_bench import QUESTION_COUNT, SPEECH_KEY, load_speech

    spoken = load_speech(None)
    arrays = {SPEECH_KEY.format(i): pcm for i, pcm in enumerate(spoken[:QUESTION_COUNT])}
    np.savez_compressed(path, **arrays)  # type: ignore[arg-type]


def size_mib(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(".gpu"))
    parser.add_argument("--python-version", default="3.12")
    args = parser.parse_args(argv)
    wheels = download(args.out / "wheels", args.python_version)
    copy_redis(args.out / "redis")
    write_speech(args.out / "speech.npz")
    gaps = missing(wheels, args.python_version)
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 2**20:7.2f} MiB  {wheel.name}")
    for lib in sorted((args.out / "redis" / "lib").iterdir()):
        print(f"{lib.stat().st_size / 2**20:7.2f} MiB  redis/lib/{lib.name}")
    print(f"total {size_mib(args.out):.1f} MiB in {args.out}")
    if gaps:
        print("requirements neither bundled nor in the image:\n  " + "\n  ".join(gaps))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
