"""What a video chat client sends, as the session takes it: settings, frames and audio.

`session_settings` turns a `session.config` into the session's settings (manual turns, the
frame cache, the voice, an answer cap); `frame_image` and `pcm_audio` decode a frame's and a
chunk's base64, each problem a `MessageError` with vLLM-Omni's wording as its short text.

Decisions:

- A frame may come as a data URL (`data:image/jpeg;base64,...`): the base64 after its
  header is the image. A frame without data is ignored, as by vLLM-Omni.
- A frame's size is checked before it is decoded (10 MiB of image), so a huge message
  costs no decode.
- Which frames a query sees: vLLM-Omni's rule, `num_frames` sampled from the whole frame
  buffer, for a client that asks for it by naming a `sampling_strategy` (`uniform`,
  `latest` or `latest_frames`); otherwise Parley's, the frames of the query's own moment
  (sessions/frame_window.py: the audio since the last query and the second before it),
  so a question about what the camera shows now is not answered from a minute ago.
- `sampling_params_list`'s thinker `max_tokens` becomes the session's answer cap where the
  session has one (at most `MAX_OUTPUT_TOKENS`); the other sampling knobs have no place
  in Parley's request, whose graph sets sampling.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from typing import Any

from pipeline.audio_format import OUTPUT_SAMPLE_RATE
from sessions import MAX_APPEND_BYTES, SessionConfig

from .audio_window import BYTES_PER_MS
from .video_messages import MessageError, SessionConfigMessage

MAX_FRAME_BYTES = 10 * 1024 * 1024
MAX_AUDIO_BYTES = 4 * 1024 * 1024
"""The audio kept between two queries."""
SESSION_AUDIO_SECONDS = math.ceil(MAX_AUDIO_BYTES / (BYTES_PER_MS * 1000)) + 1
"""The session's audio buffer holds a little more than the window, so nothing in the
window is ever trimmed from it."""
MAX_OUTPUT_TOKENS = 4_096
"""The session's largest answer cap; a larger `max_tokens` asks for no more than that."""

TOO_LARGE = "Frame too large"
BAD_IMAGE = "Invalid image data"

_DATA_URL = re.compile(r"data:[\w/+.-]*;base64,")


def session_settings(config: SessionConfigMessage) -> dict[str, Any]:
    """The session's settings for a video chat: manual turns and the client's knobs."""
    settings: dict[str, Any] = {
        "output_modalities": list(config.modalities),
        "turn_detection": None,
        "video": {
            "num_frames": config.num_frames,
            "max_frames": config.max_frames,
            "sampling_strategy": config.sampling_strategy,
            "frame_window": "cache" if "sampling_strategy" in config.model_fields_set else "turn",
            "frame_filter": config.enable_frame_filter,
            "frame_filter_threshold": config.frame_filter_threshold,
        },
        "output_sample_rate": OUTPUT_SAMPLE_RATE,
        "max_audio_seconds": SESSION_AUDIO_SECONDS,
    }
    if config.system_prompt:
        settings["instructions"] = config.system_prompt
    if config.speaker:
        settings["voice"] = config.speaker
    if config.max_output_tokens is not None and "max_output_tokens" in SessionConfig.model_fields:
        settings["max_output_tokens"] = min(config.max_output_tokens, MAX_OUTPUT_TOKENS)
    return settings


def frame_image(data: str) -> bytes | None:
    """The encoded image of a `video.frame`'s data; None when there is none."""
    prefix = _DATA_URL.match(data)
    if prefix is not None:  # a data URL: the base64 after its header
        data = data[prefix.end() :]
    if not data:
        return None
    if len(data) * 3 // 4 - 2 > MAX_FRAME_BYTES:  # what it would decode to, at least
        raise MessageError(_too_large(len(data) * 3 // 4), "frame_too_large", TOO_LARGE)
    try:
        image = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise MessageError(f"{BAD_IMAGE}: not valid base64", "invalid_image", BAD_IMAGE) from None
    if len(image) > MAX_FRAME_BYTES:
        raise MessageError(_too_large(len(image)), "frame_too_large", TOO_LARGE)
    return image


def bad_image(detail: str) -> MessageError:
    """A frame the session could not read as an image."""
    if detail.startswith("invalid image data"):
        detail = "send a base64-encoded JPEG or PNG image"
    return MessageError(f"{BAD_IMAGE}: {detail}", "invalid_image", BAD_IMAGE)


def pcm_audio(data: str) -> bytes:
    """The PCM16 of an `audio.chunk` (or a query's `audio_data`)."""
    try:
        pcm = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise MessageError("Invalid audio data: not valid base64", "invalid_audio") from None
    if len(pcm) % 2:
        raise MessageError(
            "Invalid audio data: PCM16 audio has an even number of bytes", "invalid_audio"
        )
    return pcm


def pieces(pcm: bytes) -> list[bytes]:
    """`pcm` in pieces the session takes in one append."""
    return [pcm[i : i + MAX_APPEND_BYTES] for i in range(0, len(pcm), MAX_APPEND_BYTES)]


def _too_large(size: int) -> str:
    return f"{TOO_LARGE}: {size} bytes; the limit is {MAX_FRAME_BYTES} bytes (10 MiB)"
