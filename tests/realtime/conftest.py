"""Realtime fixtures: the session fixtures (a manager on the test Redis, a fake engine,
a clocked sink), shared so protocol tests drive a real Session."""

from __future__ import annotations

from tests.sessions.conftest import MakeSession, engine, limits, make_session, manager

__all__ = ["MakeSession", "engine", "limits", "make_session", "manager"]
