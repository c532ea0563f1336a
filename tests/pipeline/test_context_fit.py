"""How many of the oldest items a conversation loses to fit the context, per truncation
setting, and the cut points a session keeps."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.engines.context_fit import ContextCuts, ContextExceeded, PromptTokens, fit
from pipeline.types import HistoryItem, PipelineRequest, Truncation

TOKENS = PromptTokens(instructions=100, items=[200, 200, 200, 200], turn=100)
"""1,000 tokens: 100 of instructions, four items of 200, a turn of 100."""


def cut(tokens: PromptTokens, context: int, truncation: Truncation, reply: int = 100) -> int:
    return fit(tokens, reply=reply, max_context=context, truncation=truncation)


def test_what_fits_is_left_whole_whatever_the_setting() -> None:
    for kind in ("auto", "retention_ratio", "disabled"):
        assert cut(TOKENS, 1100, Truncation(kind)) == 0


def test_auto_drops_as_few_of_the_oldest_items_as_make_it_fit() -> None:
    assert cut(TOKENS, 1099, Truncation("auto")) == 1
    assert cut(TOKENS, 700, Truncation("auto")) == 2  # 100 + 400 + 100 + reply 100 = 700
    assert cut(TOKENS, 300, Truncation("auto")) == 4  # the turn alone is left


def test_retention_ratio_drops_down_to_its_share_of_what_may_follow_the_instructions() -> None:
    # room after the instructions: 1000 - 100 - 100 = 800, half of it 400: of the 900 (four
    # items and the turn) three items go, leaving one and the turn (300)
    assert cut(TOKENS, 1000, Truncation("retention_ratio", retention_ratio=0.5)) == 3
    assert cut(TOKENS, 1000, Truncation("retention_ratio", retention_ratio=0.9)) == 1
    assert cut(TOKENS, 1000, Truncation("retention_ratio", retention_ratio=0.0)) == 4


def test_post_instructions_tokens_cuts_before_the_context_is_full() -> None:
    limited = Truncation("retention_ratio", retention_ratio=1.0, post_instructions_tokens=500)
    assert cut(TOKENS, 10_000, limited) == 2  # 900 after the instructions, 500 allowed
    ample = Truncation("retention_ratio", retention_ratio=1.0, post_instructions_tokens=5000)
    assert cut(TOKENS, 1099, ample) == 1  # never above what the context leaves


def test_disabled_refuses_with_the_figures() -> None:
    with pytest.raises(ContextExceeded, match=r"needs 1000 tokens plus 100 .* of 1099 tokens"):
        cut(TOKENS, 1099, Truncation("disabled"))


def test_a_turn_that_cannot_fit_alone_fails_whatever_the_setting() -> None:
    for kind in ("auto", "retention_ratio", "disabled"):
        with pytest.raises(ContextExceeded, match="this turn needs 200 tokens"):
            cut(TOKENS, 299, Truncation(kind))


def request(session: str, count: int) -> PipelineRequest:
    items = tuple(HistoryItem("user", f"q{i}", f"i{i}") for i in range(count))
    return PipelineRequest(
        request_id="r",
        audio=np.zeros(0, dtype=np.int16),
        history=items,
        session_id=session,
        item_ids=(*(item.item_id for item in items), "turn"),
    )


def test_cut_items_stay_out_of_the_sessions_later_requests() -> None:
    cuts = ContextCuts()
    first = cuts.cut(cuts.view(request("s", 4)), 2)
    assert [item.item_id for item in first.history] == ["i2", "i3"]
    assert first.item_ids == ("i2", "i3", "turn")
    later = cuts.view(request("s", 6))
    assert [item.item_id for item in later.history] == ["i2", "i3", "i4", "i5"]
    assert cuts.view(request("other", 4)).history == request("other", 4).history
    cuts.forget("s")
    assert len(cuts.view(request("s", 6)).history) == 6


def test_the_cut_points_kept_are_bounded() -> None:
    cuts = ContextCuts(max_sessions=2)
    for session in ("a", "b", "c"):
        cuts.cut(request(session, 3), 1)
    assert len(cuts) == 2 and not cuts.dropped("a") and cuts.dropped("c") == {"i0"}
