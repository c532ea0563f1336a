"""Whether a pipeline recognises speech: what a transcription session needs of it.

A transcription-only request (`PipelineRequest.transcribe_only`) asks a pipeline for the
words of some audio. Only some engines have a recogniser behind that: the cascade's Thinker
(Whisper base by default, or pocketsphinx) and the OpenAI-compatible Thinker (unless its
`recognizer` is `none`). The echo engine, a duplex model (Moshi) and Qwen3-Omni (it answers
the audio directly) just end such a request with no words, so a session that only
transcribes (OpenAI's `type: "transcription"`) is refused on them, with the pipeline named.

The answer comes from the graph file (the stages' engines and their `recognizer` argument),
not from the engines themselves, which may live in other processes. A pipeline that is not
a graph (a test's fake) can say it itself with a `recogniser` attribute.
"""

from __future__ import annotations

from typing import Any

RECOGNISING_ENGINES: dict[str, str] = {
    "cascade.thinker": "whisper",
    "openai_chat.thinker": "whisper",
}
"""Engines that recognise speech, with the recogniser each runs when the graph names none
(their `recognizer` engine argument; `none` turns it off)."""


def speech_recogniser(pipeline: Any) -> str | None:
    """The name of the recogniser behind `pipeline`'s transcription-only requests
    (`whisper`, `whisper-tiny`, `pocketsphinx`), or None when it has none."""
    declared = getattr(pipeline, "recogniser", None)
    if declared is not None or hasattr(pipeline, "recogniser"):
        return declared if isinstance(declared, str) and declared else None
    config = getattr(pipeline, "config", None)
    for stage in getattr(config, "stages", ()):
        default = RECOGNISING_ENGINES.get(stage.engine)
        if default is None:
            continue
        name = stage.engine_args.get("recognizer", default)
        if isinstance(name, str) and name != "none":
            return name
    return None


def pipeline_name(pipeline: Any) -> str:
    """The pipeline's name as `--pipeline` gave it (a graph's `name`), for messages."""
    return str(getattr(pipeline, "name", None) or type(pipeline).__name__)
