"""The Qwen3-Omni benchmark's figures: per-request timings to per-level figures, the table.

A request's record holds what a client sees (when each text delta and audio chunk arrived,
relative to the request's start); `level_figures` turns one concurrency level's records into
percentiles, per request and in aggregate (all requests of a repetition together). The table
prints beside each phase's rows the graph it measured (the file and the overrides that touch
it), then the transformers baseline as what it is (the time to its finished answer, beside
Parley's own finished answer: `generate` does not stream, so it has no first audio), then
the figures published elsewhere with their hardware and workload (published_figures.py).
`merge` joins the reports of phases run as separate commands.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .bench_graph import FRAME_RATE_HZ
from .bench_graph import header_lines as graph_lines
from .published_figures import published_lines


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50/p90/p95/p99, min, max, mean and n of `values` ({} when there are none)."""
    if not values:
        return {}
    a = np.asarray(values, dtype=np.float64)
    out = {f"p{q}": float(np.percentile(a, q)) for q in (50, 90, 95, 99)}
    out.update(min=float(a.min()), max=float(a.max()), mean=float(a.mean()), n=float(len(a)))
    return out


def playback_stall_s(audio: Sequence[tuple[float, float]]) -> float:
    """How long a player that starts at the first chunk would wait for later ones, in all:
    each chunk plays once it has arrived and the one before has played out."""
    stall = 0.0
    clock = audio[0][0] if audio else 0.0
    for arrived, seconds in audio:
        if arrived > clock:
            stall += arrived - clock
            clock = arrived
        clock += seconds
    return stall


def request_record(
    *,
    text_times: Sequence[float],
    audio: Sequence[tuple[float, float]],
    total_s: float,
    error: str | None,
    rep: int,
) -> dict[str, Any]:
    """One request as a client saw it: text delta times, (time, seconds) per audio chunk."""
    audio_s = sum(seconds for _, seconds in audio)
    times = [at for at, _ in audio]
    thinking = text_times[-1] - text_times[0] if len(text_times) > 1 else 0.0
    speaking = times[-1] - times[0] if len(times) > 1 else 0.0
    after_first = audio_s - audio[0][1] if audio else 0.0
    return {
        "rep": rep,
        "error": error,
        "first_text_s": text_times[0] if text_times else None,
        "last_text_s": text_times[-1] if text_times else None,
        "text_tokens": len(text_times),
        "first_audio_s": times[0] if times else None,
        "last_audio_s": times[-1] if times else None,
        "total_s": total_s,
        "audio_s": audio_s,
        "audio_after_first_s": after_first,
        "rtf": total_s / audio_s if audio_s else None,
        "thinker_tokens_per_s": (len(text_times) - 1) / thinking if thinking else None,
        "talker_frames_per_s": FRAME_RATE_HZ * after_first / speaking if speaking else None,
        "audio_chunk_gap_s": [b - a for a, b in zip(times, times[1:], strict=False)],
        "audio_chunk_s": [seconds for _, seconds in audio],
        "playback_stall_s": playback_stall_s(audio),
    }


def _aggregate(runs: list[dict[str, Any]], first: str, last: str, amount: str) -> float | None:
    """`amount` summed over requests / the span from the earliest `first` to the latest `last`."""
    spans = [(r[first], r[last]) for r in runs if r[first] is not None and r[last] is not None]
    if not spans:
        return None
    span = max(b for _, b in spans) - min(a for a, _ in spans)
    total = sum(float(r[amount]) for r in runs)
    return total / span if span > 0 else None


