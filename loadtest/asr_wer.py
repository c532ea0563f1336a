"""Word error rate and speed of each offline recogniser on the fixed spoken set (issue 12).

    python -m loadtest.asr_wer                      # every recogniser x every voice set
    python -m loadtest.asr_wer --recognizers whisper --sets piper
    python -m loadtest.asr_wer --recognizers whisper --sets piper+white piper+babble \
        --snr 15 5 --noise-reduction off webrtc rnnoise

Prints one row per recogniser and voice set: WER over the 30 sentences (words normalised as in
`loadtest.speech_set`), real-time factor (time spent / audio length), and per-utterance time
p50/p95 in ms, each utterance transcribed once after one warm-up call. The recognisers run on
one CPU thread, as in the Thinker. `--show` prints what each one heard when it was wrong.
`--snr` sets the noisy sets' signal-to-noise ratio; `--noise-reduction` cleans each set first
with an input noise suppressor (loadtest/noise_suppressors.py; one stream per set, as one
session hearing the questions one after another).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from loadtest.noise_suppressors import SUPPRESSORS, suppress
from loadtest.speech_set import SNR_DB, VOICE_SETS, Pcm, Utterance, spoken_set, word_errors
from pipeline.types import INPUT_SAMPLE_RATE

Transcribe = Callable[[Pcm], str]


def _pocketsphinx() -> Transcribe:
    from pipeline.engines.cascade.asr import SpeechRecognizer

    return SpeechRecognizer().transcribe


def _whisper() -> Transcribe:
    from pipeline.engines.cascade.whisper_asr import WhisperRecognizer

    return WhisperRecognizer().transcribe


def _whisper_tiny() -> Transcribe:
    from pipeline.engines.cascade.whisper_asr import TINY_EN, WhisperRecognizer

    return WhisperRecognizer(model=TINY_EN).transcribe


def _whisper_30s() -> Transcribe:
    """faster-whisper's own transcribe: the full 30 s window, greedy, for comparison."""
    from pipeline.engines.cascade.whisper_asr import load_whisper

    model = load_whisper()

    def transcribe(pcm16: Pcm) -> str:
        segments, _ = model.transcribe(
            pcm16.astype(np.float32) / 32768.0,
            language="en",
            beam_size=1,
            without_timestamps=True,
            condition_on_previous_text=False,
        )
        return " ".join(segment.text.strip() for segment in segments)

    return transcribe


RECOGNIZERS: dict[str, Callable[[], Transcribe]] = {
    "pocketsphinx": _pocketsphinx,
    "whisper": _whisper,
    "whisper-tiny": _whisper_tiny,
    "whisper-30s": _whisper_30s,
}


@dataclass
class Row:
    recognizer: str
    voice_set: str
    wer: float
    rtf: float
    p50_ms: float
    p95_ms: float


def measure(
    name: str, transcribe: Transcribe, voice_set: str, utterances: list[Utterance], show: bool
) -> Row:
    transcribe(utterances[0].audio)
    errors = words = 0
    took: list[float] = []
    for utterance in utterances:
        started = time.perf_counter()
        heard = transcribe(utterance.audio)
        took.append(time.perf_counter() - started)
        wrong, count = word_errors(utterance.reference, heard)
        errors, words = errors + wrong, words + count
        if show and wrong:
            print(f"  {name}/{voice_set}: {utterance.reference!r} -> {heard!r}")
    audio_s = sum(len(u.audio) for u in utterances) / INPUT_SAMPLE_RATE
    ms = np.array(took) * 1000
    return Row(
        name,
        voice_set,
        errors / words,
        sum(took) / audio_s,
        float(np.percentile(ms, 50)),
        float(np.percentile(ms, 95)),
    )


def denoised(utterances: list[Utterance], suppressor_name: str) -> list[Utterance]:
    """`utterances` through one stream of the named suppressor, in order."""
    suppressor = SUPPRESSORS[suppressor_name]()
    try:
        return [Utterance(u.reference, suppress(suppressor, u.audio)) for u in utterances]
    finally:
        suppressor.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recognizers", nargs="+", default=list(RECOGNIZERS))
    parser.add_argument("--sets", nargs="+", default=list(VOICE_SETS))
    parser.add_argument("--show", action="store_true", help="print each misheard sentence")
    parser.add_argument("--snr", nargs="+", type=float, default=[SNR_DB], help="noisy sets' dB")
    parser.add_argument("--noise-reduction", nargs="+", default=["off"], choices=list(SUPPRESSORS))
    args = parser.parse_args()
    sets: dict[str, list[Utterance]] = {}
    for name in args.sets:
        for snr in args.snr if "+" in name else [SNR_DB]:
            noisy = list(spoken_set(name, snr_db=snr))
            for cleaner in args.noise_reduction:
                label = (f"{name}@{snr:g}" if "+" in name else name) + (
                    "" if cleaner == "off" else f"/{cleaner}"
                )
                sets[label] = noisy if cleaner == "off" else denoised(noisy, cleaner)
    seconds = [len(u.audio) / INPUT_SAMPLE_RATE for u in next(iter(sets.values()))]
    print(f"{len(seconds)} sentences, {np.mean(seconds):.2f} s of audio on average")
    print(f"{'recognizer':<14}{'voices':<28}{'WER':>7}{'RTF':>7}{'p50 ms':>8}{'p95 ms':>8}")
    for name in args.recognizers:
        transcribe = RECOGNIZERS[name]()
        for voice_set, utterances in sets.items():
            row = measure(name, transcribe, voice_set, utterances, args.show)
            print(
                f"{row.recognizer:<14}{row.voice_set:<28}{row.wer:>7.1%}{row.rtf:>7.3f}"
                f"{row.p50_ms:>8.0f}{row.p95_ms:>8.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
