"""The row gate: a turn beyond the rows waits its turn (first come, first served), is served
when a row comes back, or fails `server_busy` at its deadline or at a full queue; a turn
that gives up while it waits leaves nothing behind."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.row_gate import RowGate, RowsBusy


async def test_a_turn_beyond_the_rows_waits_and_gets_the_row_given_back() -> None:
    gate = RowGate("thinker", 2, wait_s=5.0)
    assert await gate.take("a") and await gate.take("b")
    third = asyncio.create_task(gate.take("c"))
    fourth = asyncio.create_task(gate.take("d"))
    await asyncio.sleep(0.01)
    assert not third.done() and gate.load().waiting == 2 and gate.in_use == 2
    gate.give_back("b")
    assert await third  # the oldest waiter first
    assert not fourth.done()
    gate.give_back("a")
    assert await fourth
    assert gate.load().in_use == 2 and gate.queued == 0
    for rid in ("c", "d", "d"):  # giving back twice gives nothing more
        gate.give_back(rid)
    assert gate.in_use == 0 and gate.refused == 0


async def test_no_row_within_the_wait_fails_server_busy_saying_why() -> None:
    gate = RowGate("talker", 1, wait_s=0.05)
    await gate.take("a")
    with pytest.raises(RowsBusy, match=r"all 1 rows of talker stayed busy for the 0\.\d s"):
        await gate.take("b")
    assert gate.queued == 0 and gate.refused == 1
    gate.give_back("a")
    assert await gate.take("c")  # the row was never lost


async def test_a_full_queue_fails_at_once() -> None:
    gate = RowGate("thinker", 1, waiting=1, wait_s=5.0)
    await gate.take("a")
    waiter = asyncio.create_task(gate.take("b"))
    await asyncio.sleep(0)
    with pytest.raises(RowsBusy, match="all 1 places to wait for one are taken"):
        await gate.take("c")
    assert gate.load().refused == 1
    gate.give_back("a")
    assert await waiter


async def test_a_cancelled_or_abandoned_waiter_leaves_the_queue_holding_nothing() -> None:
    gate = RowGate("thinker", 1, waiting=2, wait_s=5.0)
    await gate.take("a")
    cancelled = asyncio.create_task(gate.take("b"))
    abandoned = asyncio.create_task(gate.take("c"))
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    gate.abandon("c")
    assert await abandoned is False
    assert gate.queued == 0 and gate.in_use == 1
    gate.give_back("a")
    assert gate.in_use == 0


async def test_a_row_handed_to_a_waiter_that_is_cancelled_meanwhile_goes_on() -> None:
    """The hand-over and the waiter's cancellation land in the same loop pass: the row is
    not lost with the waiter, it goes to the next one."""
    gate = RowGate("thinker", 1, waiting=2, wait_s=5.0)
    await gate.take("a")
    first = asyncio.create_task(gate.take("b"))
    second = asyncio.create_task(gate.take("c"))
    await asyncio.sleep(0)
    gate.give_back("a")  # "b" is handed the row...
    first.cancel()  # ...and cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await second
    assert gate.in_use == 1 and gate.holds("c") and not gate.holds("b")


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one row"):
        RowGate("x", 0)
    with pytest.raises(ValueError, match="waiting"):
        RowGate("x", 1, waiting=-1)
