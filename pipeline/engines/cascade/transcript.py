"""A recogniser's transcript, and Whisper's log-probability of each of its tokens.

A session that asks for them (OpenAI's `include: ["item.input_audio_transcription.logprobs"]`,
`RecognitionHints.logprobs`) gets each token of the transcript with its log-probability and
its bytes. Whisper has them: CTranslate2's `Whisper.generate(return_logits_vocab=True)`
returns, for every step of the greedy decode, the logits over the whole vocabulary (51,865)
from which the step's token was chosen. They are raw logits (not log-softmaxed) with the
decode's suppression masks already applied (a suppressed token holds float32's lowest value),
so the log-softmax of a step at its token is the log-probability the decode gave that token.
The tokens' log-probabilities plus the end token's add up to CTranslate2's cumulative score
(its `scores` are that sum divided by the number of tokens: length_penalty 1); tested in
tests/pipeline/cascade/test_asr_whisper.py.

A token's bytes come from the tokenizer's vocabulary (Whisper's is GPT-2's byte-level BPE), so
a token that holds part of a multi-byte character has its exact bytes (its text shows U+FFFD,
as OpenAI's do). Whisper writes a space before the first word and the transcript is stripped:
the first tokens lose their leading whitespace and the last ones their trailing whitespace, so
that the tokens' texts joined are the transcript as sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...types import Logprobs, TokenLogprob


@dataclass(frozen=True, slots=True)
class Transcript:
    """What a recogniser heard: the words, and their tokens' log-probabilities when they
    were asked for and the recogniser has them (None otherwise)."""

    text: str
    logprobs: Logprobs | None = None


def _byte_of_char() -> dict[str, int]:
    """The inverse of GPT-2's `bytes_to_unicode`: the byte each character of a byte-level
    BPE token stands for (printable bytes as themselves, the others shifted past 255)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in chars:
            chars[byte] = chr(256 + shifted)
            shifted += 1
    return {char: byte for byte, char in chars.items()}


_BYTE_OF_CHAR = _byte_of_char()


class TokenBytes:
    """The UTF-8 bytes of each of a byte-level BPE tokenizer's tokens, looked up as asked
    (kept: at most the vocabulary, a few bytes each)."""

    def __init__(self, hf_tokenizer: Any) -> None:
        self._tokenizer = hf_tokenizer
        self._known: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        found = self._known.get(token_id)
        if found is None:
            piece = str(self._tokenizer.id_to_token(token_id))
            found = self._known[token_id] = bytes(_BYTE_OF_CHAR[char] for char in piece)
        return found


def token_logprobs(
    steps: Sequence[Any], tokens: Sequence[int], text_below: int, token_bytes: TokenBytes
) -> Logprobs:
    """Each text token of `tokens` (ids under `text_below`, Whisper's end of text: the
    special tokens are not words) with its log-probability: the log-softmax of its step's
    logits (`steps`: CTranslate2's `logits` of the hypothesis, one vocabulary row a step, the
    end token's step last) at the token."""
    chosen = [(step, token) for step, token in enumerate(tokens) if token < text_below]
    if not chosen:
        return ()
    rows = np.stack([np.asarray(steps[step], dtype=np.float32).reshape(-1) for step, _ in chosen])
    peak = rows.max(axis=1, keepdims=True)
    log_total = peak[:, 0] + np.log(np.exp(rows - peak).sum(axis=1))
    picked = rows[np.arange(len(chosen)), [token for _, token in chosen]]
    pieces = _trimmed([token_bytes(token) for _, token in chosen])
    return tuple(
        TokenLogprob(piece.decode("utf-8", errors="replace"), float(logprob), piece)
        for piece, logprob in zip(pieces, picked - log_total, strict=True)
    )


def _trimmed(pieces: list[bytes]) -> list[bytes]:
    """`pieces` without the whitespace before the first non-blank one and after the last."""
    pieces = list(pieces)
    for index, piece in enumerate(pieces):
        pieces[index] = piece.lstrip()
        if pieces[index]:
            break
    for index in reversed(range(len(pieces))):
        pieces[index] = pieces[index].rstrip()
        if pieces[index]:
            break
    return pieces
