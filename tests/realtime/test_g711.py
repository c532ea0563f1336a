"""G.711 with numpy: the standard's code points, and round trips within its quantisation."""

from __future__ import annotations

import numpy as np
import pytest

from realtime import g711


def test_known_code_points() -> None:
    silence = np.zeros(3, dtype=np.int16)
    assert g711.ulaw_encode(silence) == b"\xff\xff\xff"
    assert g711.alaw_encode(silence) == b"\xd5\xd5\xd5"
    loudest = np.array([32767, -32768], dtype=np.int16)
    assert g711.ulaw_encode(loudest) == b"\x80\x00"
    assert g711.alaw_encode(loudest) == b"\xaa\x2a"
    assert g711.ulaw_decode(b"\xff\x7f").tolist() == [0, 0]
    assert g711.ulaw_decode(b"\x80\x00").tolist() == [32124, -32124]
    assert g711.alaw_decode(b"\xd5\xaa\x2a").tolist() == [8, 32256, -32256]


@pytest.mark.parametrize("fmt", [g711.PCMU, g711.PCMA])
def test_round_trips_stay_within_the_segment_step(fmt: str) -> None:
    pcm = np.arange(-32768, 32768, 7, dtype=np.int32).astype(np.int16)
    coded = g711.encode(pcm, fmt)
    assert len(coded) == len(pcm)
    back = g711.decode(coded, fmt).astype(np.int32)
    error = np.abs(back - pcm.astype(np.int32))
    # Logarithmic coding: the error grows with the level, about 1/32 of it at most.
    assert np.all(error <= np.maximum(np.abs(pcm.astype(np.int32)) // 16, 16) + 8)
    # Every code decodes and re-encodes to itself.
    codes = bytes(range(256))
    again = g711.encode(g711.decode(codes, fmt), fmt)
    if fmt == g711.PCMU:  # mu-law has two zeros (0x7f, 0xff): both decode to 0 -> 0xff
        assert again == codes.replace(b"\x7f", b"\xff")
    else:
        assert again == codes


def test_the_codec_object_speaks_bytes() -> None:
    codec = g711.G711()
    pcm = (np.sin(np.arange(160) / 5) * 10_000).astype(np.int16)
    payload = codec.encode(pcm, g711.PCMU)
    assert len(codec.decode(payload, g711.PCMU)) == 2 * len(pcm)
    with pytest.raises(ValueError, match="not a G.711 format"):
        codec.encode(pcm, "audio/pcm")