def level_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One concurrency level: every figure with percentiles over its requests (and reps).

    Per request, Thinker tokens/s is (tokens - 1) / (last - first text delta) and Talker
    frames/s the frames after the first audio chunk over the time from the first chunk to the
    last (as seen at the output, so Code2Wav is in it). Aggregate: the same sums over all
    requests of one repetition, over the span from the earliest first to the latest last."""
    ok = [r for r in runs if not r["error"]]
    reps = sorted({r["rep"] for r in runs})
    by_rep = [[r for r in ok if r["rep"] == rep] for rep in reps]
    for group in by_rep:
        for r in group:
            r["_tokens_after_first"] = max(r["text_tokens"] - 1, 0)
            r["_frames_after_first"] = FRAME_RATE_HZ * r["audio_after_first_s"]
    tokens = [_aggregate(g, "first_text_s", "last_text_s", "_tokens_after_first") for g in by_rep]
    frames = [_aggregate(g, "first_audio_s", "last_audio_s", "_frames_after_first") for g in by_rep]
    for group in by_rep:
        for r in group:
            del r["_tokens_after_first"], r["_frames_after_first"]

    def each(key: str, scale: float = 1.0) -> dict[str, float]:
        return percentiles([scale * r[key] for r in ok if r[key] is not None])

    first_chunks = [r["audio_chunk_s"][0] for r in ok if r["audio_chunk_s"]]
    return {
        "requests": len(runs),
        "errors": [r["error"] for r in runs if r["error"]][:3],
        "error_count": len(runs) - len(ok),
        "first_audio_ms": each("first_audio_s", 1000),
        "first_text_ms": each("first_text_s", 1000),
        "rtf": each("rtf"),
        "total_s": each("total_s"),
        "thinker_tokens_per_s": each("thinker_tokens_per_s"),
        "thinker_tokens_per_s_aggregate": percentiles([t for t in tokens if t is not None]),
        "talker_frames_per_s": each("talker_frames_per_s"),
        "talker_frames_per_s_aggregate": percentiles([f for f in frames if f is not None]),
        "audio_chunk_gap_ms": percentiles([1000 * g for r in ok for g in r["audio_chunk_gap_s"]]),
        "first_chunk_audio_ms": percentiles([1000 * s for s in first_chunks]),
        "playback_stall_ms": each("playback_stall_s", 1000),
        "audio_s": each("audio_s"),
        "text_tokens": each("text_tokens"),
    }


# --- the table -----------------------------------------------------------------------------


def _num(value: Any, spec: str) -> str:
    """`value` formatted, or a dash as wide as the spec asks."""
    if isinstance(value, int | float):
        return format(value, spec)
    width = spec.split(".")[0]
    return "-".rjust(int(width) if width.isdigit() else 1)


def header_lines(head: dict[str, Any]) -> list[str]:
    """The run's header: what ran where, the graph and its overrides, on what input."""
    if not head:
        return []
    given = head.get("input", {})
    return [
        f"commit {str(head.get('commit'))[:12]} (dirty files: {len(head.get('dirty_files', []))}),"
        f" python {head.get('python')}, torch {head.get('torch')} (CUDA {head.get('cuda')}),"
        f" transformers {head.get('transformers')}; {head.get('gpu', 'no GPU')}",
        *graph_lines(head.get("graph") or {}),
        f"input: {given.get('audio_s')} s of audio, {given.get('frames')} frames and a question;"
        f" warm-up {head.get('warmup_requests')}, {head.get('reps_per_level')} rounds per level"
        f" at concurrency {head.get('concurrency')}",
    ]


def _pick(row: dict[str, Any], key: str, stat: str = "p50") -> Any:
    figures = row.get(key)
    return figures.get(stat) if isinstance(figures, dict) else None


def level_keys(phase: dict[str, Any]) -> list[str]:
    """The phase's concurrency levels ("c1", "c4", ...), in numeric order."""
    keys = [k for k in phase if k[:1] == "c" and k[1:].isdigit() and isinstance(phase[k], dict)]
    return sorted(keys, key=lambda k: int(k[1:]))


