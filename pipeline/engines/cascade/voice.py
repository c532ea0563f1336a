"""The Piper voices shared by the Talker (their phonemizers) and Code2Wav (their ONNX models).

Each voice is loaded once per process: loading costs ~0.5 s and ~100 MB, and both engines may
live in the same process. An engine loads its default voice at start and any other voice the
first time a request names it (`EngineVoices`), so a process pays only for the voices its
sessions use. A voice is loaded with alignments exposed (the ONNX graph patched in memory to
also output each phoneme id's duration); that is what lets Code2Wav run several clauses as one
padded batch and still cut each row's audio at its true length. Without the `onnx` package the
patch is skipped and Code2Wav falls back to one clause per call.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ...voices import CATALOGUE, DEFAULT_NAMES, VoiceCatalogue
from .errors import ModelPackageMissing

if TYPE_CHECKING:
    from piper import PiperVoice

log = logging.getLogger("parley.pipeline.cascade")

VOICE_PACKAGE = CATALOGUE.default.package

_voices: dict[str, PiperVoice] = {}
_lock = threading.Lock()


def load_voice(package: str = VOICE_PACKAGE) -> PiperVoice:
    """The voice from a Piper voice package (blocking; cached per process)."""
    with _lock:
        if package in _voices:
            return _voices[package]
        try:
            from piper import PiperVoice
        except ImportError as exc:
            raise ModelPackageMissing("piper-tts", "pip install 'piper-tts[alignment]'") from exc
        try:
            paths = importlib.import_module(package)  # voice packages expose model_path() etc.
        except ImportError as exc:
            install = f"pip install {package.replace('_', '-')}"
            raise ModelPackageMissing(package.replace("_", "-"), install) from exc
        voice = _open_voice(PiperVoice, paths.model_path(), paths.config_path())
        _voices[package] = voice
        return voice


SYNTH_THREADS = 2
"""onnxruntime threads for one synthesis. By default they spin between operators, and on two
cores beside the Thinker's busy thread the first clause of an answer ("The capital of")
took 90-174 ms instead of ~45 ms: a spinning thread waits on a descheduled one at every
operator. Two threads that sleep instead: 61 ms against a busy core (1: 77 ms, spinning:
80-99 ms) and 60 ms alone."""


def _session_options() -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = SYNTH_THREADS
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def _open_voice(voice_class: type[PiperVoice], model_path: Path, config_path: Path) -> PiperVoice:
    """`PiperVoice.load` with alignments, but with our session options (it takes none)."""
    import onnxruntime
    from piper.config import PiperConfig
    from piper.phonemize_espeak import ESPEAK_DATA_DIR

    config = PiperConfig.from_dict(json.loads(Path(config_path).read_text(encoding="utf-8")))
    model: str | bytes = str(model_path)
    try:
        import onnx
        from piper.patch_voice_with_alignment import add_alignment_output

        graph = onnx.load(str(model_path))
        add_alignment_output(graph)
        model = graph.SerializeToString()
    except ImportError:
        log.warning("no onnx package: Piper runs one clause per call (pip install onnx)")
    except ValueError:  # the model exposes its alignments already
        pass
    session = onnxruntime.InferenceSession(
        model, sess_options=_session_options(), providers=["CPUExecutionProvider"]
    )
    return voice_class(
        config=config,
        session=session,
        espeak_data_dir=Path(ESPEAK_DATA_DIR),
        download_dir=Path.cwd(),
    )


def clause_phoneme_ids(voice: PiperVoice, text: str) -> npt.NDArray[np.int32]:
    """Phoneme ids for one clause (empty when it has nothing to say); fast, no model.

    Piper phonemizes with the espeak-ng voice of the voice's own config (en-us, en-gb-x-rp,
    ...), and the ids come from its own phoneme map: ids are only valid for that voice.
    """
    ids: list[int] = []
    for sentence in voice.phonemize(text):
        if sentence:
            ids.extend(voice.phonemes_to_ids(sentence))
    return np.asarray(ids, dtype=np.int32)


def has_durations(voice: PiperVoice) -> bool:
    """Whether the voice's model reports per-phoneme durations (so it can batch)."""
    return len(voice.session.get_outputs()) > 1


class EngineVoices:
    """The voices one engine speaks with: its default, and the catalogue's on demand.

    A name the catalogue does not know, and a voice whose package cannot be loaded, get the
    default voice (the session validates names; an engine never fails a reply over a voice).
    """

    def __init__(self, default_package: str, catalogue: VoiceCatalogue = CATALOGUE) -> None:
        self.default_package = default_package
        self.catalogue = catalogue
        self._default: PiperVoice | None = None

    @property
    def default(self) -> PiperVoice:
        if self._default is None:
            raise RuntimeError("the default voice is not loaded (start() first)")
        return self._default

    async def start(self) -> None:
        """Load the default voice (raises ModelPackageMissing when it is not installed)."""
        if self._default is None:
            self._default = await asyncio.to_thread(load_voice, self.default_package)

    def package_for(self, name: str) -> str:
        """The package a request's voice name speaks with."""
        if name.strip().lower() in DEFAULT_NAMES:
            return self.default_package
        entry = self.catalogue.resolve(name)
        return entry.package if entry is not None else self.default_package

    async def load(self, package: str) -> tuple[str, PiperVoice]:
        """A voice by package (loaded on first use), or the default if it cannot load."""
        if package == self.default_package:
            return package, self.default
        if (voice := _voices.get(package)) is not None:
            return package, voice
        try:
            return package, await asyncio.to_thread(load_voice, package)
        except ModelPackageMissing as exc:
            log.warning("voice %s is not available (%s): speaking with the default", package, exc)
            return self.default_package, self.default

    async def for_name(self, name: str) -> tuple[str, PiperVoice]:
        """The (package, voice) a request's voice name speaks with."""
        return await self.load(self.package_for(name))
