"""Does the user's message end here? The Thinker's own model asked, for semantic_vad.

A rule on the last word (turn_end.py) cannot tell "set a timer" broken off from "set a
timer" said whole, and Whisper often writes a fragment as a phrase ("What is the" -> "What
is that?"). LiveKit's turn detector asks a language model instead: how likely is the end of
the user's message right after these words? This does the same with the chat model the
cascade already holds, SmolLM2-135M-Instruct: P(<|im_end|>) as the next token after the
system message and the words (lower case, no punctuation: Whisper puts a "?" after a
fragment too), finished when it is at least THRESHOLD.

The system message and the opening of the user's message are the same every time, so their
KV is computed once and only the words (~10 tokens) are run per judgement, with the
vocabulary projected for the last one only: p50 77 ms on one busy CPU thread here, against
~100 ms for the whole prompt. `python -m loadtest.turn_end_bench`
measures it against the rule (issue 12).

It needs the model, so it runs where the model is (the cascade's worker), not in the
session: blocking, one judgement at a time (a lock).
"""

from __future__ import annotations

import copy
import re
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.engines.cascade.smollm import LanguageModel

THRESHOLD = 1e-5
"""P(end) over which the words sound finished. On the bench's 30 spoken questions, chosen
on either half of them it came out between 3e-6 and 2e-5: the model's probabilities of an
end are tiny without punctuation, and it is their order that tells whole from broken."""
INSTRUCTIONS = "You are a helpful voice assistant. Answer in one or two short sentences."
_MARK = "\x00words\x00"


def normalised(words: str) -> str:
    """Lower case, without punctuation: "What is the capital of?" -> "what is the capital of"."""
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", words.lower()).split())


class TurnEndModel:
    """P(the user's message ends after `words`) from a chat model, and a verdict on it."""

    def __init__(
        self,
        lm: LanguageModel,
        threshold: float = THRESHOLD,
        instructions: str = INSTRUCTIONS,
    ) -> None:
        import torch

        from pipeline.engines.cascade.smollm import END_OF_TURN

        self._lm = lm
        self.threshold = threshold
        # Its own copy: a Rust tokenizer used from two threads at once fails ("Already
        # borrowed"), and the judge runs in a thread while the Thinker builds the prompt of
        # the answer begun on the same words (interruption_bench, 12-07: one answer failed).
        tokenizer = self._tokenizer = copy.deepcopy(lm.tokenizer)
        self._end_id = int(tokenizer.convert_tokens_to_ids(END_OF_TURN))
        messages = [
            {"role": "system", "content": instructions},
            {"role": "user", "content": _MARK},
        ]
        template = str(tokenizer.apply_chat_template(messages, tokenize=False))
        self._prefix = template[: template.index(_MARK)]
        self._prefix_ids: list[int] = list(tokenizer(self._prefix).input_ids)
        with torch.inference_mode():
            out = lm.model(torch.tensor([self._prefix_ids]), use_cache=True)
        self._cache = out.past_key_values
        self._lock = threading.Lock()

    def probability(self, words: str) -> float | None:
        """P(<|im_end|>) right after `words` as the user's message; None without words."""
        import torch

        text = normalised(words)
        if not text:
            return None
        ids: list[int] = list(self._tokenizer(self._prefix + text).input_ids)
        shared = len(self._prefix_ids)
        with self._lock, torch.inference_mode():
            if ids[:shared] == self._prefix_ids and len(ids) > shared:
                logits = self._lm.model(
                    torch.tensor([ids[shared:]]),
                    past_key_values=self._cache,
                    use_cache=True,
                    logits_to_keep=1,  # the vocabulary's projection for the last token only
                ).logits
                self._cache.crop(shared)  # back to the prefix for the next call
            else:  # the words merged with the prefix's last token: run it all
                logits = self._lm.model(torch.tensor([ids]), logits_to_keep=1).logits
        return float(torch.softmax(logits[0, -1].float(), dim=-1)[self._end_id])

    def sounds_finished(self, words: str) -> bool | None:
        """True if `words` sound like a whole turn, False if they break off, None when there
        are none (leave the end to the silence)."""
        p = self.probability(words)
        return None if p is None else p >= self.threshold