def table_lines(report: dict[str, Any]) -> list[str]:
    """The summary: one row per (phase, concurrency) with its graph beside it, the baseline,
    the published figures, KV reuse and Code2Wav."""
    lines = header_lines(report.get("header", {}))
    lines += [
        "Qwen3-Omni: first audio (p50 / p95 / mean), RTF (p50), Thinker tokens/s and Talker"
        " frames/s (per request p50 / aggregate p50), peak GPU memory (nvidia-smi, whole"
        " device), playback stall (p50 / p95 over requests: a player starting at the first"
        " chunk waits this long for later ones)",
        f"  {'row':24} {'conc':>4} {'first audio ms':>25} {'RTF':>6} {'tok/s':>13}"
        f" {'frames/s':>13} {'GPU GiB':>8} {'stall ms':>15}",
    ]
    for name in ["parley", *(k for k in report if k.startswith("parley_"))]:
        lines += _phase_rows(name, report.get(name) or {})
    lines += _baseline_lines(report.get("baseline") or {}, report.get("parley") or {})
    lines += ["", *published_lines()]
    lines += _kv_lines(report.get("kv_reuse") or {})
    lines += _code2wav_lines(report.get("code2wav") or {})
    return lines


def _phase_rows(name: str, phase: dict[str, Any]) -> list[str]:
    if not phase:
        return []
    lines = []
    if "error" in phase:
        lines.append(f"  {name:24} {phase['error']}")
    for key in level_keys(phase):
        row = phase[key]
        if row.get("skipped"):
            lines.append(f"  {name:24} {key[1:]:>4} skipped: {row['skipped']}")
            continue
        peak = row.get("peak_gpu_used_gib", phase.get("peak_gpu_used_gib"))
        lines.append(
            f"  {name + ' (measured)':24} {key[1:]:>4}"
            f" {_num(_pick(row, 'first_audio_ms'), '7.0f')} /"
            f"{_num(_pick(row, 'first_audio_ms', 'p95'), '7.0f')} /"
            f"{_num(_pick(row, 'first_audio_ms', 'mean'), '7.0f')}"
            f" {_num(_pick(row, 'rtf'), '6.3f')}"
            f" {_num(_pick(row, 'thinker_tokens_per_s'), '6.1f')}"
            f"/{_num(_pick(row, 'thinker_tokens_per_s_aggregate'), '6.1f')}"
            f" {_num(_pick(row, 'talker_frames_per_s'), '6.1f')}"
            f"/{_num(_pick(row, 'talker_frames_per_s_aggregate'), '6.1f')}"
            f" {_num(peak, '8.1f')}"
            f" {_num(_pick(row, 'playback_stall_ms'), '6.0f')} /"
            f" {_num(_pick(row, 'playback_stall_ms', 'p95'), '6.0f')}"
        )
    if phase.get("graph_note"):
        lines.append(f"    graph: {phase['graph_note']}")
    return lines


def _baseline_lines(phase: dict[str, Any], parley: dict[str, Any]) -> list[str]:
    """transformers' generate(): the time to its finished answer, beside Parley's."""
    if not phase:
        return []
    lines = [
        "",
        "transformers generate() at batch 1 (it does not stream: the time to its finished"
        " answer, not a first audio), p50 / p95 ms and RTF p50, beside Parley's own finished"
        " answer at concurrency 1:",
    ]
    if "error" in phase:
        lines.append(f"  baseline: {phase['error']}")
    row, ours = phase.get("c1") or {}, parley.get("c1") or {}
    if row:
        lines.append(
            f"  transformers: {_num(_pick(row, 'finished_answer_ms'), '.0f')} /"
            f" {_num(_pick(row, 'finished_answer_ms', 'p95'), '.0f')} ms,"
            f" RTF {_num(_pick(row, 'rtf'), '.3f')} ({_num(row.get('requests'), 'd')} answers)"
        )
    if _pick(ours, "total_s") is not None:
        lines.append(
            f"  Parley:       {_num(1000 * _pick(ours, 'total_s'), '.0f')} /"
            f" {_num(1000 * (_pick(ours, 'total_s', 'p95') or 0), '.0f')} ms,"
            f" RTF {_num(_pick(ours, 'rtf'), '.3f')}"
            f" (its first audio: {_num(_pick(ours, 'first_audio_ms'), '.0f')} ms)"
        )
    if phase.get("graph_note"):
        lines.append(f"    graph: {phase['graph_note']}")
    return lines


