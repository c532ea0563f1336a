"""Parley on a three-node Redis Cluster, as a user runs it: `--redis-url` names one node,
the server finds out it is a cluster, and OpenAI Realtime sessions over a WebSocket live
their whole life on it (echo pipeline): a spoken turn answered, its history, a dropped
connection resumed from the event log, the global session cap across two processes, and no
key left on any node once the sessions end."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from redis.asyncio.cluster import RedisCluster
from redis.cluster import key_slot
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from loadtest.speech import silence, speak, trim_silence
from sessions.keys import SessionKeys
from tests.realtime.apps import ServedApp, fake_graph_file, served_app
from tests.realtime.clients import Event, RecordingClient
from tests.redis_cluster import ClusterProcesses, redis_cluster, redis_cluster_url
from web.settings import Settings

__all__ = ["redis_cluster", "redis_cluster_url"]  # fixtures, used by name

KEY = "sk-test-parley-cluster"
RATE = 24_000
SETTINGS = Settings(pipeline="echo", api_key=KEY, max_sessions=2)


@contextlib.asynccontextmanager
async def openai_client(server: ServedApp, query: str = "") -> AsyncIterator[RecordingClient]:
    url = f"{server.ws_url}/v1/realtime?model=parley{'&' + query if query else ''}"
    headers = {"Authorization": f"Bearer {KEY}"}
    async with connect(url, additional_headers=headers, proxy=None) as ws:
        yield RecordingClient(ws)


def utterance(text: str) -> np.ndarray:
    """Speech at 24 kHz with silence around it, long enough to end the turn."""
    speech = trim_silence(speak(text, rate=RATE))
    return np.concatenate([silence(300, RATE), speech, silence(900, RATE)])


def session_keys_on_nodes(cluster: ClusterProcesses, session_id: str) -> dict[int, int]:
    """port -> how many of the session's keys that node holds (nodes holding none left out)."""
    held: dict[int, int] = {}
    for port, client in zip(cluster.ports, cluster.clients(), strict=True):
        with client:
            count = len(list(client.scan_iter(match=f"*{{{session_id}}}*")))
        if count:
            held[port] = count
    return held


async def ended(server: ServedApp) -> None:
    """Until the server has no session left (a clean close ends one in the background)."""
    manager = server.services.manager
    assert manager is not None
    async with asyncio.timeout(10):
        while len(manager):
            await asyncio.sleep(0.02)


@pytest.fixture
async def server(redis_cluster_url: str) -> AsyncIterator[ServedApp]:
    async with served_app(SETTINGS, redis_cluster_url) as served:
        assert isinstance(served.services.redis, RedisCluster)  # told by the server itself
        yield served


async def test_a_session_lives_its_whole_life_on_the_cluster(
    server: ServedApp, redis_cluster: ClusterProcesses
) -> None:
    async with openai_client(server) as first:
        created = await first.wait_type("session.created")
        session_id = created["session"]["id"]
        token = created["session"]["parley"]["resume_token"]
        await first.append(utterance("What is the weather like today?"))
        done = await first.wait_type("response.done", within_s=20)
        assert done["response"]["status"] == "completed"
        assert first.audio_ms(done["response"]["id"]) > 500  # the echo of the question
        running = server.services.running
        assert running is not None
        session = running.manager.get(session_id)
        roles = [item.role for item in await session.history.items()]
        assert roles == ["user", "assistant"]
        held = session_keys_on_nodes(redis_cluster, session_id)
        assert len(held) == 1 and sum(held.values()) >= 4  # one slot: audio, events, ...

        # The network drops mid-answer; the client comes back with its last event id.
        await first.append(utterance("And what about tomorrow?"))
        await first.wait_type("response.output_audio.delta", within_s=20)
        last = first.events[-1]["event_id"]
        first.ws.transport.abort()
    async with asyncio.timeout(5):
        while session.responding:
            await asyncio.sleep(0.02)
    query = f"session_id={session_id}&resume_token={token}&last_event_id={last}"
    async with openai_client(server, query) as second:
        replayed = await second.until_quiet()
        assert replayed, "nothing replayed from the event log"
        seen = {e["event_id"] for e in first.events}
        assert not seen & {e["event_id"] for e in replayed}  # nothing sent twice
        # The second answer's end (cancelled, or completed if the echo outran the drop).
        assert [e["type"] for e in replayed].count("response.done") == 1
        await second.send({"type": "session.update", "session": {"instructions": "Go on."}})
        await second.wait_type("session.updated")
    await ended(server)
    assert session_keys_on_nodes(redis_cluster, session_id) == {}
    # The lease zset went with the last lease; only the live process's own record stays
    # (and goes when the server stops: the fixture checks every node after the test).
    assert [k for k in redis_cluster.all_keys() if not k.startswith(b"parley:process:")] == []


