"""False cut-offs and end-of-turn delay of server_vad and semantic_vad, offline (issue 12).

    python -m loadtest.turn_end_bench            # 30 questions, whole and broken (210 turns)
    python -m loadtest.turn_end_bench --json --asr-ms 150 --sentences 10

Each turn of `loadtest.turn_end_set` goes through the session's `TurnDetector` in 20 ms
frames. At each `SpeechPause` the audio so far (from the turn's start less the prefix
padding, as the session reads it) is recognised with the real Whisper recogniser and
judged; the verdict reaches `judge_pause` after the time the recognition and the judge
took (`--asr-ms` fixes the recognition's), as the session's pause transcript would. Per
mode and judge:

* false cut-offs: turns that ended before the speaker did (inside a hesitation pause);
* delay: from the last voiced sample of a whole question to its end of turn, p50/p95.

Judges (`loadtest.turn_end_judges`): the session's rule, and SmolLM2 scoring the words
three ways, each at the threshold that best separates labelled transcripts (whole question:
finished; words before a hesitation pause: not) by balanced accuracy. The threshold is
cross-validated: chosen on half of the sentences (even or odd) and measured on the other.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from loadtest.speech_set import SENTENCES, Pcm
from loadtest.turn_end_judges import LM_VARIANTS, Score, scorer
from loadtest.turn_end_set import PAUSES_MS, Turn, turns
from pipeline.audio_format import FRAME_MS
from sessions.config import TurnDetectionConfig
from sessions.turn_detection import SpeechEnd, SpeechPause, TurnDetector

PER_MS = 16
"""Samples per millisecond at 16 kHz."""
MODES: dict[str, TurnDetectionConfig] = {
    "server_vad": TurnDetectionConfig(type="server_vad"),
    **{
        f"semantic_{e}": TurnDetectionConfig.model_validate(
            {"type": "semantic_vad", "eagerness": e}
        )
        for e in ("low", "medium", "high")
    },
}
FOLDS = 2
"""An LM judge's threshold for the sentences of one fold is chosen on the others'."""
THRESHOLDS = tuple(float(t) for t in np.geomspace(1e-7, 0.9, 70))

Verdict = Callable[[Pcm], tuple[bool | None, int]]
"""The audio so far -> (sounds finished, ms until the verdict is known)."""


class Hearing:
    """Whisper's words for each stretch of audio, recognised once, with the time it took."""

    def __init__(self) -> None:
        from pipeline.engines.cascade.asr import make_recognizer

        self._recognizer = make_recognizer("whisper")
        self._heard: dict[bytes, tuple[str, float]] = {}

    def __call__(self, audio: Pcm) -> tuple[str, float]:
        key = hashlib.sha1(audio.tobytes()).digest()
        if key not in self._heard:
            started = time.perf_counter()
            words = self._recognizer.transcribe(audio)
            self._heard[key] = (words, (time.perf_counter() - started) * 1000)
        return self._heard[key]

    def times_ms(self) -> list[float]:
        return [ms for _, ms in self._heard.values()]


class Judge:
    """A score over the words, its results kept with the time they took."""

    def __init__(self, name: str, score: Score) -> None:
        self.name, self._score = name, score
        self._scored: dict[str, tuple[float | None, float]] = {}

    def score(self, words: str) -> tuple[float | None, float]:
        if words not in self._scored:
            started = time.perf_counter()
            value = self._score(words)
            self._scored[words] = (value, (time.perf_counter() - started) * 1000)
        return self._scored[words]

    def times_ms(self) -> list[float]:
        return [ms for _, ms in self._scored.values()]


