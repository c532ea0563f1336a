"""Figures measured elsewhere that Parley's are read against, each with the hardware and the
workload it was measured on, as published: never measured by these scripts, and never
comparable to a row of ours without those two (a figure on three GPUs with 2,500 prompt
tokens is not one on one GPU with 439).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Published:
    who: str
    hardware: str
    workload: str
    figure: str
    """What was measured, and which statistic (a mean is not a median)."""
    ms_at: Mapping[int, float]
    """Concurrency -> milliseconds."""
    source: str
    rtf_note: str = ""

    def line(self) -> str:
        levels = ", ".join(f"{ms:,.0f} ms at {c}" for c, ms in sorted(self.ms_at.items()))
        rtf = f"; {self.rtf_note}" if self.rtf_note else ""
        return (
            f"{self.who}, {self.hardware}; {self.workload}: {self.figure} {levels}{rtf}"
            f" ({self.source})"
        )


VLLM_OMNI_3X_H100 = Published(
    who="vLLM-Omni",
    hardware="3x H100 (the Thinker on one GPU; two Talker and two Code2Wav replicas)",
    workload="2,500 tokens in, 900 out",
    figure="mean time to first audio",
    ms_at={8: 325, 16: 603, 32: 1024},
    source="the vLLM-Omni team's post of 2026-07-01, as issue 41 quotes it",
)
VLLM_OMNI_2X_H800 = Published(
    who="vLLM-Omni",
    hardware="2x H800, async chunk on",
    workload="workload not stated where quoted",
    figure="time to first audio packet",
    ms_at={1: 523, 4: 786, 10: 1629},
    source="as issue 9 quotes it",
    rtf_note="RTF quoted as 0.22 / 0.41 for the three levels (two figures for three)",
)
QWEN_THEORETICAL = Published(
    who="Qwen3-Omni",
    hardware="its technical report",
    workload="theoretical",
    figure="first packet",
    ms_at={1: 234},
    source="as issue 9 quotes it",
)
PUBLISHED = (VLLM_OMNI_3X_H100, VLLM_OMNI_2X_H800, QWEN_THEORETICAL)
TARGETS = "targets (issue 9): first audio <= 300 ms p50 and RTF <= 0.2 at 1; <= 800 ms, 0.4 at 10"


def published_lines() -> list[str]:
    """The block printed under a table of our figures."""
    lines = ["Published elsewhere, not measured here (hardware and workload as published):"]
    lines += [f"  {p.line()}" for p in PUBLISHED]
    lines.append(f"  {TARGETS}")
    return lines