async def test_the_cap_holds_across_two_processes_on_the_cluster(
    redis_cluster_url: str, redis_cluster: ClusterProcesses
) -> None:
    async with (
        served_app(SETTINGS, redis_cluster_url) as a,
        served_app(SETTINGS, redis_cluster_url) as b,
    ):
        async with openai_client(a) as one, openai_client(b) as two:
            ids: list[str] = []
            for client in (one, two):
                created: Event = await client.wait_type("session.created")
                ids.append(created["session"]["id"])
            for server in (a, b):
                async with openai_client(server) as three:
                    error = await three.next()
                    assert error["type"] == "error"
                    assert error["error"]["code"] == "session_limit"
                    with pytest.raises(ConnectionClosed):
                        await three.ws.recv()
            # Two sessions, two slots (the hash tag), each session whole on one node.
            slots = [key_slot(SessionKeys(sid).events.encode()) for sid in ids]
            assert slots[0] != slots[1]
            for sid in ids:
                assert len(session_keys_on_nodes(redis_cluster, sid)) == 1
        await ended(a)
        await ended(b)
    assert redis_cluster.all_keys() == []


async def test_a_session_moves_to_the_other_process_on_the_cluster(
    tmp_path: Path, redis_cluster_url: str, redis_cluster: ClusterProcesses
) -> None:
    """A resume on B while A still serves the connection: B takes the session over and
    asks A (over pub/sub, through the cluster) to let go; A tells its client it moved."""
    graph = fake_graph_file(tmp_path, "audio_ms: 400, text_interval_s: 0.05, realtime_factor: 4.0")
    settings = Settings(pipeline=graph, api_key=KEY, max_sessions=4)
    async with (
        served_app(settings, redis_cluster_url) as a,
        served_app(settings, redis_cluster_url) as b,
    ):
        async with openai_client(a) as first:
            created = await first.wait_type("session.created")
            session_id = created["session"]["id"]
            token = created["session"]["parley"]["resume_token"]
            await ask(first, "Hello?")
            assert (await first.wait_type("response.done"))["response"]["status"] == "completed"
            last = first.events[-1]["event_id"]
            query = f"session_id={session_id}&resume_token={token}&last_event_id={last}"
            start = time.perf_counter()
            async with openai_client(b, query) as second:
                moved = await first.wait_type("error")
                assert moved["error"]["code"] == "session_moved"
                assert time.perf_counter() - start < 1.0  # A heard B's request at once
                await ask(second, "Are you there?")
                done = await second.wait_type("response.done")
                assert done["response"]["status"] == "completed"
                running = b.services.running
                assert running is not None
                items = await running.manager.get(session_id).history.items()
                assert [i.text for i in items][0::2] == ["Hello?", "Are you there?"]
        await ended(a)
        await ended(b)
    assert redis_cluster.all_keys() == []


async def ask(client: RecordingClient, text: str) -> None:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    await client.send({"type": "conversation.item.create", "item": item})
    await client.send({"type": "response.create"})