def labelled_pause(turn: Turn, prefix_ms: int) -> tuple[Pcm, bool] | None:
    """The audio the session would recognise at the pause that matters (whole question: the
    one at its end; broken: the hesitation), with whether the words there are finished."""
    detector = TurnDetector(MODES["semantic_low"])  # no end inside a hesitation on silence
    found: list[tuple[int, int]] = []
    for offset in range(0, len(turn.audio) // PER_MS - FRAME_MS + 1, FRAME_MS):
        frame = turn.audio[offset * PER_MS : (offset + FRAME_MS) * PER_MS].tobytes()
        for signal in detector.process(frame, offset):
            if isinstance(signal, SpeechPause):
                found.append((max(0, signal.start_ms - prefix_ms), signal.end_ms))
    if turn.resume_ms is None:
        found = [(b, e) for b, e in found if e >= turn.voice_end_ms - 100]
    else:
        found = [(b, e) for b, e in found if e <= turn.resume_ms]
    if not found:
        return None
    begin, end = found[-1]
    return turn.audio[begin * PER_MS : end * PER_MS], turn.resume_ms is None


def simulate(turn: Turn, config: TurnDetectionConfig, verdict: Verdict | None) -> int | None:
    """When the detector ends `turn` (ms into its audio), judging its pauses with `verdict`;
    None if a broken turn's speaker was not cut off (simulated up to just after they went on)."""
    detector = TurnDetector(config)
    pending: tuple[int, int, bool] | None = None
    """(when the verdict is known, the pause it is about, finished)."""
    stop = len(turn.audio) // PER_MS if turn.resume_ms is None else turn.resume_ms + 200
    for offset in range(0, min(stop, len(turn.audio) // PER_MS - FRAME_MS + 1), FRAME_MS):
        if pending is not None and offset >= pending[0]:
            detector.judge_pause(pending[1], pending[2])
            pending = None
        frame = turn.audio[offset * PER_MS : (offset + FRAME_MS) * PER_MS].tobytes()
        for signal in detector.process(frame, offset):
            if isinstance(signal, SpeechEnd):
                return offset + FRAME_MS
            if isinstance(signal, SpeechPause) and verdict is not None:
                begin = max(0, signal.start_ms - config.prefix_padding_ms)
                finished, wait_ms = verdict(turn.audio[begin * PER_MS : signal.end_ms * PER_MS])
                known = offset + FRAME_MS + wait_ms
                pending = None if finished is None else (known, signal.end_ms, finished)
    return None


def verdict_of(hearing: Hearing, judge: Judge, threshold: float, asr_ms: int | None) -> Verdict:
    """`judge` at `threshold` on what `hearing` hears, known after the recognition (its
    measured time, or `asr_ms`) and the judge (its measured time)."""

    def verdict(audio: Pcm) -> tuple[bool | None, int]:
        words, heard_ms = hearing(audio)
        score, judge_ms = judge.score(words)
        wait = round((heard_ms if asr_ms is None else asr_ms) + judge_ms)
        return (None if score is None else score >= threshold), wait

    return verdict


def choose_threshold(judge: Judge, labelled: list[tuple[str, bool]]) -> dict[str, float]:
    """The one of THRESHOLDS with the best balanced accuracy on `labelled`."""
    scored = [(judge.score(words)[0], finished) for words, finished in labelled]
    best: dict[str, float] = {}
    for threshold in THRESHOLDS:
        said = [(s is not None and s >= threshold, f) for s, f in scored]
        whole = float(np.mean([said for said, f in said if f]))
        broken = float(np.mean([not said for said, f in said if not f]))
        if not best or (whole + broken) / 2 > best["balanced"]:
            best = {"threshold": threshold, "whole_finished": whole, "broken_unfinished": broken}
            best["balanced"] = (whole + broken) / 2
    return best


@dataclass
class Row:
    mode: str
    judge: str
    cut_function_pct: float
    cut_content_pct: float
    cut_by_pause_pct: dict[int, float]
    cut_whole_pct: float
    delay_p50_ms: float
    delay_p95_ms: float
    delay_max_ms: float


def measure(mode: str, judge: str, ends: list[tuple[Turn, int | None]]) -> Row:
    """The figures of one mode and judge from where each turn ended (`simulate`)."""

    def cut_pct(chosen: list[tuple[Turn, int | None]]) -> float:
        cut = [end is not None and end < turn.voice_end_ms for turn, end in chosen]
        return 100.0 * float(np.mean(cut)) if cut else float("nan")

    whole = [(t, e) for t, e in ends if t.kind == "whole"]
    delays = [e - t.voice_end_ms for t, e in whole if e is not None and e >= t.voice_end_ms]
    return Row(
        mode,
        judge,
        cut_pct([(t, e) for t, e in ends if t.kind == "function"]),
        cut_pct([(t, e) for t, e in ends if t.kind == "content"]),
        {p: cut_pct([(t, e) for t, e in ends if t.pause_ms == p]) for p in PAUSES_MS},
        cut_pct(whole),
        float(np.percentile(delays, 50)) if delays else float("nan"),
        float(np.percentile(delays, 95)) if delays else float("nan"),
        float(max(delays)) if delays else float("nan"),
    )


def print_table(rows: list[Row]) -> None:
    pauses_ = "/".join(str(p) for p in PAUSES_MS)
    print(
        f"{'mode':<16}{'judge':<9}{'cut fn%':>8}{'cut cw%':>8}  {'cut % by pause ' + pauses_:<28}"
        f"{'cut whole%':>11}{'delay p50':>10}{'p95':>6}{'max':>6}"
    )
    for r in rows:
        by_pause = " / ".join(f"{v:.0f}" for v in r.cut_by_pause_pct.values())
        print(
            f"{r.mode:<16}{r.judge:<9}{r.cut_function_pct:>8.1f}{r.cut_content_pct:>8.1f}  "
            f"{by_pause:<28}{r.cut_whole_pct:>11.1f}{r.delay_p50_ms:>10.0f}{r.delay_p95_ms:>6.0f}{r.delay_max_ms:>6.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=len(SENTENCES))
    parser.add_argument("--judges", nargs="+", default=["rule", "lm", *LM_VARIANTS])
    parser.add_argument(
        "--asr-ms", type=int, default=None, help="time a recognition takes (default: measured)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    from loadtest.speech_set import piper_speaker

    set_ = turns(piper_speaker(), SENTENCES[: args.sentences])
    hearing = Hearing()
    prefix_ms = MODES["semantic_medium"].prefix_padding_ms
    labelled: list[tuple[int, str, bool]] = []
    """(sentence, words at the pause that matters, whether they are finished)."""
    for turn in set_:
        pause = labelled_pause(turn, prefix_ms)
        if pause is not None:
            labelled.append((turn.sentence, hearing(pause[0])[0], pause[1]))
    judges = [Judge(name, scorer(name)) for name in args.judges]
    folds = [{t.sentence for t in set_ if t.sentence % FOLDS == k} for k in range(FOLDS)]
    chosen: dict[str, list[dict[str, float]]] = {}
    for judge in judges:
        if judge.name != "rule":  # each fold's threshold is chosen on the other folds
            chosen[judge.name] = [
                choose_threshold(judge, [(w, f) for s, w, f in labelled if s not in fold])
                for fold in folds
            ]
    overall = {
        j.name: choose_threshold(j, [(w, f) for _, w, f in labelled])
        for j in judges
        if j.name != "rule"
    }
    server = [(turn, simulate(turn, MODES["server_vad"], None)) for turn in set_]
    rows = [measure("server_vad", "-", server)]
    for mode in ("semantic_low", "semantic_medium", "semantic_high"):
        for judge in judges:
            ends: list[tuple[Turn, int | None]] = []
            for k, fold in enumerate(folds):
                threshold = 0.5 if judge.name == "rule" else chosen[judge.name][k]["threshold"]
                verdict = verdict_of(hearing, judge, threshold, args.asr_ms)
                ends += [(t, simulate(t, MODES[mode], verdict)) for t in set_ if t.sentence in fold]
            rows.append(measure(mode, judge.name, ends))
    asr = np.array(hearing.times_ms())
    timing = {
        "asr_p50_ms": float(np.percentile(asr, 50)),
        **{f"{j.name}_p50_ms": float(np.percentile(j.times_ms(), 50)) for j in judges},
    }
    if args.json:
        print(
            json.dumps(
                {
                    "rows": [asdict(r) for r in rows],
                    "thresholds": chosen,
                    "threshold_on_all": overall,
                    "timing": timing,
                    "turns": len(set_),
                },
                indent=2,
            )
        )
        return
    asr_note = "measured" if args.asr_ms is None else f"{args.asr_ms} ms"
    print(f"{len(set_)} turns; recognition time: {asr_note}; p50 ms: {timing}")
    for name, best in overall.items():
        print(
            f"{name}: threshold chosen on all sentences {best['threshold']:.1e} (whole "
            f"judged finished {best['whole_finished']:.0%}, "
            f"broken judged unfinished {best['broken_unfinished']:.0%})"
        )
    for name, per_fold in chosen.items():
        for k, best in enumerate(per_fold):
            print(
                f"{name} fold {k}: threshold {best['threshold']:.1e} (chosen on the other "
                f"folds: whole judged finished {best['whole_finished']:.0%}, "
                f"broken judged unfinished {best['broken_unfinished']:.0%})"
            )
    print_table(rows)


if __name__ == "__main__":
    main()
