"""Batched, streamed chat generation: the Thinker's model runner.

How batching works. Each request becomes a row: its chat prompt, its token budget and the
event loop of the task reading it. Rows go to a `BatchWorker`: one thread that owns the model.
Rows that arrive while the model is idle, or within the batch window after the first of them,
run as ONE `model.generate` call: the prompts are tokenized together with left padding and an
attention mask, so every row's new tokens line up at the right edge. Rows that arrive while a
batch runs wait for the next batch (a running batch cannot take new rows: the KV cache has a
fixed batch dimension).

Each decoding step hands the new token of every row to `_RowStreamer.put`. It decodes each
row's tokens so far and sends the row the new suffix of the text (a character made of several
tokens is held back until it is whole). A row ends at an end-of-turn token or at its own
budget. A row that is cancelled (abort, or its reader went away) is dropped from the
generator's state at once; the model thread merely stops sending to it. `_StopRows` tells
generate that such rows are finished, so when every row of a batch is finished or cancelled
the batch stops at the next step instead of running to the longest budget.

Constrained rows. A row may carry a `TokenConstraint` (a tool turn: `tool_decoding.py`):
`_ConstrainRows`, a logits processor, hands it the row's scores at every step, with the token
the row picked at the step before, and it masks what the row may pick next. Other rows of the
batch decode as they would alone.

Prefix reuse. A batch of one row (the usual case on a small machine) starts from the KV
that an earlier request left with the same prompt prefix (`prefix_cache.py`), so a
conversation's next turn prefills only what it adds; its own KV is kept in turn. Batches of
several rows are left-padded, so their KV fits no other prompt: they prefill in full.

Crossing to the event loop. The model thread never blocks on a reader: it posts each delta
with `loop.call_soon_threadsafe`, and the loop side coalesces deltas into one pending string
per row (vLLM's output collector does the same), so a row's queue is bounded by its budget.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.generation.streamers import BaseStreamer

from ...step_watch import StepWatch, step_done
from .batching import BatchWorker
from .prefix_cache import PrefixCache
from .smollm import LanguageModel


class GenerationFailed(RuntimeError):
    """The batch a request was part of failed inside the model."""


class TokenConstraint(Protocol):
    def apply(self, last_token: int | None, scores: torch.Tensor) -> None:
        """Mask one row's next-token scores in place (`last_token`: the row's previous pick,
        None at the first step)."""


@dataclass(eq=False)
class _Row:
    request_id: str
    prompt: str
    max_new_tokens: int
    loop: asyncio.AbstractEventLoop
    constraint: TokenConstraint | None = None
    cancelled: bool = False
    finished: bool = False
    # model thread side
    token_ids: list[int] = field(default_factory=list)
    sent: str = ""
    # event loop side
    text: str = ""
    done: bool = False
    error: str | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def stopped(self) -> bool:
        return self.cancelled or self.finished

    def send(self, text: str, *, done: bool = False, error: str | None = None) -> None:
        """Model thread -> the row's loop; never blocks."""
        try:
            self.loop.call_soon_threadsafe(self._receive, text, done, error)
        except RuntimeError:  # the loop is closed: nobody will read this row again
            self.cancelled = True

    def _receive(self, text: str, done: bool, error: str | None) -> None:
        if self.cancelled:
            return
        self.text += text
        self.done = self.done or done
        self.error = self.error or error
        self.wake.set()


