"""The judges of the end-of-turn benchmark: does what was heard at a pause sound finished?

Two kinds, each a score in [0, 1] (None: no words, leave the end to the silence):

* `rule`: `sessions.turn_end.sounds_finished`, the session's judge when the pipeline has
  none (1 or 0);
* `lm`: `TurnEndModel` (pipeline/engines/cascade/turn_end_model.py), the cascade's judge:
  the Thinker's own model (SmolLM2-135M-Instruct) asked how likely the user's message ends
  right after the words: P(<|im_end|>) as the next token after the Thinker's system
  message and the words, lower case without punctuation (as LiveKit's turn detector does,
  with a model fine-tuned for it; here it is the chat model as it ships), the prompt's
  fixed start cached;
* `lm-raw`, `lm-bare`: the same model on the whole prompt with the words as Whisper wrote
  them, and without the punctuation at their end. Whisper puts a "?" or "." after a
  fragment too ("What is the capital of?"), which these show misleads the model;
* `lm-int8`: `lm` on the model with int8 matrices (the Thinker's `weights: int8`).

And one that judges the audio, with no words: `smart-turn`, Pipecat's Smart Turn v3.2
(sessions/smart_turn.py), P(the turn is complete) from the turn's last 8 s of sound.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from loadtest.speech_set import Pcm
from sessions.turn_end import sounds_finished

Score = Callable[[str], float | None]
AudioScore = Callable[[Pcm], float]
AUDIO_JUDGES = ("smart-turn",)


def rule_score(words: str) -> float | None:
    finished = sounds_finished(words)
    return None if finished is None else float(finished)


def as_written(words: str) -> str:
    return words.strip()


def bare(words: str) -> str:
    """Without the punctuation Whisper put at the end ("What is the capital of?")."""
    return re.sub(r"[\s.?!,;:…-]+$", "", words.strip())


LM_VARIANTS: dict[str, Callable[[str], str]] = {"lm-raw": as_written, "lm-bare": bare}


def model_scorer(weights: str = "fp32") -> Score:
    """`TurnEndModel.probability` on the Thinker's model (blocking: loads it)."""
    from pipeline.engines.cascade.smollm import load_language_model
    from pipeline.engines.cascade.turn_end_model import TurnEndModel

    return TurnEndModel(load_language_model(weights=weights)).probability


def scorer(name: str) -> Score:
    """The judge called `name`: "rule", "lm", "lm-int8" or one of LM_VARIANTS."""
    if name == "rule":
        return rule_score
    if name == "lm":
        return model_scorer()
    if name == "lm-int8":
        return model_scorer("int8")
    return lm_scorer(LM_VARIANTS[name])


def lm_scorer(shape: Callable[[str], str]) -> Score:
    """P(the user's message ends here) from SmolLM2-135M-Instruct, with `shape` applied to
    the words first, the whole prompt run each time; blocking (~0.1 s on one CPU thread)."""
    import torch

    from pipeline.engines.cascade.smollm import END_OF_TURN, load_language_model
    from pipeline.engines.cascade.thinker import DEFAULT_INSTRUCTIONS

    lm = load_language_model()
    tokenizer = lm.tokenizer
    end_id = int(tokenizer.convert_tokens_to_ids(END_OF_TURN))

    def score(words: str) -> float | None:
        text = shape(words)
        if not text:
            return None
        messages = [
            {"role": "system", "content": DEFAULT_INSTRUCTIONS},
            {"role": "user", "content": text},
        ]
        prompt = str(tokenizer.apply_chat_template(messages, tokenize=False))
        prompt = prompt[: prompt.rindex(END_OF_TURN)]  # the user's message left open
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            logits = lm.model(ids, logits_to_keep=1).logits[0, -1]
        return float(torch.softmax(logits.float(), dim=-1)[end_id])

    return score


def audio_scorer(name: str) -> AudioScore:
    """The audio judge called `name` (one of AUDIO_JUDGES), loaded (blocking)."""
    from sessions import smart_turn

    if name != "smart-turn":
        raise ValueError(f"no audio judge {name!r}")
    model = smart_turn.shared()
    if model is None:
        raise RuntimeError("Smart Turn needs the pipecat-ai package (its model ships there)")
    return model.probability
