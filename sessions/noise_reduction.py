"""A session's input noise suppression: OpenAI's `audio.input.noise_reduction`.

WebRTC's noise suppressor (the one in Chrome's and Android's audio processing, from the
`webrtc-noise-gain` wheel: C++, no model file, no other dependency) runs on the session's
16 kHz mono 20 ms frames, two 10 ms halves each, right after they are resampled
(audio_in.py), so turn detection, the buffered audio the recogniser transcribes and a
duplex model all hear the cleaned audio, whatever the transport.

It is stateful (a noise estimate that adapts over the first ~half second and then follows
the noise), so each session has its own, made when the setting turns it on and dropped when
it is turned off; a change of type mid-session starts a fresh one.

The mapping, chosen by measurement (loadtest/noise_reduction_bench.py: Whisper base on 30
spoken questions in white and babble noise; docs/benchmarks/embedded.md):

- `near_field` (a headset or a phone at the mouth: speech well above a mostly steady noise,
  a fan, a hum) is level 2 of 0-4: about 12 dB off steady noise; at 15 dB SNR it costs the
  recogniser one to four words of 202;
- `far_field` (a laptop or a room microphone: the voice only a few dB over the noise) is
  level 1: about 6 dB off. Near the noise, the stronger levels take the speech's own weak
  parts for noise: at 5 dB SNR level 1 cut Whisper's word errors from 14 % to 8 % in white
  noise and from 28 % to 24 % in babble, where levels 2 and 3 made babble worse (36-38 %).

The gain control of the same processor stays off (`auto_gain=0`): it would move the level
the turn detector's gate and the overlap judge's level cue compare against.

It costs ~30 us a 20 ms frame on this machine, so it runs on the event loop like the
resampler before it. RNNoise (the `pyrnnoise` wheel), measured beside it, costs ~1 ms a
frame (it would need a thread of its own) and wrecked babble at 5 dB (107 % word errors:
it takes the speaker for the babble).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pipeline.audio_format import INPUT_FRAME_BYTES

from .config import NoiseReductionConfig

if TYPE_CHECKING:
    from webrtc_noise_gain import AudioProcessor

NoiseType = Literal["near_field", "far_field"]
LEVELS: dict[NoiseType, int] = {"near_field": 2, "far_field": 1}
"""WebRTC's suppression level (0-4) for each of OpenAI's types, at OpenAI's default
strength (1)."""

HALF = INPUT_FRAME_BYTES // 2
"""The processor takes 10 ms (160 samples, 320 bytes) at a time."""


def level(config: NoiseReductionConfig) -> int:
    """The type's level scaled by OpenAI's `strength` (0-1, "higher values apply more
    suppression"), rounded half up: near_field is level 2 from 0.75, 1 from 0.25, and
    off below; far_field 1 from 0.5, off below. No measurement backs a level above the
    type's own, so 1 is the strongest."""
    strength = 1.0 if config.strength is None else config.strength
    return int(LEVELS[config.type] * strength + 0.5)


class NoiseSuppressor:
    """One stream's suppressor at one level: 20 ms PCM16 frames in, as many out."""

    def __init__(self, level: int) -> None:
        from webrtc_noise_gain import AudioProcessor  # only a session that asks for it

        self.level = level
        self._processor: AudioProcessor | None = AudioProcessor(0, level)

    def frame(self, frame: bytes) -> bytes:
        """`frame` (20 ms, 16 kHz mono PCM16) cleaned; a short frame passes as it is, and
        so does everything after `close()`."""
        processor = self._processor
        if processor is None or len(frame) != INPUT_FRAME_BYTES:
            return frame
        first = processor.Process10ms(frame[:HALF]).audio
        return bytes(first) + bytes(processor.Process10ms(frame[HALF:]).audio)

    def close(self) -> None:
        """Drop the native state (idempotent)."""
        self._processor = None


class InputNoiseReduction:
    """The session's setting and the suppressor it asks for (none while it is off)."""

    def __init__(self, config: NoiseReductionConfig | None = None) -> None:
        self._type: NoiseType | None = None
        self._suppressor: NoiseSuppressor | None = None
        self.reconfigure(config)

    @property
    def type(self) -> NoiseType | None:
        return self._type

    def reconfigure(self, config: NoiseReductionConfig | None) -> None:
        """Apply a `session.update`: the same type at the same level keeps its adapted
        state; another type or strength starts a fresh suppressor (none at level 0);
        None turns it off."""
        wanted = config.type if config is not None else None
        at = level(config) if config is not None else 0
        current = self._suppressor.level if self._suppressor is not None else 0
        if wanted == self._type and at == current:
            return
        self.close()
        self._type = wanted
        if wanted is not None and at > 0:
            self._suppressor = NoiseSuppressor(at)

    def process(self, frames: list[bytes]) -> list[bytes]:
        suppressor = self._suppressor
        if suppressor is None:
            return frames
        return [suppressor.frame(frame) for frame in frames]

    def close(self) -> None:
        """Off, and the native state dropped (idempotent)."""
        self._type = None
        if self._suppressor is not None:
            self._suppressor.close()
            self._suppressor = None
