"""Input noise reduction (issue 45 item 3): what each suppressor does for recognition, for
turn detection in noise, and what it costs.

    python -m loadtest.noise_reduction_bench            # ~5 min on two busy cores
    python -m loadtest.noise_reduction_bench --quick    # 10 sentences, 20 s of noise
    python -m loadtest.noise_reduction_bench --no-wer   # turns in noise and CPU (~1 min)

For white and babble noise at 15 and 5 dB SNR (loadtest/speech_set.py's spoken set, Piper's
voice, seeded) and each suppressor of loadtest/noise_suppressors.py (off, WebRTC at levels 1-3:
far_field is 1, near_field 2; RNNoise):

- word error rate of Whisper base (the cascade's recogniser) on the 30 questions, each set
  cleaned as one stream (one session hearing them in turn);
- false turn starts: noise alone (60 s of each, at the level it has in the set) through the
  server's turn detector (sessions/turn_detection.py, server_vad defaults), counting
  `speech_started` and the seconds spent inside a turn (a start the noise holds open);
- CPU per 20 ms frame (mean and p99 of each frame's time over the noise, one thread).

Prints a table and writes the figures, the machine's load average and the source's commit
to loadtest/results/noise_reduction_cpu_<date>.json (`--out` for another path).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.asr_wer import RECOGNIZERS, denoised, measure
from loadtest.noise_suppressors import SUPPRESSORS, Suppressor
from loadtest.run_stamp import source_stamp
from loadtest.speech_set import SENTENCES, Pcm, noise_only, piper_speaker, spoken_set
from pipeline.audio_format import INPUT_FRAME_BYTES
from sessions.config import TurnDetectionConfig
from sessions.turn_detection import SpeechStart, TurnDetector

CLEANERS = ("off", "webrtc-1", "webrtc-2", "webrtc-3", "rnnoise")
NOISES = ("white", "babble")
SNRS = (15.0, 5.0)


def timed_frames(suppressor: Suppressor, pcm: Pcm) -> tuple[list[bytes], list[float]]:
    """`pcm`'s whole frames through `suppressor`, and each frame's time in us."""
    data = pcm.astype("<i2").tobytes()
    out: list[bytes] = []
    took: list[float] = []
    for i in range(0, len(data) - INPUT_FRAME_BYTES + 1, INPUT_FRAME_BYTES):
        started = time.perf_counter_ns()
        out.append(suppressor.frame(data[i : i + INPUT_FRAME_BYTES]))
        took.append((time.perf_counter_ns() - started) / 1000)
    return out, took


def false_starts(frames: list[bytes]) -> tuple[int, float]:
    """`speech_started` the server's turn detector gives for `frames` (noise alone), and
    the seconds of them it spends inside a turn (a start the noise holds open)."""
    detector = TurnDetector(TurnDetectionConfig())
    starts = in_turn = 0
    for index, frame in enumerate(frames):
        signals = detector.process(frame, index * 20)
        starts += sum(isinstance(signal, SpeechStart) for signal in signals)
        in_turn += detector.in_speech
    return starts, in_turn * 0.02


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 sentences, 20 s of noise")
    parser.add_argument("--cleaners", nargs="+", default=list(CLEANERS), choices=SUPPRESSORS)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-wer", action="store_true", help="turns in noise and CPU only")
    args = parser.parse_args()
    sentences = SENTENCES[:10] if args.quick else SENTENCES
    noise_s = 20.0 if args.quick else 60.0
    load = os.getloadavg()
    report: dict[str, Any] = {
        "source": source_stamp(),
        "machine": {"cpus": os.cpu_count(), "loadavg_start": load},
        "sentences": len(sentences),
        "noise_seconds": noise_s,
        "recognizer": "whisper (base, one thread)",
        "rows": [],
    }
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    say = piper_speaker()
    clean = [say(text) for text in sentences]
    transcribe = RECOGNIZERS["whisper"]() if not args.no_wer else None
    header = f"{'noise':<10}{'SNR':>5}  {'suppressor':<13}{'WER':>7}{'starts':>8}"
    print(header + f"{'in turn s':>11}{'us/frame':>10}{'p99 us':>8}")
    for noise in NOISES:
        for snr in SNRS:
            noisy = list(spoken_set(f"piper+{noise}", sentences, snr_db=snr))
            alone = noise_only(noise, clean, noise_s, snr)
            for cleaner in args.cleaners:
                wer = None
                if transcribe is not None:
                    utterances = noisy if cleaner == "off" else denoised(noisy, cleaner)
                    row = measure("whisper", transcribe, f"{noise}@{snr:g}", utterances, False)
                    wer = round(row.wer, 4)
                suppressor = SUPPRESSORS[cleaner]()
                try:
                    frames, took = timed_frames(suppressor, alone)
                finally:
                    suppressor.close()
                starts, in_turn_s = false_starts(frames)
                figures = {
                    "noise": noise,
                    "snr_db": snr,
                    "suppressor": cleaner,
                    "wer": wer,
                    "speech_started_in_noise": starts,
                    "seconds_in_a_turn_in_noise": round(in_turn_s, 2),
                    "us_per_frame_mean": round(float(np.mean(took)), 1),
                    "us_per_frame_p99": round(float(np.percentile(took, 99)), 1),
                }
                report["rows"].append(figures)
                print(
                    f"{noise:<10}{snr:>5g}  {cleaner:<13}"
                    + (f"{wer:>7.1%}" if wer is not None else f"{'-':>7}")
                    + f"{starts:>8}{in_turn_s:>11.1f}"
                    f"{figures['us_per_frame_mean']:>10.1f}{figures['us_per_frame_p99']:>8.1f}",
                    flush=True,
                )
    report["machine"]["loadavg_end"] = os.getloadavg()
    out = args.out or Path(__file__).parent / "results" / (
        f"noise_reduction_cpu_{time.strftime('%Y-%m-%d')}.json"
    )
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"load average at the end {report['machine']['loadavg_end'][0]:.2f}; wrote {out}")


if __name__ == "__main__":
    main()
