"""InputResampler keeps duration, pitch and timing in any pieces; bad input changes nothing.
OutputResampler streams one response: cut anywhere, it equals one whole resample."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
import soxr

from sessions.errors import MediaError
from sessions.resample import (
    FRAME_BYTES,
    FRAME_SAMPLES,
    MAX_APPEND_BYTES,
    SAMPLE_RATE,
    InputResampler,
    OutputResampler,
)

Pcm = npt.NDArray[np.int16]


def sine(rate: int, seconds: float, hz: float = 440.0, amplitude: float = 12_000) -> Pcm:
    t = np.arange(round(rate * seconds)) / rate
    return np.rint(amplitude * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def interleave(mono: Pcm, channels: int) -> bytes:
    return np.repeat(mono, channels).astype("<i2").tobytes()


def run(resampler: InputResampler, pieces: list[bytes]) -> Pcm:
    """Push every piece, flush, and join the frames (checking each is a whole frame)."""
    frames = [frame for piece in pieces for frame in resampler.push(piece)]
    frames += resampler.flush()
    assert all(len(frame) == FRAME_BYTES for frame in frames)
    return np.frombuffer(b"".join(frames), dtype="<i2").astype(np.int16)


def cut(data: bytes, sizes: list[int]) -> list[bytes]:
    """`data` in pieces of the given sizes, cycling through them."""
    pieces, pos, i = [], 0, 0
    while pos < len(data):
        pieces.append(data[pos : pos + sizes[i % len(sizes)]])
        pos += sizes[i % len(sizes)]
        i += 1
    return pieces


def peak_hz(pcm: Pcm, rate: int) -> float:
    """Frequency of the strongest FFT bin, refined by parabolic interpolation."""
    windowed = pcm.astype(np.float64) * np.hanning(len(pcm))
    spectrum = np.abs(np.fft.rfft(windowed))
    k = int(np.argmax(spectrum[1:-1])) + 1
    a, b, c = np.log(spectrum[k - 1 : k + 2])
    return float((k + 0.5 * (a - c) / (a - 2 * b + c)) * rate / len(pcm))


FORMATS = [(8_000, 1), (11_025, 1), (16_000, 1), (16_000, 2), (22_050, 2), (24_000, 1)]
FORMATS += [(24_000, 2), (32_000, 1), (44_100, 1), (44_100, 2), (48_000, 1), (48_000, 2)]


@pytest.mark.parametrize(("rate", "channels"), FORMATS)
def test_duration_and_pitch_survive(rate: int, channels: int) -> None:
    seconds = 2.0
    data = interleave(sine(rate, seconds), channels)
    out = run(InputResampler(rate, channels), cut(data, [rate // 10 * 2 * channels]))

    expected = round(len(data) / (2 * channels) * SAMPLE_RATE / rate)
    assert abs(len(out) - expected) < FRAME_SAMPLES
    middle = out[SAMPLE_RATE // 4 : SAMPLE_RATE * 7 // 4]
    assert peak_hz(middle, SAMPLE_RATE) == pytest.approx(440.0, abs=2.0)
    assert np.abs(middle).max() == pytest.approx(12_000, rel=0.02)  # no gain, no clipping


@pytest.mark.parametrize(("rate", "channels"), [(8_000, 1), (44_100, 2), (48_000, 2)])
def test_timing_is_kept(rate: int, channels: int) -> None:
    """A tone starting at 500 ms starts at 500 ms out: frame counts give true timestamps."""
    tone = np.concatenate([np.zeros(rate // 2, dtype=np.int16), sine(rate, 0.5)])
    out = run(InputResampler(rate, channels), [interleave(tone, channels)])
    onset_ms = np.flatnonzero(np.abs(out) > 1_000)[0] * 1000 / SAMPLE_RATE
    assert onset_ms == pytest.approx(500, abs=2)


def test_stereo_is_averaged() -> None:
    left = sine(48_000, 0.5)
    both = np.stack([left, np.zeros_like(left)], axis=1).astype("<i2").tobytes()
    out = run(InputResampler(48_000, 2), [both])
    assert np.abs(out[1000:-1000]).max() == pytest.approx(6_000, rel=0.02)


def test_16k_mono_passes_through_untouched() -> None:
    data = sine(SAMPLE_RATE, 0.1, amplitude=30_000).tobytes() + b"\x01\x00" * 7
    frames = InputResampler(SAMPLE_RATE, 1).push(data)
    assert b"".join(frames) == data[: len(frames) * FRAME_BYTES]
    resampler = InputResampler(SAMPLE_RATE, 1)
    out = run(resampler, cut(data, [2, 6, 998]))
    assert out.tobytes()[: len(data)] == data
    assert not out.tobytes()[len(data) :].strip(b"\0")  # the last frame is zero-padded


@pytest.mark.parametrize(("rate", "channels"), [(8_000, 1), (24_000, 1), (44_100, 2), (48_000, 2)])
def test_pieces_give_the_same_stream_as_one_push(rate: int, channels: int) -> None:
    rng = np.random.default_rng(3)
    mono = (sine(rate, 1.3) + rng.integers(-2_000, 2_000, round(rate * 1.3))).astype(np.int16)
    data = interleave(mono, channels)
    sample_frame = 2 * channels
    whole = run(InputResampler(rate, channels), [data])
    sizes = [sample_frame * n for n in (1, 7, 333, 2, 1_001, 50, 3)]
    pieces = run(InputResampler(rate, channels), cut(data, sizes))
    assert len(pieces) == len(whole)
    assert np.abs(pieces.astype(np.int32) - whole).max() <= 2


def test_flush_pads_the_last_frame_and_starts_afresh() -> None:
    resampler = InputResampler(24_000, 1)
    data = sine(24_000, 0.05).tobytes()  # 50 ms: 800 samples at 16 kHz
    frames = resampler.push(data) + resampler.flush()
    assert [len(f) for f in frames] == [FRAME_BYTES] * 3
    assert frames[-1][-160:] == b"\0" * 160  # 10 ms of padding
    assert resampler.flush() == []
    again = resampler.push(data) + resampler.flush()
    assert again == frames


@pytest.mark.parametrize(
    ("rate", "channels", "words"),
    [
        (12_345, 1, "sample rate"),
        (96_000, 1, "sample rate"),
        (16_000, 3, "channel"),
        (16_000, 0, "channel"),
    ],
)
def test_unsupported_formats_are_refused(rate: int, channels: int, words: str) -> None:
    with pytest.raises(MediaError, match=words) as caught:
        InputResampler(rate, channels)
    assert caught.value.code == "invalid_media"


def assert_refused_without_change(rate: int, channels: int, bad: bytes, words: str) -> None:
    """`bad` raises MediaError between two good pushes, and the output is as if never sent."""
    mono = sine(rate, 0.3)
    first, second = interleave(mono[:1_001], channels), interleave(mono[1_001:], channels)

    clean = InputResampler(rate, channels)
    expected = clean.push(first) + clean.push(second) + clean.flush()

    resampler = InputResampler(rate, channels)
    got = resampler.push(first)
    with pytest.raises(MediaError, match=words) as caught:
        resampler.push(bad)
    assert caught.value.code == "invalid_media"
    got += resampler.push(second) + resampler.flush()
    assert got == expected


@pytest.mark.parametrize(("rate", "channels"), [(16_000, 1), (44_100, 2), (48_000, 1)])
@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (b"", "empty audio"),
        (b"\0" * (MAX_APPEND_BYTES + 4), "too large"),
        (b"\0" * 641, "wrong sample format: .* PCM16"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(
    rate: int, channels: int, bad: bytes, words: str
) -> None:
    assert_refused_without_change(rate, channels, bad, words)


def test_half_a_stereo_sample_is_refused() -> None:
    assert_refused_without_change(48_000, 2, b"\0" * 6, "wrong sample format: .* stereo PCM16")


# --- output ---------------------------------------------------------------------------------

OUTPUT_RATES = [(24_000, 48_000), (16_000, 48_000), (24_000, 8_000), (48_000, 24_000)]


def chunked(resampler: OutputResampler, pcm: Pcm, sizes: list[int]) -> Pcm:
    pieces, pos, i = [], 0, 0
    while pos < len(pcm):
        pieces.append(resampler.push(pcm[pos : pos + sizes[i % len(sizes)]]))
        pos += sizes[i % len(sizes)]
        i += 1
    return np.concatenate([*pieces, resampler.flush()])


@pytest.mark.parametrize(("source", "target"), OUTPUT_RATES)
def test_a_chunked_output_stream_equals_one_whole_resample(source: int, target: int) -> None:
    speech = sine(source, 1.0, hz=330.0)
    whole = soxr.resample(speech, source, target)
    out = chunked(OutputResampler(source, target), speech, [source // 50, 7, source // 10 + 3])
    assert len(out) == len(whole)
    assert np.abs(out.astype(np.int32) - whole).max() <= 2  # rounding only
    # What the stream replaces: each chunk on its own puts the filter's edges at every cut.
    one_shot = np.concatenate(
        [
            soxr.resample(speech[i : i + source // 50], source, target)
            for i in range(0, len(speech), source // 50)
        ]
    )
    assert np.abs(one_shot[: len(whole)].astype(np.int32) - whole[: len(one_shot)]).max() > 1_000


def test_output_flush_starts_afresh_and_discard_drops_the_held_tail() -> None:
    speech = sine(24_000, 0.2)
    resampler = OutputResampler(24_000, 48_000)
    first = chunked(resampler, speech, [480])
    assert resampler.flush().size == 0  # nothing held after a flush
    assert np.array_equal(chunked(resampler, speech, [480]), first)
    held = resampler.push(speech)
    assert len(held) < 2 * len(speech)  # the filter's look-ahead is held back
    resampler.discard()
    assert resampler.flush().size == 0
    assert np.array_equal(chunked(resampler, speech, [480]), first)
