"""False cut-offs and end-of-turn delay of server_vad and semantic_vad, offline (issue 12).

    python -m loadtest.turn_end_bench            # 30 questions, whole and broken (210 turns)
    python -m loadtest.turn_end_bench --json --asr-ms 150 --sentences 10
    python -m loadtest.turn_end_bench --breaks cut   # hesitations that sound unfinished

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
finished; words before a hesitation pause: not) by balanced accuracy; and Smart Turn v3.2
(`smart-turn`, sessions/smart_turn.py) scoring the audio itself up to the pause, with no
recognition before it, its threshold chosen the same way on the labelled pauses' audio;
and `lm+smart-turn`, SmolLM2's verdict with a "finished" the sound disagrees with left to
the silence window (`vetoed`). The threshold is cross-validated: chosen on half of the
sentences (even or odd) and measured on the other.

Voice detectors (the `vad` column): webrtcvad, the session's, and Silero VAD v6
(sessions/silero_vad.py) in its place, with server_vad's window at 500 ms and shorter.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

import numpy as np

from loadtest.speech_set import SENTENCES, Pcm
from loadtest.turn_end_judges import (
    AUDIO_JUDGES,
    LM_VARIANTS,
    AudioScore,
    Score,
    audio_scorer,
    scorer,
)
from loadtest.turn_end_set import PAUSES_MS, Turn, turns
from pipeline.audio_format import FRAME_MS
from sessions.config import TurnDetectionConfig
from sessions.silero_vad import SileroVoice
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
SILERO_SERVER_MS = (500, 300)
"""server_vad's silence windows measured with Silero as the voice detector."""
FOLDS = 2
"""An LM judge's threshold for the sentences of one fold is chosen on the others'."""
THRESHOLDS = tuple(float(t) for t in np.geomspace(1e-7, 0.9, 70))
AUDIO_THRESHOLDS = tuple(float(t) for t in np.linspace(0.02, 0.98, 49))
"""Smart Turn's probabilities spread over [0, 1], not over decades as P(<|im_end|>) does."""

Verdict = Callable[[Pcm, int], tuple[bool | None, int]]
"""The turn's audio so far (to the pause's report) and the samples of it up to the voice's
end -> (sounds finished, ms until the verdict is known)."""
Voice = Callable[[], Callable[[bytes], bool]]
"""A fresh voice detector for a turn (None: webrtcvad)."""


class Hearing:
    """Whisper's words for each stretch of audio, recognised once, with the time it took."""

    def __init__(self, recognizer: str = "whisper") -> None:
        from pipeline.engines.cascade.asr import make_recognizer

        self._recognizer = make_recognizer(recognizer)
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


class AudioJudge:
    """A score over the audio itself, its results kept with the time they took."""

    def __init__(self, name: str, score: AudioScore) -> None:
        self.name, self._score = name, score
        self._scored: dict[bytes, tuple[float, float]] = {}

    def score(self, audio: Pcm) -> tuple[float, float]:
        key = hashlib.sha1(audio.tobytes()).digest()
        if key not in self._scored:
            started = time.perf_counter()
            value = self._score(audio)
            self._scored[key] = (value, (time.perf_counter() - started) * 1000)
        return self._scored[key]

    def times_ms(self) -> list[float]:
        return [ms for _, ms in self._scored.values()]


