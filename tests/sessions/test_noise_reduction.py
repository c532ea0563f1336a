"""The session's noise suppressor (sessions/noise_reduction.py) on espeak-ng speech in
seeded white and babble noise: the noise loses most of its energy, the speech stays."""

from __future__ import annotations

import numpy as np
import pytest

from loadtest.noise_suppressors import suppress
from loadtest.speech import speak, trim_silence
from pipeline.audio_format import INPUT_FRAME_BYTES, INPUT_SAMPLE_RATE
from sessions.config import NoiseReductionConfig
from sessions.noise_reduction import LEVELS, InputNoiseReduction, NoiseSuppressor

from .conftest import MakeSession

RATE = INPUT_SAMPLE_RATE
LEAD_S = 1.5
"""Noise alone before the speech: the suppressor's estimate settles in the first ~0.5 s."""


def _speech() -> np.ndarray:
    return trim_silence(speak("Please set a timer for ten minutes.", rate=RATE)).astype(float)


def _noise(kind: str, length: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    if kind == "white":
        return rng.normal(0.0, 1.0, length)
    voices = [trim_silence(speak(t, rate=RATE)).astype(float) for t in _BABBLE]
    out = np.zeros(length)
    for voice in voices:
        looped = np.tile(voice, length // len(voice) + 2)
        start = int(rng.integers(0, len(voice)))
        out += looped[start : start + length]
    return out


_BABBLE = (
    "The meeting moved to Thursday afternoon.",
    "Could you pass me the salt please?",
    "We walked along the river for an hour.",
    "Nobody knew where the keys had gone.",
)


LAGS = range(0, 321, 8)
"""The suppressor delays its output (6 ms, 96 samples, here): the speech is looked for
within 20 ms."""


def _correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1])


def _db(signal: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(signal.astype(float) ** 2) + 1e-9))


@pytest.mark.parametrize(
    ("kind", "snr_db", "level", "min_drop_db"),
    [
        ("white", 5.0, LEVELS["near_field"], 9.0),  # level 2: measured 11.6 dB
        ("white", 5.0, LEVELS["far_field"], 4.0),  # level 1: 6.1
        ("babble", 5.0, LEVELS["near_field"], 4.5),  # 6.8: other voices, harder to tell apart
        ("babble", 5.0, LEVELS["far_field"], 3.0),  # 4.9
    ],
)
def test_noise_drops_and_speech_stays(
    kind: str, snr_db: float, level: int, min_drop_db: float
) -> None:
    """The speech keeps its level (within 4 dB; measured -0.7 to -1.4) and its waveform: the
    output is at least about as like the clean speech as the noisy input was (white noise:
    0.87 before, 0.87-0.88 after; babble 0.87, 0.84)."""
    speech = _speech()
    lead = int(LEAD_S * RATE)
    noise = _noise(kind, lead + len(speech))
    gain = np.sqrt(np.mean(speech**2) / (np.mean(noise**2) * 10 ** (snr_db / 10)))
    noise *= gain
    clean = np.concatenate([np.zeros(lead), speech])
    noisy = np.clip(clean + noise, -32768, 32767).astype(np.int16)
    out = suppress(NoiseSuppressor(level), noisy).astype(float)
    settled = slice(RATE // 2 * 2, lead)  # noise alone, after the first second
    drop = _db(noisy[settled]) - _db(out[settled])
    assert drop >= min_drop_db, f"{kind}: the noise dropped {drop:.1f} dB only"
    talk = slice(lead, None)
    kept = _db(out[talk]) - _db(speech)
    assert kept > -4.0, f"{kind}: the speech lost {-kept:.1f} dB"
    before = float(np.corrcoef(noisy[talk].astype(float), speech)[0, 1])
    after = max(_correlation(out[lead + lag :], speech[: len(speech) - lag]) for lag in LAGS)
    assert after > 0.9 * before, f"{kind}: like the speech {after:.2f}, before {before:.2f}"


def test_the_setting_keeps_state_until_its_type_changes_and_off_passes_frames() -> None:
    frame = (np.random.default_rng(1).normal(0, 2000, INPUT_FRAME_BYTES // 2)).astype("<i2")
    data = frame.tobytes()
    noise = InputNoiseReduction()
    assert noise.type is None and noise.process([data]) == [data]
    noise.reconfigure(NoiseReductionConfig(type="near_field"))
    first = noise._suppressor
    assert noise.type == "near_field" and first is not None and first.level == 2
    cleaned = noise.process([data, data[:100]])
    assert len(cleaned[0]) == INPUT_FRAME_BYTES and cleaned[1] == data[:100]  # short passes
    noise.reconfigure(NoiseReductionConfig(type="near_field"))
    assert noise._suppressor is first  # the same type keeps its adapted estimate
    noise.reconfigure(NoiseReductionConfig(type="far_field"))
    assert noise._suppressor is not first and noise._suppressor is not None
    assert noise._suppressor.level == 1
    noise.reconfigure(None)
    assert noise.type is None and noise.process([data]) == [data]
    noise.reconfigure(NoiseReductionConfig(type="far_field"))
    noise.close()
    noise.close()
    assert noise.type is None and noise.process([data]) == [data]


@pytest.mark.parametrize(
    ("kind", "strength", "level"),
    [
        ("near_field", None, 2),  # OpenAI's default strength is 1: the type's own level
        ("near_field", 1.0, 2),
        ("near_field", 0.5, 1),
        ("near_field", 0.2, 0),
        ("far_field", 1.0, 1),
        ("far_field", 0.5, 1),
        ("far_field", 0.4, 0),
    ],
)
def test_strength_scales_the_types_level(kind: str, strength: float | None, level: int) -> None:
    config = NoiseReductionConfig.model_validate({"type": kind, "strength": strength})
    noise = InputNoiseReduction(config)
    suppressor = noise._suppressor
    assert (suppressor.level if suppressor is not None else 0) == level
    assert noise.type == kind  # on, at level 0 too: frames then pass as they are
    frame = np.zeros(INPUT_FRAME_BYTES // 2, "<i2").tobytes()
    if level == 0:
        assert noise.process([frame]) == [frame]
    noise.close()


def test_a_new_strength_starts_a_fresh_suppressor_and_the_same_keeps_it() -> None:
    noise = InputNoiseReduction(NoiseReductionConfig(type="near_field"))
    first = noise._suppressor
    noise.reconfigure(NoiseReductionConfig(type="near_field", strength=1.0))
    assert noise._suppressor is first
    noise.reconfigure(NoiseReductionConfig(type="near_field", strength=0.5))
    assert noise._suppressor is not first and noise._suppressor is not None
    assert noise._suppressor.level == 1
    noise.close()


async def test_the_session_buffers_cleaned_audio_and_a_session_update_turns_it_off(
    make_session: MakeSession,
) -> None:
    """What the recogniser and the turn detector read (the session's audio buffer) is the
    cleaned audio while the setting is on, and the audio as sent once it is turned off."""
    session, _ = await make_session(
        {"turn_detection": None, "noise_reduction": {"type": "near_field"}}
    )
    noise = np.random.default_rng(3).normal(0.0, 1000.0, 2 * RATE).astype("<i2")
    await session.append_audio(noise.tobytes(), RATE, 1)
    await session.update({"noise_reduction": None})
    await session.append_audio(noise.tobytes(), RATE, 1)
    stored = await session.audio.read(0, 4_000)
    on, off = stored[RATE : 2 * RATE], stored[3 * RATE :]
    assert _db(noise[RATE:]) - _db(on) > 9.0  # level 2: ~12 dB off white noise
    assert np.array_equal(off, noise[RATE:])
    await session.close()
