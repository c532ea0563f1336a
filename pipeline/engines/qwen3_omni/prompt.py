"""The Thinker's chat prompt as token ids, and the text side of its vocabulary.

Qwen3-Omni speaks ChatML: `<|im_start|>role\\n ... <|im_end|>\\n` per item, the user's audio
between `<|audio_start|>` and `<|audio_end|>` as one `<|audio_pad|>` placeholder per audio
token, each camera frame as `<|image_pad|>`s between `<|vision_start|>` and `<|vision_end|>`,
and the reply opened with `<|im_start|>assistant\\n`. The special ids are fixed by the
released tokenizer (`config.TOKENS`), so the prompt's structure is exact without a tokenizer.

Words are another matter. A random-weight model has no vocabulary to respect, so `ByteVocab`
maps text to one id per UTF-8 byte and shows generated ids as placeholder words ("tok123 ").
With a real checkpoint whose directory holds tokenizer files, `TokenizerVocab` uses the real
tokenizer instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ...engine_limits import TALKER_PROMPT_EXTRA
from ..context_fit import PromptTokens
from .config import TOKENS

BYTE_BASE = 1000
"""ByteVocab's id of byte 0: clear of the low ids, far below the special ids."""


class Vocab(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_id: int) -> str: ...


class ByteVocab:
    """A fixed mapping for random weights: text in as bytes, ids out as "tokN " words."""

    def encode(self, text: str) -> list[int]:
        return [BYTE_BASE + b for b in text.encode()]

    def decode(self, token_id: int) -> str:
        return f"tok{token_id} "


class TokenizerVocab:
    """A checkpoint's own tokenizer (only when its files ship with the weights)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_id: int) -> str:
        return str(self._tokenizer.decode([token_id], skip_special_tokens=True))


def load_vocab(model_path: str | None) -> Vocab:
    if model_path and (Path(model_path) / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        return TokenizerVocab(AutoTokenizer.from_pretrained(model_path))  # type: ignore[no-untyped-call]
    return ByteVocab()


def _item(role_id: int, body: Sequence[int]) -> list[int]:
    head = [TOKENS["im_start"], role_id, TOKENS["newline"]]
    return [*head, *body, TOKENS["im_end"], TOKENS["newline"]]


OPENING = (TOKENS["im_start"], TOKENS["assistant"], TOKENS["newline"])
"""The assistant's reply opens the prompt's last item."""
ROLE_IDS = {"system": TOKENS["system"], "user": TOKENS["user"], "assistant": TOKENS["assistant"]}


@dataclass(frozen=True, slots=True)
class ChatParts:
    """A chat prompt in the parts a cut to the context sees (`context_fit.py`)."""

    system: list[int]
    """the system item (empty without instructions)"""
    items: list[list[int]]
    """each history item, oldest first"""
    turn: list[int]
    """the user's turn and the opening of the assistant's reply"""

    def ids(self) -> list[int]:
        return [*self.system, *(t for item in self.items for t in item), *self.turn]

    def tokens(self, talker: bool = False) -> PromptTokens:
        """Its lengths; `talker`: with the Talker's share (its user items, this turn's, and
        the positions the Talker adds) as the downstream prompt."""
        items = [len(item) for item in self.items]
        if not talker:
            return PromptTokens(len(self.system), items, len(self.turn))
        shares = [len(item) if item[1] == TOKENS["user"] else 0 for item in self.items]
        turn = len(self.turn) - len(OPENING) + TALKER_PROMPT_EXTRA
        return PromptTokens(len(self.system), items, len(self.turn), shares, turn)

    def without_oldest(self, count: int) -> ChatParts:
        """The prompt less its `count` oldest history items."""
        return ChatParts(self.system, self.items[count:], self.turn)


def chat_parts(
    vocab: Vocab,
    *,
    instructions: str,
    history: Sequence[tuple[str, str]],
    audio_tokens: int,
    text: str | None,
    image_tokens: Sequence[int] = (),
) -> ChatParts:
    """System item, history items, the user's turn (image placeholders per frame, audio
    placeholders, then any text), and the opening of the assistant's reply."""
    system = _item(TOKENS["system"], vocab.encode(instructions)) if instructions else []
    items = [_item(ROLE_IDS[role], vocab.encode(said)) for role, said in history]
    turn: list[int] = []
    for count in image_tokens:
        turn += [TOKENS["vision_start"], *[TOKENS["image"]] * count, TOKENS["vision_end"]]
    if audio_tokens:
        turn += [TOKENS["audio_start"], *[TOKENS["audio"]] * audio_tokens, TOKENS["audio_end"]]
    if text:
        turn += vocab.encode(text)
    return ChatParts(system, items, [*_item(TOKENS["user"], turn), *OPENING])


def chat_prompt(
    vocab: Vocab,
    *,
    instructions: str,
    history: Sequence[tuple[str, str]],
    audio_tokens: int,
    text: str | None,
    image_tokens: Sequence[int] = (),
) -> list[int]:
    """The whole prompt's ids (`chat_parts`, joined)."""
    return chat_parts(
        vocab,
        instructions=instructions,
        history=history,
        audio_tokens=audio_tokens,
        text=text,
        image_tokens=image_tokens,
    ).ids()
