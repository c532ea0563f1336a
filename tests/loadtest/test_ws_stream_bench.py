"""The streaming bench's pre-built messages: valid appends in valid client frames."""

from __future__ import annotations

import base64
import json

import numpy as np

from loadtest.ws_stream_bench import CHUNK_SAMPLES, MASK, build_messages, client_frame


def test_a_prebuilt_frame_is_a_masked_text_frame_of_the_message() -> None:
    for text in ("x" * 10, "y" * 1300, "z" * 70_000):  # the three length encodings
        frame = client_frame(text)
        assert frame[0] == 0x81 and frame[1] & 0x80  # FIN + text, masked
        size = frame[1] & 0x7F
        start = 2 if size < 126 else 4 if size == 126 else 10
        if size == 126:
            size = int.from_bytes(frame[2:4], "big")
        elif size == 127:
            size = int.from_bytes(frame[2:10], "big")
        assert frame[start : start + 4] == MASK
        body = np.frombuffer(frame[start + 4 :], np.uint8)
        key = np.resize(np.frombuffer(MASK, np.uint8), len(body))
        assert size == len(body) and (body ^ key).tobytes().decode() == text


def test_a_cycle_is_20_ms_appends_with_one_question() -> None:
    messages, ends = build_messages(5.0)
    assert len(messages) == 250 and len(ends) == 1
    pcm = [base64.b64decode(json.loads(m)["audio"]) for m in messages]
    assert {len(p) for p in pcm} == {2 * CHUNK_SAMPLES}
    levels = [np.abs(np.frombuffer(p, "<i2")).max() for p in pcm]
    assert max(levels[: 250 // 3]) <= 30  # silence (low noise) before the question
    assert max(levels[250 // 3 : ends[0]]) > 1000  # the question
    assert max(levels[ends[0] :]) <= 30
