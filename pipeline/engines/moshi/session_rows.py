"""Sessions kept in the lowest rows of a batch's state, for a step that reads rows 0..n-1.

Moshi's frame step and each direction of its codec hold per-session state in preallocated
rows (a KV ring, convolution contexts) and step the first n rows as one batch: a shape
fixed per bucket, which a captured CUDA graph needs. So the sessions must fill rows 0..n-1
with no hole: a session that joins takes the next row (its state reset first), and one that
leaves gives its row to the session in the last row, whose state moves down. The owner
says how a row is reset and how one row's state moves to another.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


class SessionRows:
    """Sessions in rows 0..n-1 of a batch's state."""

    def __init__(
        self, rows: int, *, reset: Callable[[int], None], move: Callable[[int, int], None]
    ) -> None:
        self.rows = rows
        self._reset, self._move = reset, move
        self._row_of: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._row_of)

    def ids(self) -> set[str]:
        return set(self._row_of)

    def row(self, session_id: str) -> int:
        """The row `session_id` holds (KeyError if none)."""
        return self._row_of[session_id]

    def join(self, session_id: str) -> bool:
        """Give `session_id` the next row (reset) unless it has one; False if all are taken."""
        if session_id in self._row_of:
            return True
        row = len(self._row_of)
        if row >= self.rows:
            return False
        self._row_of[session_id] = row
        self._reset(row)
        return True

    def in_row_order(self, ids: Iterable[str]) -> list[str]:
        return sorted(ids, key=self._row_of.__getitem__)

    def order(self, ids: Iterable[str]) -> list[str]:
        """`ids` in row order, newcomers given the next rows (reset). A step takes a frame
        from every session in the direction: one missing is a ValueError (nothing changed)."""
        ids = list(ids)
        new = [s for s in ids if s not in self._row_of]
        missing = set(self._row_of) - set(ids)
        if missing:
            raise ValueError(f"no frame for sessions that joined: {sorted(missing)}")
        if len(self._row_of) + len(new) > self.rows:
            raise ValueError(f"more than the {self.rows} rows this codec holds")
        for session_id in new:
            self.join(session_id)
        return self.in_row_order(ids)

    def leave(self, session_id: str) -> None:
        """Free the session's row (idempotent); the last row's session moves into it."""
        row = self._row_of.pop(session_id, None)
        last = len(self._row_of)
        if row is None or row == last:
            return
        moved = next(s for s, r in self._row_of.items() if r == last)
        self._move(last, row)
        self._row_of[moved] = row
