"""realtime/transports/sip/pending_calls.py: calls ringing while the app decides, bounded, each
decided once, turned away with 480 when nobody decides in time, and gone when their waiter
is."""

from __future__ import annotations

import asyncio

import pytest

from realtime.transports.sip.handler import Rejection
from realtime.transports.sip.pending_calls import (
    Accept,
    PendingCalls,
    Refer,
    Reject,
    TooManyPendingCalls,
    describe,
    reason_phrase,
)
from sessions import SessionConfig


async def test_a_decision_reaches_the_waiter() -> None:
    pending = PendingCalls()
    pending.open("rtc_1")
    waiter = asyncio.create_task(pending.wait("rtc_1"))
    await asyncio.sleep(0)
    decision = Accept("rtc_1", SessionConfig())
    assert pending.resolve("rtc_1", decision)
    assert await waiter is decision
    assert "rtc_1" not in pending
    assert len(pending) == 0


async def test_a_decision_before_the_wait_is_kept() -> None:
    """Apps often accept from inside their webhook handler, before the SIP side waits."""
    pending = PendingCalls()
    pending.open("rtc_early")
    assert pending.resolve("rtc_early", Refer("sip:desk@example.com"))
    assert "rtc_early" not in pending  # a second decision finds nothing to decide
    assert not pending.resolve("rtc_early", Reject())
    assert await pending.wait("rtc_early") == Refer("sip:desk@example.com")
    assert len(pending) == 0


async def test_the_first_decision_wins() -> None:
    pending = PendingCalls()
    pending.open("rtc_2")
    waiter = asyncio.create_task(pending.wait("rtc_2"))
    assert pending.resolve("rtc_2", Reject(486))
    assert not pending.resolve("rtc_2", Accept("rtc_2", SessionConfig()))
    assert await waiter == Reject(486)


async def test_no_decision_in_time_is_a_480() -> None:
    pending = PendingCalls(deadline_s=0.05)
    pending.open("rtc_slow")
    decision = await pending.wait("rtc_slow")
    assert isinstance(decision, Reject)
    assert decision.status == 480
    assert decision.rejection() == Rejection(480, "Temporarily Unavailable")
    assert not pending.resolve("rtc_slow", Reject())  # too late: not pending any more


async def test_a_cancelled_waiter_leaves_nothing_pending() -> None:
    pending = PendingCalls()
    pending.open("rtc_3")
    waiter = asyncio.create_task(pending.wait("rtc_3"))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert len(pending) == 0
    assert not pending.resolve("rtc_3", Reject())


async def test_the_registry_is_bounded() -> None:
    pending = PendingCalls(limit=2)
    pending.open("rtc_a")
    pending.open("rtc_b")
    with pytest.raises(TooManyPendingCalls):
        pending.open("rtc_c")
    with pytest.raises(ValueError, match="already"):
        pending.open("rtc_a")
    with pytest.raises(KeyError):
        await pending.wait("rtc_unknown")
    for call_id in ("rtc_a", "rtc_b"):
        pending.resolve(call_id, Reject())
        await pending.wait(call_id)
    pending.open("rtc_c")  # room again
    pending.resolve("rtc_c", Reject())
    assert await pending.wait("rtc_c") == Reject()


def test_rejections_carry_sip_reason_phrases() -> None:
    assert Reject().rejection() == Rejection(603, "Decline")
    assert Reject(486).rejection() == Rejection(486, "Busy Here")
    assert reason_phrase(499) == "Request Failure"
    assert reason_phrase(699) == "Decline"


def test_logs_describe_a_decision_without_the_session() -> None:
    secret = SessionConfig(instructions="The door code is 4711.")
    assert describe(Accept("rtc_1", secret)) == "accept"
    assert describe(Reject(486, "the app rejected the call")).startswith("reject 486")
    assert describe(Refer("sip:desk@example.com")) == "refer to sip:desk@example.com"
