"""A real `vllm serve` for the tests and the benchmarks: vLLM's CPU build (`make vllm-env`
puts it in `.venv-vllm`, its own venv) serving the SmolLM2-135M-Instruct checkpoint the
cascade converts from its package, on a loopback port.

The tests start it once, at the first test that asks for it (about 40 s on 2 cores,
eager: tests/pipeline/openai_chat/conftest.py), and stop it at the end of the run. Its
`/metrics` gives the requests it is running (`vllm:num_requests_running`): the proof that a
cancel aborted one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from .proc_cpu import process_group

ROOT = Path(__file__).resolve().parents[1]
PYTHON = Path(os.environ.get("PARLEY_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
MODEL = "smollm2"
LONG_ANSWER = "List the numbers from 1 to 100, separated by commas."
"""A question SmolLM2-135M-Instruct answers at length at temperature 0 (past 160 tokens).
Asked to "Count from one to fifty, one number a line." it says "One number a line." (6
tokens), and "Count from one to two hundred." gets "I'm ready to assist you..." (14): a
test that needs an answer still streaming, or a cancel that must stop one, asks this."""
START_S = 600.0
"""How long it may take to serve (about 40 s on this 2-core machine, more when busy)."""


@dataclass
class Vllm:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def running_requests(self) -> float:
        """What vLLM's own metrics say it is generating now."""
        return self.metric("vllm:num_requests_running")

    def prompt_tokens(self) -> float:
        """How many prompt tokens vLLM has read since it started: it rises for every
        request it began, finished or aborted (an answer cut by a hang-up is not "success")."""
        return self.metric("vllm:prompt_tokens_total")

    def metric(self, name: str) -> float:
        """One of vLLM's Prometheus metrics, summed over its labels."""
        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith((name + "{", name + " ")):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def kill(self) -> None:
        """The server dies at once (SIGKILL to its process group: the API server and its
        engine), as a crashed or OOM-killed one does. The shared memory its processes had
        mapped (vLLM's message queues: ~400 MiB in /dev/shm) is unlinked after them, as no
        process of theirs is left to do it."""
        os.killpg(self.process.pid, signal.SIGSTOP)  # at once: nothing more is served
        mapped = shared_memory_of(self.process.pid)
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        for path in mapped:
            path.unlink(missing_ok=True)

    def pause(self) -> None:
        """Stop the server's processes where they are (a server stuck mid-answer)."""
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)


def shared_memory_of(group: int) -> set[Path]:
    """The /dev/shm files mapped by the processes of process group `group`."""
    found: set[Path] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or process_group(int(proc.name)) != group:
            continue
        try:
            maps = (proc / "maps").read_text()
        except OSError:
            continue  # ended meanwhile
        for line in maps.splitlines():
            at = line.find("/dev/shm/")
            if at >= 0:
                found.add(Path(line[at:].removesuffix(" (deleted)")))
    return found


def checkpoint() -> Path:
    """The cascade's converted checkpoint, as vLLM (transformers 5.x) reads it right. The
    GGUF conversion names the tokenizer `LlamaTokenizer`, which transformers 5.x builds as
    a SentencePiece one over SmolLM2's byte-level BPE: it cut "Hello there" into other
    tokens and decoded answers as `ĊI'mĠhere`. Named as the tokenizer its `tokenizer.json`
    is, with the byte-level decoder, it reads and writes words. Made once, beside the
    cascade's (hard links, but the two files it changes)."""
    source = _cascade_checkpoint()
    target = source.with_name(source.name + "-vllm")
    if (target / "config.json").is_file():
        return target
    staging = source.with_name(f".{source.name}-vllm-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for item in source.iterdir():
        if item.name not in ("tokenizer.json", "tokenizer_config.json"):
            os.link(item, staging / item.name)
    tokenizer = json.loads((source / "tokenizer.json").read_text())
    tokenizer["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                            "use_regex": True}  # fmt: skip
    (staging / "tokenizer.json").write_text(json.dumps(tokenizer))
    settings = json.loads((source / "tokenizer_config.json").read_text())
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    (staging / "tokenizer_config.json").write_text(json.dumps(settings))
    try:
        staging.rename(target)
    except OSError:  # another run made it meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _cascade_checkpoint() -> Path:
    """The cascade's converted checkpoint (converted now if it was not yet)."""
    from pipeline.engines.cascade.errors import model_file
    from pipeline.engines.cascade.smollm import (
        DEFAULT_FILE,
        DEFAULT_PACKAGE,
        cache_name,
        cache_root,
        load_language_model,
    )

    load_language_model()
    gguf = model_file(DEFAULT_PACKAGE, DEFAULT_FILE, install="make deps")
    return cache_root() / "models" / cache_name(gguf, DEFAULT_PACKAGE)


class VllmError(RuntimeError):
    """vLLM is not installed, or did not start: why."""


def start(workdir: Path, port: int | None = None) -> Vllm:
    """`vllm serve` on a loopback port (a free one unless given), once it answers;
    VllmError if it cannot."""
    if not PYTHON.is_file():
        raise VllmError(f"vLLM's CPU build is not installed at {PYTHON}: run `make vllm-env`")
    if port is None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
    log = workdir / "vllm.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    env.pop("PYTHONPATH", None)
    command = [
        str(PYTHON), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(checkpoint()), "--served-model-name", MODEL,
        "--dtype", "bfloat16", "--max-model-len", "2048",
        "--host", "127.0.0.1", "--port", str(port),
        # tools: a named tool's call needs a parser set (its arguments are then generated
        # to the tool's schema); hermes is the `<tool_call>` format
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        # no torch.compile: up in ~40 s rather than ~150 s on a fresh 2-core machine (and
        # its greedy answers were the checkpoint's: "The capital of France is Paris.")
        "--enforce-eager",
        # usage says how much of each prompt came from the prefix cache (cached_tokens)
        "--enable-prompt-tokens-details",
    ]  # fmt: skip
    with log.open("ab") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = Vllm(process, port, log)
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            raise VllmError(f"vllm serve exited ({process.returncode}):\n{tail}")
        try:
            if httpx.get(f"{server.url}/models", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    stop(server)
    raise VllmError(f"vllm serve was not serving after {START_S:g} s: see {log}")


def stop(server: Vllm) -> None:
    with_group = server.process.pid
    try:
        os.killpg(with_group, signal.SIGCONT)
        os.killpg(with_group, signal.SIGTERM)
        server.process.wait(timeout=30)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(with_group, signal.SIGKILL)
        server.process.wait(timeout=10)


def restart(server: Vllm) -> None:
    """A killed `server` served again on its own port (its URL unchanged), in place."""
    if server.process.poll() is None:
        stop(server)
    again = start(server.log.parent, server.port)
    server.process = again.process
