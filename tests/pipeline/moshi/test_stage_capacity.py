"""The duplex stage states what it serves: a row of its caches per session, for the
session's whole life, so admission holds sessions to its rows."""

from __future__ import annotations

from pipeline.engines.moshi.duplex_stage import MoshiStage


async def test_the_duplex_stage_states_one_row_per_session() -> None:
    stage = MoshiStage(tiny=True, rows=3, greedy=True)
    await stage.start()
    try:
        stated = stage.capacity()
        assert (stated.rows, stated.holds, stated.sessions) == (3, "session", 3)
        assert stated.context > 0 and stated.memory_bytes > 0
        assert "3 sessions at once" in stated.line()
    finally:
        await stage.close()