class _RowStreamer(BaseStreamer):
    """Receives each step's tokens for the whole batch and streams text to each row."""

    def __init__(self, rows: list[_Row], lm: LanguageModel, tokenizer: Any) -> None:
        self._rows = rows
        self._lm = lm
        self._tokenizer = tokenizer
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        step_done()  # a prefill or a decoding step has finished
        if not self._prompt_seen:  # generate first echoes the prompt ids
            self._prompt_seen = True
            return
        steps = value.reshape(len(self._rows), -1).tolist()
        for row, tokens in zip(self._rows, steps, strict=True):
            if row.stopped:
                continue
            for token in tokens:
                if token in self._lm.stop_token_ids:
                    row.finished = True
                    break
                row.token_ids.append(token)
            if len(row.token_ids) >= row.max_new_tokens:
                row.finished = True
            self._flush(row)

    def end(self) -> None:
        for row in self._rows:
            if not row.stopped:
                row.finished = True
                self._flush(row)

    def _flush(self, row: _Row) -> None:
        text = self._tokenizer.decode(
            row.token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        if row.finished:
            row.send(text[len(row.sent) :], done=True)
        elif not text.endswith("\ufffd") and len(text) > len(row.sent):
            row.send(text[len(row.sent) :])
            row.sent = text


class _StopRows(StoppingCriteria):
    """Marks finished and cancelled rows done, so generate stops once all of them are."""

    def __init__(self, rows: list[_Row]) -> None:
        self._rows = rows

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        return torch.tensor([r.stopped for r in self._rows], device=input_ids.device)


class _ConstrainRows(LogitsProcessor):
    """Lets each constrained row mask its own scores, step by step."""

    def __init__(self, rows: list[_Row]) -> None:
        self._rows = rows
        self._first = True

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        for i, row in enumerate(self._rows):
            if row.constraint is not None and not row.stopped:
                last = None if self._first else int(input_ids[i, -1])
                row.constraint.apply(last, scores[i])
        self._first = False
        return scores


class TextGenerator:
    """Streams chat completions of many concurrent requests, batched on one model thread."""

    def __init__(
        self,
        lm: LanguageModel,
        *,
        window_s: float = 0.02,
        max_batch: int = 8,
        prefix_tokens: int = 2048,
    ) -> None:
        self._lm = lm
        self._tokenizer = copy.deepcopy(lm.tokenizer)
        """The model thread's own: a Rust tokenizer used from two threads at once fails
        ("Already borrowed"), and the Thinker builds prompts on its loop meanwhile."""
        self.prefixes = PrefixCache(prefix_tokens)
        """KV kept between requests (used by the model thread only)."""
        self._rows: dict[str, _Row] = {}
        self._lock = threading.Lock()
        self._worker: BatchWorker[_Row] = BatchWorker(
            "parley-thinker", self._run_batch, window_s=window_s, max_batch=max_batch
        )
        self._worker.start()

    @property
    def last_batch_size(self) -> int:
        return self._worker.last_batch_size

    @property
    def watch(self) -> StepWatch:
        """The model thread's progress (a step: a prefill or one decoding step)."""
        return self._worker.watch

    def request_ids(self) -> set[str]:
        with self._lock:
            return set(self._rows)

    async def stream(
        self,
        request_id: str,
        prompt: str,
        max_new_tokens: int,
        constraint: TokenConstraint | None = None,
    ) -> AsyncGenerator[str, None]:
        """Yield the completion of `prompt` as text deltas; closing the stream cancels it."""
        row = _Row(request_id, prompt, max_new_tokens, asyncio.get_running_loop(), constraint)
        with self._lock:
            self._rows[request_id] = row
        try:
            self._worker.submit(row)
            while not row.cancelled:  # an abort drops even text already received
                if row.text:
                    text, row.text = row.text, ""
                    yield text
                elif row.error:
                    raise GenerationFailed(row.error)
                elif row.done:
                    return
                else:
                    row.wake.clear()
                    await row.wake.wait()
        finally:
            self.cancel(request_id, row)

    def cancel(self, request_id: str, row: _Row | None = None) -> None:
        """Forget a request now; its stream ends, and its row stops at the next step."""
        with self._lock:
            if row is None or self._rows.get(request_id) is row:
                row = self._rows.pop(request_id, None)
        if row is not None:
            row.cancelled = True
            self._worker.discard(row)
            row.wake.set()

    async def close(self) -> None:
        """Cancel every request and wait for the model thread to end. Idempotent."""
        for request_id in self.request_ids():
            self.cancel(request_id)
        self._worker.close()
        await asyncio.to_thread(self._worker.join)

    def _run_batch(self, rows: list[_Row]) -> None:
        lm = self._lm
        try:
            batch = self._tokenizer(
                [r.prompt for r in rows],
                return_tensors="pt",
                padding=True,
                add_special_tokens=False,
            )
            defaults = lm.model.generation_config
            config = GenerationConfig(  # type: ignore[no-untyped-call]
                max_new_tokens=max(r.max_new_tokens for r in rows),
                do_sample=False,
                eos_token_id=list(lm.stop_token_ids),
                pad_token_id=lm.pad_token_id,
                bos_token_id=defaults.bos_token_id if defaults else None,  # else it warns
            )
            single = len(rows) == 1
            past = self.prefixes.take(batch.input_ids[0].tolist()) if single else None
            model: Any = lm.model  # transformers' stubs hide GenerationMixin.generate
            with torch.inference_mode():
                sequences = model.generate(
                    **batch,
                    generation_config=config,
                    past_key_values=past,
                    streamer=_RowStreamer(rows, lm, self._tokenizer),
                    logits_processor=LogitsProcessorList(
                        [_ConstrainRows(rows)] if any(r.constraint for r in rows) else []
                    ),
                    stopping_criteria=StoppingCriteriaList([_StopRows(rows)]),
                )
            if past is not None:
                self.prefixes.put(sequences[0, : past.get_seq_length()].tolist(), past)
        except Exception as exc:
            for row in rows:
                if not row.stopped:
                    row.finished = True
                    row.send("", done=True, error=f"{type(exc).__name__}: {exc}")
