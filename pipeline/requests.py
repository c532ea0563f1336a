"""The requests an engine holds: one table per engine, the same bookkeeping in every engine.

An engine holds a request while its `generate` stream runs (`track`: from the first step to
the end, an early close or a cancellation). `abort` comes from another task (the graph, a
worker's link) and drops the request at once, so `active_requests` (`len`) is 0 right after
it; the stream sees `aborted` at its next step and stops. A request can carry one piece of
engine state (a KV slot, a clause being rendered): `abort` and `clear` hand it back so the
engine can free it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

StateT = TypeVar("StateT")


class RequestTracker(Generic[StateT]):
    """The requests held by one engine, each with optional state of type `StateT`."""

    def __init__(self) -> None:
        self._held: dict[str, StateT | None] = {}

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._held

    @contextlib.contextmanager
    def track(self, request_id: str, state: StateT | None = None) -> Iterator[None]:
        """Hold `request_id` for the body of the `with` (a stream's whole life)."""
        self.begin(request_id, state)
        try:
            yield
        finally:
            self.end(request_id)

    def begin(self, request_id: str, state: StateT | None = None) -> None:
        self._held[request_id] = state

    def end(self, request_id: str) -> StateT | None:
        """Let go of a request that finished; returns its state."""
        return self._held.pop(request_id, None)

    def abort(self, request_id: str) -> StateT | None:
        """Drop a request now (its stream notices at its next step); returns its state."""
        return self._held.pop(request_id, None)

    def aborted(self, request_id: str) -> bool:
        """Whether a stream's request is gone: aborted, or the engine closed."""
        return request_id not in self._held

    def state(self, request_id: str) -> StateT | None:
        return self._held.get(request_id)

    def set_state(self, request_id: str, state: StateT | None) -> None:
        """Attach state to a held request; a request aborted meanwhile stays gone."""
        if request_id in self._held:
            self._held[request_id] = state

    def ids(self) -> set[str]:
        return set(self._held)

    def clear(self) -> list[StateT]:
        """Drop every request (the engine closes); returns the states to free."""
        states = [state for state in self._held.values() if state is not None]
        self._held.clear()
        return states


class TracksRequests:
    """The engine methods that only keep books over `_requests`, written once.

    Mix it in before `EntryEngine` / `StreamEngine`: `abort` drops the request, `close`
    drops them all, `active_requests` counts them, and `start` has nothing to load. An
    engine that loads a model or frees per-request state overrides just those methods.
    """

    _requests: RequestTracker[Any]

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        self._requests.clear()

    def active_requests(self) -> int:
        return len(self._requests)

    async def abort(self, request_id: str) -> None:
        self._requests.abort(request_id)