def _kv_lines(phase: dict[str, Any]) -> list[str]:
    if not phase:
        return []
    if "error" in phase:
        return ["", f"Follow-up turn prefill: {phase['error']}"]
    lines = [
        "",
        f"Follow-up turn prefill (request in -> prompt's hidden states out), p50, reuse by "
        f"{phase.get('mechanism')}:",
    ]
    for key, turn in sorted((k, v) for k, v in phase.items() if k[4:].isdigit()):
        on, off = turn.get("reuse_on", {}), turn.get("reuse_off")
        if off is None:
            lines.append(
                f"  {key} (the session's first): {_num(_pick(on, 'prefill_ms'), '8.1f')} ms"
                f" ({_num(_pick(on, 'prefilled_tokens'), '.0f')} tokens prefilled)"
            )
            continue
        lines.append(
            f"  {key}: with reuse {_num(_pick(on, 'prefill_ms'), '8.1f')} ms"
            f" ({_num(_pick(on, 'prefilled_tokens'), '.0f')} tokens prefilled),"
            f" without {_num(_pick(off, 'prefill_ms'), '8.1f')} ms"
            f" ({_num(_pick(off, 'prefilled_tokens'), '.0f')} tokens);"
            f" speed-up {_num(turn.get('speedup_p50'), '.2f')}x,"
            f" {turn.get('turns_reused')} of {_num(_pick(on, 'prefill_ms', 'n'), '.0f')} reused"
        )
    if phase.get("graph_note"):
        lines.append(f"    graph: {phase['graph_note']}")
    return lines


def _code2wav_lines(phase: dict[str, Any]) -> list[str]:
    if not phase:
        return []
    if "error" in phase:
        return ["", f"Code2Wav per chunk: {phase['error']}"]
    lines = [
        "",
        "Code2Wav time per chunk (the engine alone, chunks decoded in batches), p50 / p95:",
    ]
    for key in level_keys(phase):
        row = phase[key]
        first, steady = row.get("first_chunk_ms", {}), row.get("chunk_ms", {})
        lines.append(
            f"  batch {key[1:]:>3}: first chunk ({row.get('first_chunk_frames')} frames)"
            f" {_num(first.get('p50'), '7.1f')} / {_num(first.get('p95'), '7.1f')} ms,"
            f" later chunks ({row.get('chunk_frames')} + {row.get('left_context')} context)"
            f" {_num(steady.get('p50'), '7.1f')} / {_num(steady.get('p95'), '7.1f')} ms"
        )
    if phase.get("graph_note"):
        lines.append(f"    graph: {phase['graph_note']} (max_batch {phase.get('max_batch')})")
    return lines


def merge(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Reports of separate commands as one: phases side by side, a phase's levels joined.

    Each level keeps the index of the header it came from (`header_index`), and the report
    keeps every header: runs of different commits or versions are not hidden."""
    merged: dict[str, Any] = {"header": reports[0].get("header", {}), "headers": []}
    for index, report in enumerate(reports):
        merged["headers"].append(report.get("header", {}))
        for name, phase in report.items():
            if name in ("header", "headers") or not isinstance(phase, dict):
                continue
            into = merged.setdefault(name, {})
            for key, value in phase.items():
                if isinstance(value, dict) and key in level_keys(phase):
                    value = {**value, "header_index": index}
                if key in level_keys(phase) or key not in into:
                    into[key] = value
    commits = {h.get("commit") for h in merged["headers"]}
    merged["same_commit"] = len(commits) == 1
    return merged
