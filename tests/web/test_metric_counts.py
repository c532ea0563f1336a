"""Every metric counts what its name says, once: a real `parley serve` given a known workload
(spoken turns, each answered, over the OpenAI WebSocket with server VAD) and its /metrics
read against what happened."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import signal
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect

from loadtest.speech import silence, speak, trim_silence
from tests.realtime.clients import RecordingClient
from tests.web.test_cli import Server, free_port, servers

__all__ = ["servers"]  # the fixture, used by the tests below

pytestmark = pytest.mark.slow

RATE = 24_000
TURNS = ("Hello there.", "What time is it?", "Thank you very much.")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@contextlib.contextmanager
def echo_server(servers: list[Server], redis_url: str) -> Iterator[int]:
    """`parley serve --pipeline echo` (each turn answered with the user's own voice; no
    recogniser, so a turn's transcription request ends with no output), ready: its port."""
    port = free_port()
    server = Server("--port", str(port), "--pipeline", "echo", "--redis-url", redis_url)
    servers.append(server)
    server.wait_for_line("Parley is ready", timeout=60)
    yield port
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(30) == 0


def scrape(port: int) -> Samples:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample `name` with exactly `labels` (0 when the series was never touched)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum over every series of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))


async def speak_turns(port: int) -> tuple[RecordingClient, Samples]:
    """Each of TURNS spoken and answered in turn; the metrics while the session is open."""
    async with connect(f"ws://127.0.0.1:{port}/v1/realtime?model=parley", proxy=None) as ws:
        client = RecordingClient(ws, wait_s=30)
        await client.wait_type("session.created")
        for text in TURNS:
            pcm = np.concatenate(
                [silence(300, RATE), trim_silence(speak(text, rate=RATE)), silence(900, RATE)]
            )
            for start in range(0, len(pcm), RATE // 10):
                chunk = pcm[start : start + RATE // 10].astype("<i2").tobytes()
                audio = base64.b64encode(chunk).decode("ascii")
                await client.send({"type": "input_audio_buffer.append", "audio": audio})
            done = await client.wait_type("response.done")
            assert done["response"]["status"] == "completed", done
            # a listener hears the answer out before speaking again (else it is a barge-in)
            await asyncio.sleep(client.audio_ms(done["response"]["id"]) / 1000 + 0.5)
        await asyncio.sleep(2.5)  # the session's figures are published at most 2 s late
        return client, scrape(port)


async def test_each_metric_counts_a_known_workload_once(
    servers: list[Server], redis_url: str
) -> None:
    with echo_server(servers, redis_url) as port:
        client, during = await speak_turns(port)
        await asyncio.sleep(2.5)
        after = scrape(port)
    n = len(TURNS)
    assert [e["type"] for e in client.events].count("response.done") == n
    assert value(during, "parley_active_sessions") == 1
    assert value(after, "parley_active_sessions") == 0
    assert value(after, "parley_turns_total") == n
    assert value(after, "parley_responses_total", status="completed") == n
    assert total(after, "parley_responses_total") == n
    assert value(after, "parley_barge_ins_total") == 0
    assert value(after, "parley_session_limit_rejections_total") == 0
    assert value(after, "parley_redis_errors_total") == 0
    # one first chunk per answer; the turns' transcription requests (echo has no recogniser:
    # they end with no output) are not counted as if they were answers, nor at all
    first = "parley_stage_first_chunk_seconds_count"
    assert value(after, first, stage="echo", kind="answer") == n
    assert total(after, first, kind="transcription") == 0
    assert total(after, first) == n
    assert value(after, "parley_stage_active_requests", stage="echo") == 0
    assert value(after, "parley_webrtc_calls") == 0
