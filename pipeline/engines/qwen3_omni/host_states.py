"""The Thinker's hidden states on their way to the host and on to the Talker.

A bfloat16 model's states go as their 16-bit patterns (`uint16`, numpy has no bfloat16):
exactly the values the model computed, in half the bytes of float32. That matters because
the Talker's prompt is the whole conversation's user items: each turn the prompt's states
(two layers, 2,048 wide) cross two worker links, 16 KiB a position as float32 (59 MiB at
3,800 positions), 8 KiB now. Any other dtype goes as float32, as before.

Only the positions the Talker reads go (`for_the_talker`): its prompt is the user items and
the reply's opening; the system item and the earlier replies (most of a spoken
conversation's positions: a 200-token answer against a 5 s question's ~75) it skips, so
their states never needed to cross.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from .config import TOKENS

HostStates = npt.NDArray[Any]
"""float32, or uint16 holding bfloat16 bit patterns"""


def to_host(states: torch.Tensor) -> HostStates:
    """`states` on the host as numpy: bfloat16 as its bits, anything else as float32."""
    if states.dtype == torch.bfloat16:
        return states.detach().contiguous().cpu().view(torch.int16).numpy().view(np.uint16)
    return states.detach().float().cpu().numpy()


def empty_states(width: int, like: HostStates) -> HostStates:
    """No positions of [n, 2, width] states, in the dtype of `like`."""
    return np.zeros((0, 2, width), dtype=like.dtype)


def to_device(array: HostStates, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A host array of states on `device` in `dtype`: a copy (inputs may be views onto a
    link's shared memory), bfloat16 bits read back exactly."""
    if array.dtype == np.uint16:
        bits = torch.from_numpy(np.array(array, dtype=np.uint16).view(np.int16))
        return bits.view(torch.bfloat16).to(device=device, dtype=dtype)
    return torch.tensor(array, dtype=dtype, device=device)


def as_float(array: HostStates) -> npt.NDArray[np.float32]:
    """The states as float32 (for comparisons and tools), whichever way they travelled."""
    if array.dtype == np.uint16:
        return to_device(array, torch.float32, "cpu").numpy()
    return np.asarray(array, dtype=np.float32)


def user_items(token_ids: list[int]) -> list[tuple[int, int]]:
    """The (begin, end) positions of each user item of a ChatML prompt, in order: what the
    Talker's prompt is made of (talker_runner.py, `_prompt_embeds`), besides the reply's
    opening (the prompt's last item)."""
    bounds = [i for i, token in enumerate(token_ids) if token == TOKENS["im_start"]]
    bounds.append(len(token_ids))
    return [
        (begin, end)
        for begin, end in zip(bounds, bounds[1:], strict=False)
        if begin + 1 < end and token_ids[begin + 1] == TOKENS["user"]
    ]


def for_the_talker(token_ids: list[int], states: HostStates) -> tuple[list[int], HostStates]:
    """Of a prompt's token ids and states ([n, 2, width]), the positions the Talker's prompt
    reads: every user item's (`user_items`), and the last item (the reply's opening,
    `<|im_start|>assistant\n`), in order. The Talker builds the same prompt from them as
    from the whole."""
    starts = (i for i, token in enumerate(token_ids) if token == TOKENS["im_start"])
    opening = max(starts, default=len(token_ids))
    kept = [i for begin, end in user_items(token_ids) for i in range(begin, min(end, opening))]
    kept.extend(range(opening, len(token_ids)))
    if len(kept) == len(token_ids):
        return token_ids, states
    return [token_ids[i] for i in kept], states[np.asarray(kept, dtype=np.intp)]
