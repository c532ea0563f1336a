"""Decoding a turn that may call a tool: the call-or-answer decision and the constrained call.

Why llguidance. The arguments must always parse and validate, so the model may only pick
tokens that keep the text inside the call grammar (`tool_prompt.call_grammar`: marker, a tool
name, arguments under that tool's JSON schema). llguidance compiles JSON schemas (objects,
`required`, `additionalProperties`, enums, nested objects, arrays, numbers, ...) into a
token-level matcher in Rust: one 3 MB wheel with no dependencies, works offline from the
HF tokenizer we already load, ~0.3 s to index SmolLM2's 49k-token vocabulary once, and a mask
costs well under a millisecond per step. A hand-written constraint would have had to
reimplement exactly that, with the token-boundary cases (`",` or `}}` span two JSON parts).

How the model decides (tool_choice auto). A 135M model never writes the call marker on its
own (its greedy first token is text even for "What is the weather in Paris?" with a weather
tool listed), but the marker's log-probability at the first step does move with the question:
it is higher when a listed tool fits. So the first step compares log P(first marker token)
with `threshold` (measured with `python -m loadtest.tool_calls`): above it the turn becomes a
call and every later token is masked by the grammar; below it the marker is banned and the
reply is free text. `required` (or a named tool) skips the decision. The decision rides in
the same batched forward pass as everything else: no extra model call.

A reply in words never writes a token that starts with '<' (the marker's first): with a call
in its history, SmolLM2 otherwise copied it as text (the turn after a tool's output
"answered" `<tool_call>{...}</tool_call>`, and the Talker spoke it).

Everything here runs on the Thinker's model thread, inside `generate`.
"""

from __future__ import annotations

import copy
import json
import threading
from typing import Any, Literal

import llguidance
import numpy as np
import torch

from .smollm import LanguageModel
from .tool_prompt import CALL_OPEN

_tokenizers: dict[int, tuple[LanguageModel, llguidance.LLTokenizer, torch.Tensor, int]] = {}
_lock = threading.Lock()


class ToolGrammarError(ValueError):
    """A tool's schema is one the constraint cannot compile."""


def _byte_level_fixed(tokenizer_json: str) -> str:
    """SmolLM2's tokenizer (as transformers rebuilds it from GGUF) chains a ByteFallback
    decoder before its ByteLevel one; llguidance then reads every byte-level token as raw
    bytes (`Ġ` instead of a space). Its pre-tokenizer is byte-level: say so in the decoder."""
    spec: dict[str, Any] = json.loads(tokenizer_json)
    decoder = spec.get("decoder") or {}
    parts = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else [decoder]
    byte_level = [p for p in parts if isinstance(p, dict) and p.get("type") == "ByteLevel"]
    pre = spec.get("pre_tokenizer") or {}
    if byte_level and "ByteLevel" in json.dumps(pre):
        spec["decoder"] = byte_level[0]
    return json.dumps(spec)


def _index(lm: LanguageModel) -> tuple[llguidance.LLTokenizer, torch.Tensor, int]:
    """llguidance's view of the model's tokenizer, which tokens start with '<', and the call
    marker's first token, found once (at `prepare`): the model's own tokenizer is not used
    again from the thread a tool turn runs in, beside the loop's (a Rust tokenizer used from
    two threads at once fails, "Already borrowed")."""
    with _lock:
        known = _tokenizers.get(id(lm))
        if known is None or known[0] is not lm:
            backend = copy.copy(lm.tokenizer.backend_tokenizer)
            backend.no_padding()
            backend.no_truncation()
            tokenizer = llguidance.LLTokenizer(
                _byte_level_fixed(backend.to_str()), eos_token=list(lm.stop_token_ids)
            )
            texts = lm.tokenizer.batch_decode([[i] for i in range(tokenizer.vocab_size)])
            angled = torch.tensor([t.startswith("<") for t in texts], dtype=torch.bool)
            angled[list(lm.stop_token_ids)] = False  # "<|im_end|>" must stay: it ends the turn
            marker = int(lm.tokenizer(CALL_OPEN, add_special_tokens=False).input_ids[0])
            known = _tokenizers[id(lm)] = (lm, tokenizer, angled, marker)
        return known[1], known[2], known[3]


def prepare(lm: LanguageModel) -> None:
    """Index the tokenizer now (at start) rather than in the first tool turn."""
    _index(lm)


Mode = Literal["auto", "call", "text"]
"""auto: the first step decides; call: the turn is a call; text: it is not (no marker)."""


class CallConstraint:
    """One row's rule: decide (auto) whether to call, then keep a call inside the grammar;
    a turn in words never writes a call marker (any token starting with '<')."""

    def __init__(
        self,
        lm: LanguageModel,
        grammar: str | None,
        *,
        mode: Mode,
        threshold: float = -6.0,
        text_tokens: int = 64,
    ) -> None:
        tokenizer, self._angled, self._marker = _index(lm)
        self._matcher: llguidance.LLMatcher | None = None
        if grammar is not None:
            self._matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
            if self._matcher.is_error():
                raise ToolGrammarError(self._matcher.get_error().splitlines()[0])
        elif mode != "text":
            raise ValueError("a turn that may call needs the call grammar")
        self._vocab = tokenizer.vocab_size
        self._stop = lm.stop_token_ids[0]
        self.threshold = threshold
        self.calling: bool | None = {"auto": None, "call": True, "text": False}[mode]
        """None until the first step decides; True: the turn is a call; False: text."""
        self.marker_logprob: float | None = None
        """log P(first marker token) at the first step (what the decision compared)."""
        self._steps = 0
        self._text_tokens = text_tokens
        """A row that answers in text ends after this many tokens (its budget covers a call)."""

    def apply(self, last_token: int | None, scores: torch.Tensor) -> None:
        """Mask one row's next-token scores in place; `last_token` is what the row picked
        at the previous step (None at the first)."""
        first = self._steps == 0
        self._steps += 1
        if first:
            logprobs = torch.log_softmax(scores.float(), dim=-1)
            self.marker_logprob = float(logprobs[self._marker])
            if self.calling is None:
                self.calling = self.marker_logprob >= self.threshold
        elif self.calling and last_token is not None and self._matcher is not None:
            self._matcher.consume_token(last_token)
        if not self.calling:
            if self._steps <= self._text_tokens:
                scores[: len(self._angled)].masked_fill_(self._angled, float("-inf"))
                return
            allowed = torch.zeros(scores.shape[-1], dtype=torch.bool)
            allowed[self._stop] = True
        elif self._matcher is None or self._matcher.is_stopped() or self._matcher.is_error():
            allowed = torch.zeros(scores.shape[-1], dtype=torch.bool)
            allowed[self._stop] = True
        else:
            bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
            unpacked = np.unpackbits(bits, bitorder="little")[: self._vocab].astype(bool)
            allowed = torch.zeros(scores.shape[-1], dtype=torch.bool)
            size = min(len(unpacked), scores.shape[-1])
            allowed[:size] = torch.from_numpy(unpacked[:size])
        scores.masked_fill_(~allowed, float("-inf"))
