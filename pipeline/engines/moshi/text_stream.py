"""Moshi's text stream as words: the tokens it writes beside its voice, one a frame.

Moshi writes a text token with every 80 ms frame: a padding token while it says nothing (or
between words), else a piece of the word it is saying, a little ahead of the audio. Those
pieces are its own transcript. Decoding them one at a time loses what a tokenizer joins
(SentencePiece's word-start marks, multi-token characters), so each session's run of pieces
since its last pause is decoded whole and what is new is given out; a pause ends the run,
and the next one begins with a space.

The tokenizer is the checkpoint's (`model_path`, as transformers saves it); the toy model
has a word-level one built here, so the path from tokens to transcripts runs in tests and
on the CPU with words rather than nothing.
"""

from __future__ import annotations

from typing import Any

PAD_IDS = frozenset({0, 3})
"""Moshi's text padding tokens (end of padding, padding), as Kyutai's checkpoints number
them; a tokenizer's own special tokens are skipped too."""

TOY_WORDS = (
    "yes",
    "no",
    "maybe",
    "hello",
    "there",
    "right",
    "okay",
    "sure",
    "well",
    "so",
    "and",
    "but",
    "the",
    "a",
    "it",
    "is",
    "that",
    "this",
    "you",
    "i",
    "we",
    "they",
    "what",
    "when",
    "where",
    "why",
    "how",
    "good",
    "great",
    "fine",
    "thanks",
    "please",
    "sorry",
    "now",
    "then",
    "here",
    "today",
    "time",
    "day",
    "one",
    "two",
    "three",
    "four",
    "five",
    "more",
    "less",
    "very",
    "really",
    "just",
    "also",
    "still",
    "again",
    "about",
    "think",
    "know",
    "see",
    "say",
    "go",
    "get",
    "make",
    "take",
)


class TextPieces:
    """One session's text tokens -> new words, token by token (on the model's thread)."""

    def __init__(self, tokenizer: Any, skip: frozenset[int]) -> None:
        self._tokenizer = tokenizer
        self._skip = skip
        self._run: list[int] = []
        self._said = ""
        self._spoke = False
        """Something was said before the current run: the run begins with a space."""

    def push(self, token: int) -> str:
        if token in self._skip:
            if self._run:
                self._run, self._said, self._spoke = [], "", True
            return ""
        self._run.append(token)
        text = str(self._tokenizer.decode(self._run, skip_special_tokens=True))
        new = text[len(self._said) :] if text.startswith(self._said) else ""
        if new and not self._said and self._spoke and not new.startswith(" "):
            new = " " + new  # the first words after a pause
        self._said = text
        return new


def skipped_ids(tokenizer: Any) -> frozenset[int]:
    return PAD_IDS | frozenset(int(i) for i in getattr(tokenizer, "all_special_ids", ()))


def toy_tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer for the toy model's text vocabulary: 0-3 are the special and
    padding tokens, the rest words (cycled when the vocabulary is larger than the list)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # type: ignore[import-untyped]
    from transformers import PreTrainedTokenizerFast

    specials = ["<epad>", "<unk>", "<eos>", "<pad>"]
    vocab = {token: i for i, token in enumerate(specials)}
    for i in range(len(specials), vocab_size):
        word = TOY_WORDS[(i - len(specials)) % len(TOY_WORDS)]
        vocab[word if word not in vocab else f"{word}{i}"] = i
    model = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    model.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=model, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>"
    )


def load_text_tokenizer(*, tiny: bool, vocab_size: int, model_path: str | None) -> Any | None:
    """The checkpoint's tokenizer, the toy one, or None (random full-size weights: their
    tokens are no words, and no tokenizer is downloaded)."""
    if model_path:
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(model_path)  # type: ignore[no-untyped-call]
        except (OSError, ValueError):
            return None
    return toy_tokenizer(vocab_size) if tiny else None
