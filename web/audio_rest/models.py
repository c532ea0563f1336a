"""Which of the pipeline's models the audio endpoints speak and hear with, loaded on first use.

The endpoints serve the embedded cascade's own models: the Whisper its Thinker recognises
speech with (base, or tiny.en with `recognizer: whisper-tiny`) and the Piper voice its
Code2Wav speaks with, read from the pipeline's graph file, so `/v1/audio/*` hears and speaks
as the sessions do. They are loaded here, in the server process, rather than asked of the
pipeline's stages: a session's recogniser decodes one short turn in a cut-down window,
English only and without timestamps, while OpenAI's transcription API promises segments,
a detected language, a prompt and a temperature, which faster-whisper's own `transcribe`
gives; and the graph has no entry that takes text to speak (the Talker speaks the
Thinker's reply). The weights are the same packages' and are loaded once per process, the
first time an endpoint needs them (Whisper base ~75 MB at int8, the voice ~65 MB), on a
worker thread.

A pipeline without such a stage (`--pipeline echo`, Moshi, Qwen3-Omni) has no model for
the endpoint: it answers 404 naming the pipeline.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.engines.cascade.voice import VOICE_PACKAGE, load_voice
from pipeline.engines.cascade.whisper_asr import BASE, TINY_EN, load_whisper
from pipeline.graph import StageGraph
from pipeline.types import Pipeline

from .blocking import off_loop
from .errors import AudioApiError

if TYPE_CHECKING:
    from piper import PiperVoice

WHISPER_MODELS = {"whisper": BASE, "whisper-tiny": TINY_EN}
"""The Thinker's `recognizer` argument -> the Whisper model it runs."""
WHISPER_THREADS = 1
"""One CPU thread for a transcription: the other core stays with the sessions' models."""


@dataclass(frozen=True, slots=True)
class AudioModelNames:
    """What a pipeline's graph says it hears and speaks with (None: it does not)."""

    pipeline: str
    whisper: str | None
    voice_package: str | None


def model_names(name: str, pipeline: Pipeline | None) -> AudioModelNames:
    """The Whisper model of a `cascade.thinker` stage and the voice of a `cascade.code2wav`
    stage in `pipeline`'s graph, where it has them."""
    whisper: str | None = None
    voice: str | None = None
    if isinstance(pipeline, StageGraph):
        for stage in pipeline.config.stages:
            args = stage.engine_args
            if stage.engine == "cascade.thinker":
                whisper = WHISPER_MODELS.get(str(args.get("recognizer", "whisper")))
            elif stage.engine == "cascade.code2wav":
                voice = str(args.get("voice_package", VOICE_PACKAGE))
    return AudioModelNames(name, whisper, voice)


class AudioModels:
    """The recogniser and the voice of one pipeline, each loaded once, on first use."""

    def __init__(self, names: AudioModelNames) -> None:
        self.names = names
        self._whisper: Any = None
        self._voice: PiperVoice | None = None
        self._loading = asyncio.Lock()

    async def whisper(self) -> Any:
        """The faster-whisper model; AudioApiError(404) when the pipeline has none."""
        model = self.names.whisper
        if model is None:
            raise AudioApiError(
                404,
                f"pipeline {self.names.pipeline!r} has no Whisper recogniser to transcribe "
                "with; serve the 'cascade' pipeline (its Thinker's recognizer: whisper or "
                "whisper-tiny) for /v1/audio/transcriptions",
                code="model_not_found",
            )
        async with self._loading:
            if self._whisper is None:
                self._whisper = await off_loop(load_whisper, "int8", WHISPER_THREADS, model)
        return self._whisper

    async def voice(self) -> PiperVoice:
        """The Piper voice; AudioApiError(404) when the pipeline speaks with none."""
        package = self.names.voice_package
        if package is None:
            raise AudioApiError(
                404,
                f"pipeline {self.names.pipeline!r} has no Piper voice to speak with; serve "
                "the 'cascade' pipeline (its cascade.code2wav stage) for /v1/audio/speech",
                code="model_not_found",
            )
        async with self._loading:
            if self._voice is None:
                self._voice = await off_loop(load_voice, package)
        return self._voice
