"""The caller's decoded audio into the session's 16 kHz mono: one stream per track, the
same samples as resampling the whole mono signal at once, whatever the frame's layout."""

from __future__ import annotations

import av
import numpy as np
import numpy.typing as npt
import pytest
import soxr

from realtime.transports.webrtc.mic import MicConverter


def voice(rate: int, seconds: float) -> npt.NDArray[np.int16]:
    t = np.arange(round(rate * seconds)) / rate
    wave = 8_000 * np.sin(2 * np.pi * 300 * t) + 3_000 * np.sin(2 * np.pi * 1_700 * t)
    pcm: npt.NDArray[np.int16] = np.rint(wave).astype(np.int16)
    return pcm


def frame(pcm: npt.NDArray[np.int16], rate: int, layout: str) -> av.AudioFrame:
    channels = 2 if layout == "stereo" else 1
    packed = np.repeat(pcm, channels).reshape(1, -1)  # both channels the same voice
    out = av.AudioFrame.from_ndarray(packed, format="s16", layout=layout)
    out.sample_rate = rate
    return out


def pcm16(data: bytes) -> npt.NDArray[np.int16]:
    return np.frombuffer(data, dtype=np.int16)


@pytest.mark.parametrize("layout", ["mono", "stereo"])
def test_48k_frames_become_one_16k_mono_stream(layout: str) -> None:
    mic = MicConverter()
    pcm = voice(48_000, 1.0)
    out = np.concatenate(
        [pcm16(mic.convert(frame(pcm[i : i + 960], 48_000, layout))) for i in range(0, 48_000, 960)]
    )
    whole = soxr.resample(pcm, 48_000, 16_000)
    assert 15_500 <= len(out) <= 16_000  # soxr holds back its look-ahead, a few ms
    assert np.abs(out.astype(np.int32) - whole[: len(out)]).max() <= 2  # no seams


def test_a_frame_may_yield_nothing_yet_and_16k_mono_passes_through() -> None:
    mic = MicConverter()
    sizes = [len(mic.convert(frame(voice(48_000, 0.02), 48_000, "stereo"))) for _ in range(6)]
    assert 0 in sizes and sum(sizes) > 0  # soxr's blocks: nothing lost, some frames empty
    pcm = voice(16_000, 0.02)
    assert mic.convert(frame(pcm, 16_000, "mono")) == pcm.tobytes()


def test_stereo_is_averaged_and_planar_or_float_frames_are_packed_first() -> None:
    left, right = voice(16_000, 0.02), np.zeros(320, dtype=np.int16)
    stereo = av.AudioFrame.from_ndarray(np.stack([left, right]), format="s16p", layout="stereo")
    stereo.sample_rate = 16_000
    assert np.array_equal(pcm16(MicConverter().convert(stereo)), left // 2)
    floats = av.AudioFrame.from_ndarray(
        (left / 32768).astype(np.float32).reshape(1, -1), format="flt", layout="mono"
    )
    floats.sample_rate = 16_000
    assert np.abs(pcm16(MicConverter().convert(floats)).astype(np.int32) - left).max() <= 1
