"""The transcription settings of OpenAI Realtime's session object, read into a patch.

A transcription session (`"type": "transcription"`, or a connection made with
`?intent=transcription`) is set up by the same `session.update` as a conversation, with its
settings under `audio.input` (beta: top level, or the `transcription_session.update` event):

- `type`: `realtime` or `transcription`; only `transcription` goes into the patch (the
  session decides whether it may change: sessions/transcription_session.py), and the
  dispatcher refuses `realtime` in a transcription session;
- `audio.input.transcription` (`model`, `language`, `prompt`, `keywords`, `languages`;
  beta `input_audio_transcription`): kept and echoed; the pipeline's recogniser
  transcribes in the language named (one of Whisper's codes, else refused; `languages`
  must be one) with the keywords and the prompt (sessions/recognition_hints.py); the
  model named is not obeyed; `delay` is refused (the recogniser has no such setting);
- `audio.input.noise_reduction` (`near_field` / `far_field`, `strength` 0-1; beta
  `input_audio_noise_reduction`): kept, echoed and applied to the input audio by the
  session (sessions/noise_reduction.py), a conversation's and a transcription's alike;
- `include`: `item.input_audio_transcription.logprobs` only, honoured and echoed: every
  recognition of the session's audio asks for its tokens' log-probabilities
  (sessions/recognition_hints.py), and the transcription events carry them where the
  recogniser has them (Whisper; not pocketsphinx, nor Whisper over 30 s of audio).

Each value Parley cannot take is a ProtocolError naming its parameter, and the rest applies.
"""

from __future__ import annotations

from typing import Any

from pipeline.whisper_languages import WHISPER_LANGUAGES
from sessions.config import LOGPROBS

from .session_spec import NoiseReductionSpec, SessionSpec, TranscriptionSpec
from .wire_values import ProtocolError

NOISE_REDUCTION = ("near_field", "far_field")


def transcription_patch(
    spec: SessionSpec, eid: str | None
) -> tuple[dict[str, Any], list[ProtocolError]]:
    """The part of a `SessionConfig` patch that `spec`'s transcription settings make, and
    an error for each value that cannot be used."""
    patch: dict[str, Any] = {}
    errors: list[ProtocolError] = []
    if spec.type is not None:
        if spec.type == "transcription":
            patch["type"] = spec.type
        elif spec.type != "realtime":
            errors.append(
                ProtocolError(
                    "invalid_value",
                    f"unknown session type {spec.type!r}; use 'realtime' or 'transcription'",
                    eid,
                    "session.type",
                )
            )
    audio_in = spec.audio.input if spec.audio is not None else None
    if audio_in is not None and "transcription" in audio_in.model_fields_set:
        patch["input_transcription"] = _transcription(
            audio_in.transcription, "session.audio.input.transcription", eid, errors
        )
    elif "input_audio_transcription" in spec.model_fields_set:
        patch["input_transcription"] = _transcription(
            spec.input_audio_transcription, "session.input_audio_transcription", eid, errors
        )
    try:
        if audio_in is not None and "noise_reduction" in audio_in.model_fields_set:
            patch["noise_reduction"] = _noise_reduction(
                audio_in.noise_reduction, "session.audio.input.noise_reduction", eid
            )
        elif "input_audio_noise_reduction" in spec.model_fields_set:
            patch["noise_reduction"] = _noise_reduction(
                spec.input_audio_noise_reduction, "session.input_audio_noise_reduction", eid
            )
    except ProtocolError as exc:
        errors.append(exc)
    if spec.include is not None:
        unknown = [value for value in spec.include if value != LOGPROBS]
        if unknown:
            errors.append(
                ProtocolError(
                    "invalid_value",
                    f"unknown include {unknown[0]!r}; Parley includes only {LOGPROBS!r}",
                    eid,
                    "session.include",
                )
            )
        else:
            patch["include"] = list(dict.fromkeys(spec.include))
    return patch, errors


def _transcription(
    spec: TranscriptionSpec | None, param: str, eid: str | None, errors: list[ProtocolError]
) -> dict[str, Any] | None:
    """The settings of `spec` that can be used; an error in `errors` for each other."""
    if spec is None:
        return None
    taken = {"model", "language", "prompt", "keywords", "languages"}
    for name in ("language", "languages"):
        value = getattr(spec, name)
        codes = [value] if isinstance(value, str) else value or []
        unknown = [code for code in codes if code not in WHISPER_LANGUAGES]
        if unknown:
            errors.append(
                ProtocolError(
                    "invalid_value",
                    f"unknown language {unknown[0]!r}: give an ISO-639-1 code (en, fr, de...)",
                    eid,
                    f"{param}.{name}",
                )
            )
            taken.discard(name)
    if spec.languages is not None and len(spec.languages) != 1 and "languages" in taken:
        errors.append(
            ProtocolError(
                "invalid_value",
                "Parley's recogniser is told one language or none: give one in "
                "languages (or language), or leave both out",
                eid,
                f"{param}.languages",
            )
        )
        taken.discard("languages")
    if spec.delay is not None:
        errors.append(
            ProtocolError(
                "invalid_value",
                "the recogniser has no delay setting: it writes a turn's words at its pauses "
                "and its end",
                eid,
                f"{param}.delay",
            )
        )
    return spec.model_dump(include=taken, exclude_none=True)


def _noise_reduction(
    spec: NoiseReductionSpec | None, param: str, eid: str | None
) -> dict[str, Any] | None:
    if spec is None:
        return None
    if spec.type is None and spec.strength is not None:  # the type on (or near_field)
        return {"strength": _strength(spec.strength, param, eid)}
    if spec.type not in NOISE_REDUCTION:
        raise ProtocolError(
            "invalid_value",
            f"unknown noise reduction type {spec.type!r}; use 'near_field' or 'far_field'",
            eid,
            f"{param}.type",
        )
    if spec.strength is None:  # OpenAI: an update without it keeps the strength
        return {"type": spec.type}
    return {"type": spec.type, "strength": _strength(spec.strength, param, eid)}


def _strength(strength: float, param: str, eid: str | None) -> float:
    if not 0.0 <= strength <= 1.0:
        raise ProtocolError(
            "invalid_value",
            f"strength is from 0 to 1 (1, the default, suppresses most), got {strength:g}",
            eid,
            f"{param}.strength",
        )
    return strength
