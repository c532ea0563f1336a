"""A session's own limits, against a real `parley serve`: the idle timeout counts only while
nothing happens (never while an answer generates or plays), the maximum duration warns and
then ends the session, and each end names its real reason to the client."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.realtime.apps import fake_graph_file
from tests.realtime.clients import RecordingClient
from tests.web.test_cli import Server, free_port, servers

__all__ = ["servers"]  # the fixture, used by the tests below

pytestmark = pytest.mark.slow

ROOT = str(Path(__file__).parents[2])  # the fake engine is imported from tests/
LONG_ANSWER = "audio_ms: 4000, chunk_ms: 100, realtime_factor: 1.0"
"""An answer that takes 4 s to generate and to play: longer than the idle setting."""
ENDLESS_ANSWER = "audio_ms: 30000, chunk_ms: 100, realtime_factor: 1.0"
"""An answer longer than the whole session."""
MANUAL_TURNS: dict[str, Any] = {
    "type": "session.update",
    "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}},
}


@contextlib.contextmanager
def serve(
    servers: list[Server], directory: Path, redis_url: str, answer: str, *options: str
) -> Iterator[int]:
    """`parley serve` on the fake graph answering `answer` (its engine args), ready: its
    port; stopped with SIGTERM (so that it removes its own keys) at the end."""
    port = free_port()
    graph = fake_graph_file(directory, answer)
    server = Server(
        "--port", str(port), "--pipeline", graph, "--redis-url", redis_url, *options,
        env={"PYTHONPATH": ROOT},
    )  # fmt: skip
    servers.append(server)
    server.wait_for_line("Parley is ready", timeout=60)
    yield port
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(30) == 0


def speech(seconds: float = 0.5) -> np.ndarray:
    t = np.arange(int(24_000 * seconds)) / 24_000
    return (np.sin(2 * np.pi * 220 * t) * 8000).astype(np.int16)


async def test_a_listening_client_hears_an_answer_longer_than_the_idle_timeout(
    servers: list[Server], tmp_path: Path, redis_url: str
) -> None:
    """Manual turns, one question, then only reading: the answer plays to its end although
    it outlasts `--idle-timeout-s`, and only then does the idle time count; the session
    ends with `idle_timeout` named in an error and in the close frame."""
    with serve(servers, tmp_path, redis_url, LONG_ANSWER, "--idle-timeout-s", "1") as port:
        await listen_past_the_idle_timeout(port)


async def listen_past_the_idle_timeout(port: int) -> None:
    async with connect(f"ws://127.0.0.1:{port}/v1/realtime?model=parley", proxy=None) as ws:
        client = RecordingClient(ws, wait_s=20)
        await client.wait_type("session.created")
        await client.send(MANUAL_TURNS)
        await client.wait_type("session.updated")
        await client.ask(speech())
        done = await client.wait_type("response.done")
        response = done["response"]
        assert response["status"] == "completed", response["status_details"]
        assert client.audio_ms(response["id"]) == pytest.approx(4000, abs=100)
        answered = time.monotonic()
        expired = await client.wait_type("error", within_s=10)
        waited = time.monotonic() - answered
        assert expired["error"]["code"] == "session_idle_timeout"
        assert "1 s" in expired["error"]["message"]
        assert 0.5 <= waited <= 6, waited  # counted from the answer's end, not from the ask
        with pytest.raises(ConnectionClosed):
            await client.read_to_the_end()
        assert ws.close_code == 1000
        assert ws.close_reason == "idle_timeout"


async def test_the_maximum_duration_warns_then_ends_the_answer_and_the_session(
    servers: list[Server], tmp_path: Path, redis_url: str
) -> None:
    """`--max-session-minutes`: `session.expiring` first (to a client that asked for
    Parley's events), then the answer in progress ends `incomplete` (nobody cancelled it:
    OpenAI's reasons do not fit, Parley's is under `parley`), `session_expired`, and the
    close frame says `max_duration`."""
    with serve(
        servers, tmp_path, redis_url, ENDLESS_ANSWER, "--max-session-minutes", "0.1"
    ) as port:
        client = await talk_until_the_end(port)
    kinds = [e["type"] for e in client.events]
    # the error, then the answer's end, then the goodbye
    assert kinds.index("error") < kinds.index("response.done") < kinds.index("session.closed")
    (done,) = [e for e in client.events if e["type"] == "response.done"]
    assert done["response"]["status"] == "incomplete"
    assert done["response"]["status_details"]["reason"] is None  # none of OpenAI's four fits
    assert done["response"]["status_details"]["parley"] == {"reason": "max_duration"}
    (expired,) = [e for e in client.events if e["type"] == "error"]
    assert expired["error"]["code"] == "session_expired"
    assert "maximum duration of 0.1 minutes" in expired["error"]["message"]
    (closed,) = [e for e in client.events if e["type"] == "session.closed"]
    assert closed["reason"] == "max_duration"


async def talk_until_the_end(port: int) -> RecordingClient:
    """Warned of the end, the client asks a question whose answer outlasts the session,
    and reads until the server closes the connection."""
    async with connect(f"ws://127.0.0.1:{port}/v1/realtime?model=parley", proxy=None) as ws:
        client = RecordingClient(ws, wait_s=20)
        await client.wait_type("session.created")
        update = {**MANUAL_TURNS, "session": {**MANUAL_TURNS["session"]}}
        update["session"]["parley"] = {"extra_events": True}
        await client.send(update)
        await client.wait_type("session.updated")
        await client.wait_type("session.expiring")
        await client.ask(speech())
        with pytest.raises(ConnectionClosed):
            await client.read_to_the_end(within_s=20)
        assert (ws.close_code, ws.close_reason) == (1000, "max_duration")
    return client
