"""TurnDetector on real (espeak-ng) speech: one turn per sentence, edges within 60 ms."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from loadtest.speech import silence, speak, trim_silence, utterances_with_gaps
from pipeline.audio_format import FRAME_MS
from pipeline.audio_format import INPUT_FRAME_BYTES as FRAME_BYTES
from sessions.config import TurnDetectionConfig
from sessions.resample import InputResampler
from sessions.turn_detection import (
    OVERLAP_PAUSE_MS,
    PAUSE_MS,
    SpeechConfirmed,
    SpeechEnd,
    SpeechPause,
    SpeechResumed,
    SpeechStart,
    TurnDetector,
    TurnSignal,
)

Pcm = npt.NDArray[np.int16]
TOLERANCE_MS = 60

SENTENCE_SETS = [
    ["Hello there, how are you today?", "Seven silly snakes sat still.", "Thanks, that is all."],
    ["Think fast.", "Please find the file for me.", "Hats off to the chef."],
    ["What time is it in Tokyo?", "Shh, stop that.", "Tell me about the weather tomorrow."],
]


def frames_of(pcm: Pcm) -> list[bytes]:
    """`pcm` as 20 ms frames, the last one zero-padded."""
    data = pcm.astype("<i2").tobytes()
    data += b"\0" * (-len(data) % FRAME_BYTES)
    return [data[i : i + FRAME_BYTES] for i in range(0, len(data), FRAME_BYTES)]


def detect(detector: TurnDetector, frames: Sequence[bytes], first_ms: int = 0) -> list[TurnSignal]:
    signals: list[TurnSignal] = []
    for i, frame in enumerate(frames):
        signals += detector.process(frame, first_ms + i * FRAME_MS)
    return signals


def turns(signals: list[TurnSignal]) -> list[tuple[int, int]]:
    """(start_ms, end_ms) of each turn, checking the signals come in a legal order."""
    found: list[tuple[int, int]] = []
    open_start: int | None = None
    for signal in signals:
        match signal:
            case SpeechStart(start_ms=start):
                assert open_start is None, f"second start inside a turn: {signals}"
                open_start = start
            case SpeechConfirmed(start_ms=start):
                assert start == open_start
            case SpeechEnd(start_ms=start, end_ms=end):
                assert start == open_start
                assert end > start
                found.append((start, end))
                open_start = None
    assert open_start is None, "a turn never ended"
    return found


def assert_edges(found: list[tuple[int, int]], expected: list[tuple[int, int]]) -> None:
    assert len(found) == len(expected), f"found {found}, expected {expected}"
    for (start, end), (true_start, true_end) in zip(found, expected, strict=True):
        assert abs(start - true_start) <= TOLERANCE_MS, (found, expected)
        assert abs(end - true_end) <= TOLERANCE_MS, (found, expected)


@pytest.mark.parametrize("texts", SENTENCE_SETS)
@pytest.mark.parametrize("gap_ms", [800, 1_200])
def test_one_turn_per_sentence_with_accurate_edges(texts: list[str], gap_ms: int) -> None:
    pcm, expected = utterances_with_gaps(texts, gap_ms=gap_ms, lead_ms=700)
    config = TurnDetectionConfig(silence_duration_ms=500)
    signals = detect(TurnDetector(config), frames_of(pcm))

    assert_edges(turns(signals), expected)
    confirmed = [s for s in signals if isinstance(s, SpeechConfirmed)]
    assert len(confirmed) == len(expected)
    for signal, (_, true_end) in zip(confirmed, expected, strict=True):
        assert config.min_speech_ms <= signal.at_ms - signal.start_ms
        assert signal.at_ms <= true_end + TOLERANCE_MS


@pytest.mark.parametrize("threshold", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("voice", ["en-gb", "en-us+f3"])
def test_edges_hold_across_voices_and_aggressiveness(threshold: float, voice: str) -> None:
    texts = SENTENCE_SETS[0]
    lead_ms, gap_ms = 600, 900
    parts = [silence(lead_ms)]
    expected = []
    for text in texts:
        start = sum(len(p) for p in parts) // 16
        parts.append(trim_silence(speak(text, voice=voice)))
        expected.append((start, start + len(parts[-1]) // 16))
        parts.append(silence(gap_ms))
    config = TurnDetectionConfig(threshold=threshold, silence_duration_ms=500)
    assert_edges(turns(detect(TurnDetector(config), frames_of(np.concatenate(parts)))), expected)


def test_speech_resampled_from_48k_stereo_keeps_its_timeline() -> None:
    pcm, expected = utterances_with_gaps(SENTENCE_SETS[1], gap_ms=900, lead_ms=500, rate=48_000)
    resampler = InputResampler(48_000, 2)
    stereo = np.repeat(pcm, 2).astype("<i2").tobytes()
    frames = [
        f for i in range(0, len(stereo), 3_840) for f in resampler.push(stereo[i : i + 3_840])
    ]
    frames += resampler.flush()
    detector = TurnDetector(TurnDetectionConfig(silence_duration_ms=500))
    assert_edges(turns(detect(detector, frames)), expected)


@pytest.mark.parametrize("amplitude", [0, 30, 300, 1_000])
def test_silence_and_noise_alone_start_no_turn(amplitude: int) -> None:
    rng = np.random.default_rng(amplitude)
    noise = rng.integers(-amplitude, amplitude + 1, 16_000 * 5).astype(np.int16)
    assert detect(TurnDetector(TurnDetectionConfig()), frames_of(noise)) == []


def test_clicks_start_no_turn() -> None:
    rng = np.random.default_rng(5)
    pcm = rng.integers(-30, 31, 16_000 * 5).astype(np.int16)
    for at in range(4_000, len(pcm), 7_000):
        pcm[at : at + 160] = rng.integers(-12_000, 12_000, 160)  # 10 ms bursts
        pcm[at + 3_000] = 30_000  # and single-sample pops
    assert detect(TurnDetector(TurnDetectionConfig()), frames_of(pcm)) == []


def test_a_pause_shorter_than_silence_duration_does_not_split_the_turn() -> None:
    first = trim_silence(speak("Hello there"))
    second = trim_silence(speak("how are you doing"))
    pcm = np.concatenate([silence(500), first, silence(350), second, silence(1_000)])
    end_ms = 500 + (len(first) + len(second)) // 16 + 350
    found = turns(
        detect(TurnDetector(TurnDetectionConfig(silence_duration_ms=500)), frames_of(pcm))
    )
    assert_edges(found, [(500, end_ms)])


def test_a_pause_longer_than_silence_duration_ends_the_turn() -> None:
    first = trim_silence(speak("Hello there"))
    second = trim_silence(speak("how are you doing"))
    pcm = np.concatenate([silence(500), first, silence(700), second, silence(1_000)])
    first_end = 500 + len(first) // 16
    expected = [(500, first_end), (first_end + 700, first_end + 700 + len(second) // 16)]
    found = turns(
        detect(TurnDetector(TurnDetectionConfig(silence_duration_ms=500)), frames_of(pcm))
    )
    assert_edges(found, expected)


def test_reconfigure_applies_a_longer_silence_duration() -> None:
    first = trim_silence(speak("Hello there"))
    second = trim_silence(speak("how are you doing"))
    pcm = np.concatenate([silence(500), first, silence(700), second, silence(1_500)])
    detector = TurnDetector(TurnDetectionConfig(silence_duration_ms=500))
    detector.reconfigure(TurnDetectionConfig(silence_duration_ms=1_000))
    assert len(turns(detect(detector, frames_of(pcm)))) == 1


def test_short_speech_ends_without_confirmation() -> None:
    pcm, expected = utterances_with_gaps(["Yes."], gap_ms=800, lead_ms=500)
    config = TurnDetectionConfig(silence_duration_ms=500, min_speech_ms=2_000)
    signals = detect(TurnDetector(config), frames_of(pcm))
    assert not any(isinstance(s, SpeechConfirmed) for s in signals)
    assert_edges(turns(signals), expected)


def test_reset_drops_the_turn_in_progress() -> None:
    pcm, _ = utterances_with_gaps(["Please find the file for me."], gap_ms=1_000, lead_ms=500)
    frames = frames_of(pcm)
    detector = TurnDetector(TurnDetectionConfig(silence_duration_ms=500))
    head = detect(detector, frames[:50])  # one second: into the sentence
    assert [type(s) for s in head] == [SpeechStart, SpeechConfirmed]
    assert detector.in_speech

    detector.reset()
    assert not detector.in_speech
    rest = detect(detector, frames[50:], first_ms=50 * FRAME_MS)
    # The rest of the sentence may be a new turn, but it begins after the reset and
    # nothing ends the dropped one.
    assert all(start >= 50 * FRAME_MS for start, _ in turns(rest))


def test_reset_in_silence_stays_quiet() -> None:
    pcm, _ = utterances_with_gaps(["Please find the file for me."], gap_ms=1_000, lead_ms=500)
    frames = frames_of(pcm)
    detector = TurnDetector(TurnDetectionConfig(silence_duration_ms=500))
    detect(detector, frames[:50])
    detector.reset()
    speech_end = 500 + len(trim_silence(speak("Please find the file for me."))) // 16
    after = speech_end // FRAME_MS + 1
    assert detect(detector, frames[after:], first_ms=after * FRAME_MS) == []


@pytest.mark.parametrize("size", [0, 320, 639, 641, 1_280])
def test_frames_of_the_wrong_size_are_refused(size: int) -> None:
    with pytest.raises(ValueError, match="640 bytes"):
        TurnDetector(TurnDetectionConfig()).process(b"\0" * size, 0)


def test_a_pause_is_reported_once_before_the_end_it_may_be() -> None:
    """160 ms after the voice stops: one `SpeechPause` with the end the turn then has; a
    shorter gap between words reports none, a longer one that speech follows reports one
    that the end does not match."""
    detector = TurnDetector(TurnDetectionConfig())
    pcm, _ = utterances_with_gaps(["Hello there.", "How are you today?"], gap_ms=300, lead_ms=400)
    signals = detect(detector, frames_of(np.concatenate([pcm, silence(900, 16_000)])))
    pauses = [s for s in signals if isinstance(s, SpeechPause)]
    (end,) = [s for s in signals if isinstance(s, SpeechEnd)]
    assert len(pauses) == 2  # after the first phrase, and at the end
    assert pauses[0].end_ms < pauses[1].end_ms == end.end_ms
    assert signals.index(pauses[1]) < signals.index(end)
    # the voice coming back after the first pause says so, once, where it came back
    (resumed,) = [s for s in signals if isinstance(s, SpeechResumed)]
    assert signals.index(pauses[0]) < signals.index(resumed) < signals.index(pauses[1])
    assert pauses[0].end_ms + 300 - 60 <= resumed.at_ms <= pauses[0].end_ms + 300 + 60


@pytest.mark.parametrize("pause_ms", [PAUSE_MS, OVERLAP_PAUSE_MS])
def test_a_pause_is_reported_after_the_silence_the_detector_is_set_to(pause_ms: int) -> None:
    """The pause comes `pause_ms` after the last voiced frame: PAUSE_MS for a turn, the
    longer OVERLAP_PAUSE_MS while speech over an answer is judged (turn_taking.py sets it)."""
    detector = TurnDetector(TurnDetectionConfig())
    detector.pause_ms = pause_ms
    speech = trim_silence(speak("Hello there."))
    pcm = np.concatenate([silence(400, 16_000), speech, silence(400, 16_000)])
    reported: list[tuple[int, SpeechPause]] = []
    for i, frame in enumerate(frames_of(pcm)):
        for signal in detector.process(frame, i * FRAME_MS):
            if isinstance(signal, SpeechPause):
                reported.append(((i + 1) * FRAME_MS, signal))
    ((at_ms, pause),) = reported
    assert at_ms - pause.end_ms == pause_ms
