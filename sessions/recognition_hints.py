"""The session's `audio.input.transcription` as the pipeline's recogniser takes it.

A client names the language its user speaks and a prompt (names, terms, or the text
before) to recognise the user's speech with; every recognition of the session's audio (a
turn answered, a turn only transcribed, the words at a pause) carries them
(`PipelineRequest.recognition`), and so does `include:
["item.input_audio_transcription.logprobs"]` (the transcripts then carry their tokens'
log-probabilities, where the recogniser has them). The model a client names is echoed, not
obeyed: the pipeline has one recogniser.
"""

from __future__ import annotations

from pipeline.types import RecognitionHints

from .config import LOGPROBS, SessionConfig


def recognition_hints(config: SessionConfig) -> RecognitionHints:
    """The language and prompt of `config`'s input transcription (none if it has none), and
    whether its `include` asks for the tokens' log-probabilities.

    OpenAI's `keywords` (words or phrases to guide transcription) are put before the
    prompt, as Whisper's prompt is where it reads the words to expect (for `whisper-1`,
    OpenAI's prompt *is* a list of keywords); `languages` (one here) stands in for a
    `language` not given."""
    logprobs = LOGPROBS in config.include
    asked = config.input_transcription
    if asked is None:
        return RecognitionHints(logprobs=logprobs)
    language = asked.language or (asked.languages[0] if asked.languages else "")
    keywords = ", ".join(word.strip() for word in asked.keywords or () if word.strip())
    prompt = ". ".join(part for part in (keywords, (asked.prompt or "").strip()) if part)
    return RecognitionHints(language=language, prompt=prompt, logprobs=logprobs)