def labelled_pause(turn: Turn, prefix_ms: int) -> tuple[Pcm, int, bool] | None:
    """The audio the session has at the pause that matters (whole question: the one at its
    end; broken: the hesitation), as far as the pause's report, with the samples of it up
    to the voice's end (what is recognised) and whether the words there are finished."""
    detector = TurnDetector(MODES["semantic_low"])  # no end inside a hesitation on silence
    found: list[tuple[int, int, int]] = []
    for offset in range(0, len(turn.audio) // PER_MS - FRAME_MS + 1, FRAME_MS):
        frame = turn.audio[offset * PER_MS : (offset + FRAME_MS) * PER_MS].tobytes()
        for signal in detector.process(frame, offset):
            if isinstance(signal, SpeechPause):
                begin = max(0, signal.start_ms - prefix_ms)
                found.append((begin, signal.end_ms, offset + FRAME_MS))
    if turn.resume_ms is None:
        found = [(b, e, n) for b, e, n in found if e >= turn.voice_end_ms - 100]
    else:
        found = [(b, e, n) for b, e, n in found if e <= turn.resume_ms]
    if not found:
        return None
    begin, end, now = found[-1]
    return turn.audio[begin * PER_MS : now * PER_MS], (end - begin) * PER_MS, turn.resume_ms is None


def simulate(
    turn: Turn, config: TurnDetectionConfig, verdict: Verdict | None, voice: Voice | None = None
) -> int | None:
    """When the detector ends `turn` (ms into its audio), judging its pauses with `verdict`;
    None if a broken turn's speaker was not cut off (simulated up to just after they went on)."""
    detector = TurnDetector(config, None if voice is None else voice())
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
                now = offset + FRAME_MS
                audio = turn.audio[begin * PER_MS : now * PER_MS]
                finished, wait_ms = verdict(audio, (signal.end_ms - begin) * PER_MS)
                known = now + wait_ms
                pending = None if finished is None else (known, signal.end_ms, finished)
    return None


def verdict_of(hearing: Hearing, judge: Judge, threshold: float, asr_ms: int | None) -> Verdict:
    """`judge` at `threshold` on what `hearing` hears, known after the recognition (its
    measured time, or `asr_ms`) and the judge (its measured time)."""

    def verdict(audio: Pcm, voiced: int) -> tuple[bool | None, int]:
        words, heard_ms = hearing(audio[:voiced])
        score, judge_ms = judge.score(words)
        wait = round((heard_ms if asr_ms is None else asr_ms) + judge_ms)
        return (None if score is None else score >= threshold), wait

    return verdict


def audio_verdict_of(judge: AudioJudge, threshold: float) -> Verdict:
    """`judge` at `threshold` on the audio as far as the pause, known after its measured
    time (no recognition before it)."""

    def verdict(audio: Pcm, voiced: int) -> tuple[bool | None, int]:
        score, judge_ms = judge.score(audio)
        return score >= threshold, round(judge_ms)

    return verdict


def vetoed(words: Verdict, sound: Verdict) -> Verdict:
    """The words' verdict, except that "finished" where the sound disagrees is left to the
    silence window (None); known once both are (they run side by side)."""

    def verdict(audio: Pcm, voiced: int) -> tuple[bool | None, int]:
        finished, wait = words(audio, voiced)
        sounds_finished, sound_wait = sound(audio, voiced)
        if finished and not sounds_finished:
            finished = None
        return finished, max(wait, sound_wait)

    return verdict


def choose_threshold(
    judge: Judge, labelled: list[tuple[str, bool]], thresholds: tuple[float, ...] = THRESHOLDS
) -> dict[str, float]:
    """The one of `thresholds` with the best balanced accuracy on `labelled` words."""
    return best_threshold([(judge.score(w)[0], f) for w, f in labelled], thresholds)


def best_threshold(
    scored: list[tuple[float | None, bool]], thresholds: tuple[float, ...]
) -> dict[str, float]:
    """The one of `thresholds` with the best balanced accuracy on (score, finished) pairs."""
    best: dict[str, float] = {}
    for threshold in thresholds:
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
    vad: str
    cut_function_pct: float
    cut_content_pct: float
    cut_by_pause_pct: dict[int, float]
    cut_whole_pct: float
    delay_p50_ms: float
    delay_p95_ms: float
    delay_max_ms: float


def measure(mode: str, judge: str, ends: list[tuple[Turn, int | None]], vad: str = "webrtc") -> Row:
    """The figures of one mode and judge from where each turn ended (`simulate`)."""

    def cut_pct(chosen: list[tuple[Turn, int | None]]) -> float:
        cut = [end is not None and end < turn.voice_end_ms for turn, end in chosen]
        return 100.0 * float(np.mean(cut)) if cut else float("nan")

    whole = [(t, e) for t, e in ends if t.kind == "whole"]
    delays = [e - t.voice_end_ms for t, e in whole if e is not None and e >= t.voice_end_ms]
    return Row(
        mode,
        judge,
        vad,
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
        f"{'mode':<20}{'judge':<11}{'vad':<7}{'cut fn%':>8}{'cut cw%':>8}  "
        f"{'cut % by pause ' + pauses_:<28}"
        f"{'cut whole%':>11}{'delay p50':>10}{'p95':>6}{'max':>6}"
    )
    for r in rows:
        by_pause = " / ".join(f"{v:.0f}" for v in r.cut_by_pause_pct.values())
        print(
            f"{r.mode:<20}{r.judge:<11}{r.vad:<7}"
            f"{r.cut_function_pct:>8.1f}{r.cut_content_pct:>8.1f}  "
            f"{by_pause:<28}{r.cut_whole_pct:>11.1f}{r.delay_p50_ms:>10.0f}{r.delay_p95_ms:>6.0f}{r.delay_max_ms:>6.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=len(SENTENCES))
    parser.add_argument("--judges", nargs="+", default=["rule", "lm", *LM_VARIANTS, *AUDIO_JUDGES])
    parser.add_argument(
        "--asr-ms", type=int, default=None, help="time a recognition takes (default: measured)"
    )
    parser.add_argument(
        "--breaks",
        choices=("spoken", "cut"),
        default="spoken",
        help="broken turns' first part spoken alone (falling pitch) or cut from the whole",
    )
    parser.add_argument(
        "--recognizer",
        choices=("whisper", "whisper-tiny"),
        default="whisper",
        help="the recogniser heard at each pause (Whisper base or tiny.en)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    from loadtest.speech_set import piper_speaker
    from loadtest.turn_end_set import piper_cutter

    cut = piper_cutter() if args.breaks == "cut" else None
    set_ = turns(piper_speaker(), SENTENCES[: args.sentences], cut=cut)
    hearing = Hearing(args.recognizer)
    prefix_ms = MODES["semantic_medium"].prefix_padding_ms
    labelled: list[tuple[int, Pcm, int, bool]] = []
    """(sentence, audio at the pause that matters, its voiced samples, finished)."""
    for turn in set_:
        pause = labelled_pause(turn, prefix_ms)
        if pause is not None:
            labelled.append((turn.sentence, *pause))
    judges = [Judge(n, scorer(n)) for n in args.judges if n not in AUDIO_JUDGES]
    audio_judges = [AudioJudge(n, audio_scorer(n)) for n in args.judges if n in AUDIO_JUDGES]
    all_judges: list[Judge | AudioJudge] = [*judges, *audio_judges]

    def scored(judge: Judge | AudioJudge, sentences: set[int]) -> list[tuple[float | None, bool]]:
        if isinstance(judge, AudioJudge):
            return [(judge.score(a)[0], f) for s, a, _, f in labelled if s in sentences]
        return [(judge.score(hearing(a[:v])[0])[0], f) for s, a, v, f in labelled if s in sentences]

    every = {t.sentence for t in set_}
    folds = [{s for s in every if s % FOLDS == k} for k in range(FOLDS)]
    chosen: dict[str, list[dict[str, float]]] = {}
    overall: dict[str, dict[str, float]] = {}
    for judge in all_judges:
        if judge.name != "rule":  # each fold's threshold is chosen on the other folds
            grid = AUDIO_THRESHOLDS if isinstance(judge, AudioJudge) else THRESHOLDS
            chosen[judge.name] = [best_threshold(scored(judge, every - f), grid) for f in folds]
            overall[judge.name] = best_threshold(scored(judge, every), grid)

    def verdict_for(judge: Judge | AudioJudge, k: int) -> Verdict:
        threshold = 0.5 if judge.name == "rule" else chosen[judge.name][k]["threshold"]
        if isinstance(judge, AudioJudge):
            return audio_verdict_of(judge, threshold)
        return verdict_of(hearing, judge, threshold, args.asr_ms)

    def run(
        mode: str,
        config: TurnDetectionConfig,
        judge: str,
        verdicts: Callable[[int], Verdict | None],
        voice: Voice | None = None,
    ) -> Row:
        """`verdicts(k)`: the verdict for the sentences of fold k (None: no judge)."""
        ends: list[tuple[Turn, int | None]] = []
        for k, fold in enumerate(folds):
            verdict = verdicts(k)
            ends += [(t, simulate(t, config, verdict, voice)) for t in set_ if t.sentence in fold]
        return measure(mode, judge, ends, "webrtc" if voice is None else "silero")

    def vetoed_in_fold(words: Judge, sound: AudioJudge, k: int) -> Verdict:
        return vetoed(verdict_for(words, k), verdict_for(sound, k))

    rows = [run("server_vad", MODES["server_vad"], "-", lambda k: None)]
    for window in SILERO_SERVER_MS:
        config = TurnDetectionConfig(type="server_vad", silence_duration_ms=window)
        rows.append(run(f"server_vad {window}ms", config, "-", lambda k: None, SileroVoice))
    lm = next((j for j in judges if j.name == "lm"), None)
    for mode in ("semantic_low", "semantic_medium", "semantic_high"):
        for judge in all_judges:
            rows.append(run(mode, MODES[mode], judge.name, partial(verdict_for, judge)))
        for sound in audio_judges:
            rows.append(
                run(mode, MODES[mode], sound.name, partial(verdict_for, sound), SileroVoice)
            )
            if lm is not None:
                both = partial(vetoed_in_fold, lm, sound)
                rows.append(run(mode, MODES[mode], f"lm+{sound.name}", both))
    asr = np.array(hearing.times_ms())
    timing = {"asr_p50_ms": float(np.percentile(asr, 50))}
    for j in all_judges:
        timing[f"{j.name}_p50_ms"] = float(np.percentile(j.times_ms(), 50))
        timing[f"{j.name}_p95_ms"] = float(np.percentile(j.times_ms(), 95))
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
