"""Decode layers compiled by `torch.compile`: fewer, fused kernels per captured step.

A captured decode step still runs every kernel it recorded, and a decoder layer at decode
size is some forty small ones (norms, rotary, attention, residual adds), each a few
microseconds of a GPU that reads the layer's weights in far less: a step is bound by its
kernel count, not by memory. Inductor fuses the elementwise ones.

Where it pays today: the Talker's code predictor (15 codes x 5 small dense layers a frame).
Compiled a layer at a time (regional compilation): Dynamo specialises each layer (its cache
index), so the recompile limit is raised to hold them all. The compile runs on a step's
first call, which `StepGraphs` makes before it captures; replays never run Python. Measured
on the H200 and left off: the Thinker's and Talker LM's MoE steps, traced whole (48 layers
unrolled) or a layer at a time, had not finished compiling after five minutes.

transformers 5.x records hidden states and attentions through a forward hook on every
decoder layer and attention module; the hook reads a `ContextVar`, which Dynamo cannot trace
(a graph break in every layer). Parley's steps call the layers directly and never collect
outputs through those hooks, so inside a compiled region the collector reads as empty
(`_QuietCollector`); everywhere else it behaves as transformers' own (a prefill's
`output_hidden_states` still works).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

RECOMPILE_LIMIT = 256
"""Compiled variants of the layer call a process may hold: one per layer (a predictor has
5), per query length (2 for a frame's first code, 1 after), static and dynamic batch."""


def compiled_layer_call() -> Any:
    """`slot_decoder.call_layer`, compiled (Dynamo traces it at each layer's first call)."""
    from .slot_decoder import call_layer  # here: slot_decoder imports this module

    quiet_output_capture()
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = max(limit, RECOMPILE_LIMIT)
    # fallback_random: what draws randomness inside draws as the eager layer does
    return torch.compile(call_layer, options={"fallback_random": True})


def _output_capturing() -> Any:
    """transformers 5's output-capturing module; None under 4.x (no such hooks)."""
    try:
        return importlib.import_module("transformers.utils.output_capturing")
    except ImportError:
        return None


_CAPTURING = _output_capturing()


class _QuietCollector(_CAPTURING.CompileableContextVar if _CAPTURING else object):  # type: ignore[misc]
    """transformers' collector, empty while Dynamo traces (the steps collect nothing)."""

    def get(self) -> Any:
        if torch.compiler.is_compiling():
            return None
        return super().get()


def quiet_output_capture() -> bool:
    """Make transformers' output-capturing hooks traceable; whether there were any (5.x).
    Idempotent."""
    if _CAPTURING is None:
        return False
    collector = _CAPTURING._active_collector
    if not isinstance(collector, _QuietCollector):
        quiet = _QuietCollector.__new__(_QuietCollector)
        quiet.__dict__.update(collector.__dict__)  # the same ContextVar: values set stay seen
        _CAPTURING._active_collector = quiet
    return True
