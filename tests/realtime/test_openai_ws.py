"""OpenAI Realtime over a WebSocket, end to end: the official SDK and raw clients against
a real uvicorn server on a loopback port, with a fake model engine behind a graph file."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from openai import AsyncOpenAI
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter
from starlette.testclient import TestClient, WebSocketTestSession
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from loadtest.speech import silence, speak, trim_silence
from realtime.g711 import ulaw_encode
from realtime.openai.ga_events import source_id
from realtime.openai.server_events import PARLEY_EVENTS
from realtime.transports.websocket.connection import MAX_MESSAGE_BYTES
from realtime.transports.websocket.connection import MAX_MESSAGE_BYTES as WS_MAX_SIZE
from tests.realtime.apps import ServedApp, fake_graph_file, served_app
from tests.realtime.clients import RecordingClient
from web.app import create_app
from web.settings import Settings

PARLEY_TYPES = {cls.type for cls in PARLEY_EVENTS}

KEY = "sk-test-parley-ws"
RATE = 24_000


@pytest.fixture
def graph(tmp_path: Path) -> str:
    return fake_graph_file(tmp_path, "audio_ms: 6000, realtime_factor: 4.0")


@pytest.fixture
async def server(graph: str, redis_url: str) -> AsyncIterator[ServedApp]:
    settings = Settings(pipeline=graph, api_key=KEY, max_sessions=2)
    async with served_app(settings, redis_url) as served:
        yield served


@contextlib.asynccontextmanager
async def raw(
    server: ServedApp, query: str = "", headers: dict[str, str] | None = None, **kwargs: Any
) -> AsyncIterator[RecordingClient]:
    headers = {"Authorization": f"Bearer {KEY}"} if headers is None else headers
    url = f"{server.ws_url}/v1/realtime?model=parley{'&' + query if query else ''}"
    async with connect(url, additional_headers=headers, proxy=None, **kwargs) as ws:
        yield RecordingClient(ws)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def utterance(text: str) -> np.ndarray:
    """Speech at 24 kHz with silence around it, long enough to end the turn."""
    speech = trim_silence(speak(text, rate=RATE))
    return np.concatenate([silence(300, RATE), speech, silence(900, RATE)])


def types(events: list[Any]) -> list[str]:
    return [e["type"] if isinstance(e, dict) else e.type for e in events]


@pytest.mark.slow
async def test_the_openai_sdk_holds_a_spoken_turn(server: ServedApp) -> None:
    base_url = f"{server.http_url}/v1"
    async with (
        AsyncOpenAI(api_key=KEY, base_url=base_url) as client,
        client.realtime.connect(model="parley") as conn,
    ):
        created = await conn.recv()
        assert created.type == "session.created"
        pcm = utterance("What is the weather like today?")
        step = RATE // 10
        for start in range(0, len(pcm), step):
            chunk = pcm[start : start + step].astype("<i2").tobytes()
            await conn.input_audio_buffer.append(audio=b64(chunk))
        events: list[Any] = []
        async with asyncio.timeout(30):
            while not events or events[-1].type != "response.done":
                events.append(await conn.recv())
    got = types(events)
    order = [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "response.created",
        "rate_limits.updated",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    positions = [got.index(name) for name in order]
    assert positions == sorted(positions), got
    assert all(getattr(e, "event_id", None) for e in events)
    done = events[-1]
    assert done.response.status == "completed"
    deltas = [e.delta for e in events if e.type == "response.output_audio_transcript.delta"]
    transcript = next(e for e in events if e.type == "response.output_audio_transcript.done")
    assert transcript.transcript == "".join(deltas)
    assert transcript.transcript.startswith("Hello there")
    audio = b"".join(
        base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"
    )
    assert len(audio) // 2 == 6 * RATE  # all 6 s of the answer, PCM16 at 24 kHz
    last_delta = max(i for i, name in enumerate(got) if name == "response.output_audio.delta")
    assert last_delta < got.index("response.output_audio.done")


async def test_speaking_over_the_answer_cancels_it_and_truncates_to_what_was_sent(
    server: ServedApp,
) -> None:
    base_url = f"{server.http_url}/v1"
    async with (
        AsyncOpenAI(api_key=KEY, base_url=base_url) as client,
        client.realtime.connect(model="parley") as conn,
    ):
        pcm = utterance("What is the weather like today?")
        await conn.input_audio_buffer.append(audio=b64(pcm.astype("<i2").tobytes()))
        events: list[Any] = []
        received_ms = 0.0

        async def read_until(name: str) -> Any:
            nonlocal received_ms
            async with asyncio.timeout(20):
                while True:
                    event = await conn.recv()
                    events.append(event)
                    if event.type == "response.output_audio.delta":
                        received_ms += len(base64.b64decode(event.delta)) / 2 / RATE * 1000
                    if event.type == name:
                        return event

        await read_until("response.output_audio.delta")
        await asyncio.sleep(0.8)  # the answer plays on
        interruption = utterance("Hold on, stop.")
        await conn.input_audio_buffer.append(audio=b64(interruption.astype("<i2").tobytes()))
        done = await read_until("response.done")
        assert done.response.status == "cancelled"
        assert done.response.status_details.reason == "turn_detected"
        truncated = await read_until("conversation.item.truncated")
        # The interruption is a turn of its own: stop its answer too, so the socket is
        # quiet and closes at once (a client that stops reading holds up the close).
        await read_until("response.created")
        await conn.response.cancel()
        await read_until("response.done")
    assert 700 <= truncated.audio_end_ms < 4000
    # The cursor is the audio sent: what this client received, to within one piece.
    assert abs(truncated.audio_end_ms - received_ms) <= 120
    answer_item = done.response.output[0].id
    after = events[types(events).index("response.done") :]
    assert not [
        e for e in after if e.type == "response.output_audio.delta" and e.item_id == answer_item
    ]


async def test_a_question_begun_in_the_answers_last_moments_is_answered(
    tmp_path: Path, redis_url: str
) -> None:
    """The client says its next question as it finishes playing the answer: the voice
    begins after all of the answer was sent, and the answer ends before the voice is long
    enough to interrupt it. The question is still a turn, and gets its answer (it was
    taken for noise, and lost, in a one-session benchmark)."""
    answer_ms = 1500
    graph = fake_graph_file(tmp_path, f"audio_ms: {answer_ms}, realtime_factor: 50.0")
    settings = Settings(pipeline=graph, api_key=KEY)
    async with served_app(settings, redis_url) as served, raw(served) as client:
        await client.wait_type("session.created")
        detection = {"type": "server_vad", "min_speech_ms": 500}
        update = {"audio": {"input": {"turn_detection": detection}}}
        await client.send({"type": "session.update", "session": update})
        await client.wait_type("session.updated")
        first = utterance("What is the weather like today?")
        await client.send({"type": "input_audio_buffer.append", "audio": b64(first.tobytes())})
        await client.wait_type("response.output_audio.delta")
        answer_end = time.monotonic() + answer_ms / 1000
        question = np.concatenate(
            [trim_silence(speak("And tomorrow?", rate=RATE)), silence(900, RATE)]
        ).astype("<i2")
        step = RATE // 50  # 20 ms, sent at the pace of a microphone
        start = answer_end - 0.15  # the voice begins after the last audio was sent
        for k, at in enumerate(range(0, len(question), step)):
            await asyncio.sleep(max(0.0, start + k * 0.02 - time.monotonic()))
            chunk = question[at : at + step].tobytes()
            await client.send({"type": "input_audio_buffer.append", "audio": b64(chunk)})
        done = await client.wait_type("response.done")
        again = await client.wait_type("response.done", within_s=15)
        assert again["response"]["status"] == "completed", (done, again)


async def test_every_event_of_a_session_is_one_the_openai_sdk_declares(
    server: ServedApp,
) -> None:
    """A spoken turn, session.update, a typed turn cancelled, a bad message: every event
    validates against the SDK's server event union (issue 11); Parley's own events only
    after the client opts in."""
    async with raw(server) as client:
        await client.wait_type("session.created")
        await client.append(utterance("What is the weather like today?"))
        # The fake engine transcribes nothing: test_server_events validates the transcript.
        await client.wait_type("response.done", within_s=30)
        await client.send({"type": "session.update", "session": {"instructions": "Be brief."}})
        await client.wait_type("session.updated")
        await client.until_quiet()  # the spoken answer's response ends a moment after its done
        await client.send(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Hello?"}],
                },
            }
        )
        await client.send({"type": "response.create"})
        await client.wait_type("response.output_audio.delta")
        await client.send({"type": "response.cancel"})
        await client.wait_for(
            lambda e: e["type"] == "response.done" and e["response"]["status"] == "cancelled"
        )
        await client.send({"type": "no.such.event"})
        await client.wait_type("error")
        await client.send({"type": "session.update", "session": {"parley": {"extra_events": True}}})
        updated = await client.wait_type("session.updated")
        assert updated["session"]["parley"]["extra_events"] is True
        await client.send({"type": "response.create"})
        await client.wait_type("session.state_changed")  # opted in: Parley's own events too
        sent = client.events[: client.events.index(updated)]

    sdk_event: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
    for message in sent:
        assert sdk_event.validate_python(message).type == message["type"]
    assert {"input_audio_buffer.speech_started", "session.updated", "error"} <= set(types(sent))


async def test_manual_turns_cancel_and_truncate_from_the_client(server: ServedApp) -> None:
    async with raw(server) as client:
        await client.wait_for(lambda e: e["type"] == "session.created")
        await client.send(
            {"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}
        )
        await client.wait_for(lambda e: e["type"] == "session.updated")
        await client.send(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Hello?"}],
                },
            }
        )
        await client.send({"type": "response.create"})
        delta = await client.wait_for(lambda e: e["type"] == "response.output_audio.delta")
        await client.send({"type": "response.cancel"})
        done = await client.wait_for(lambda e: e["type"] == "response.done")
        assert done["response"]["status"] == "cancelled"
        await client.send(
            {
                "type": "conversation.item.truncate",
                "item_id": delta["item_id"],
                "content_index": 0,
                "audio_end_ms": 50,
            }
        )
        truncated = await client.wait_for(
            lambda e: e["type"] == "conversation.item.truncated" and e["audio_end_ms"] == 50
        )
        assert truncated["item_id"] == delta["item_id"]
        assert "error" not in types(client.events)


async def test_an_agent_frameworks_defaults_apply_through_the_sdk(server: ServedApp) -> None:
    """The Agents SDK's and LiveKit's defaults: semantic_vad with instructions (plus a
    setting Parley cannot use), and a response.create whose metadata must come back."""
    base_url = f"{server.http_url}/v1"
    async with (
        AsyncOpenAI(api_key=KEY, base_url=base_url) as client,
        client.realtime.connect(model="parley") as conn,
    ):
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(
            session={
                "type": "realtime",
                "instructions": "You are a pirate.",
                "audio": {
                    "input": {"turn_detection": {"type": "semantic_vad", "eagerness": "auto"}},
                    "output": {"voice": "marin", "format": {"type": "audio/pcm", "rate": 7}},  # type: ignore[typeddict-item]
                },
            },
            event_id="evt_upd",
        )
        error = await conn.recv()
        assert error.type == "error"
        assert (error.error.event_id, error.error.param) == (
            "evt_upd",
            "session.audio.output.format.rate",
        )
        updated = await conn.recv()
        assert updated.type == "session.updated"
        session: dict[str, Any] = json.loads(updated.session.to_json())
        assert session["instructions"] == "You are a pirate."
        vad = session["audio"]["input"]["turn_detection"]
        assert (vad["type"], vad["eagerness"]) == ("semantic_vad", "auto")
        assert session["audio"]["output"]["voice"] == "marin"
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hello?"}],
            }
        )
        metadata = {"client_event_id": "lk_reply_1"}
        await conn.response.create(response={"metadata": metadata})
        events: list[Any] = []
        async with asyncio.timeout(30):
            while not events or events[-1].type != "response.done":
                events.append(await conn.recv())
    created = next(e for e in events if e.type == "response.created")
    assert created.response.metadata == metadata
    assert events[-1].response.metadata == metadata
    assert "error" not in types(events)


async def test_malformed_messages_get_errors_and_the_connection_stays_open(
    server: ServedApp,
) -> None:
    async with raw(server) as client:
        await client.wait_for(lambda e: e["type"] == "session.created")
        cases = [
            ("{not json", "invalid_json"),
            (json.dumps({"type": "no.such.event", "event_id": "c1"}), "unknown_event_type"),
            (json.dumps({"type": "input_audio_buffer.append", "audio": 5}), "invalid_type"),
            (json.dumps(["an", "array"]), "invalid_event"),
        ]
        for raw_message, code in cases:
            await client.ws.send(raw_message)
            error = await client.wait_for(lambda e: e["type"] == "error")
            assert error["error"]["code"] == code, error
            assert error["event_id"]
        await client.send({"type": "session.update", "session": {"instructions": "Be brief."}})
        updated = await client.wait_for(lambda e: e["type"] == "session.updated")
        assert updated["session"]["instructions"] == "Be brief."
        await client.ws.send("x" * (WS_MAX_SIZE + 1))
        with pytest.raises(ConnectionClosed) as closed:
            await client.read_to_the_end()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


@pytest.mark.slow
async def test_g711_both_ways(server: ServedApp) -> None:
    async with raw(server) as client:
        await client.wait_for(lambda e: e["type"] == "session.created")
        await client.send(
            {
                "type": "session.update",
                "session": {
                    "audio": {
                        "input": {"format": {"type": "audio/pcmu"}},
                        "output": {"format": {"type": "audio/pcmu"}},
                    }
                },
            }
        )
        updated = await client.wait_for(lambda e: e["type"] == "session.updated")
        assert updated["session"]["audio"]["output"]["format"] == {"type": "audio/pcmu"}
        speech = trim_silence(speak("What is the weather like today?", rate=8_000))
        pcm = np.concatenate([silence(300, 8_000), speech, silence(900, 8_000)])
        for start in range(0, len(pcm), 800):
            payload = ulaw_encode(pcm[start : start + 800])
            await client.send({"type": "input_audio_buffer.append", "audio": b64(payload)})
        await client.wait_for(lambda e: e["type"] == "response.done", within_s=30)
    audio = b"".join(
        base64.b64decode(e["delta"])
        for e in client.events
        if e["type"] == "response.output_audio.delta"
    )
    assert len(audio) == 6 * 8_000  # one byte a sample at 8 kHz
    # Each audio delta is named after the last event sent before it: `<that id>~<n>`.
    ids = [e["event_id"] for e in client.events if e["type"] == "response.output_audio.delta"]
    anchors = {e["event_id"] for e in client.events if "~" not in e["event_id"]}
    assert all(i.count("~") == 1 and i.split("~")[0] in anchors for i in ids), ids[:3]
    assert [int(i.split("~")[1]) for i in ids] == sorted({int(i.split("~")[1]) for i in ids})


async def test_auth_by_header_subprotocol_or_secret(server: ServedApp) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        with pytest.raises(InvalidStatus) as refused:
            async with raw(server, headers=headers):
                pass
        assert refused.value.response.status_code == 401
    protocols = ["realtime", f"openai-insecure-api-key.{KEY}"]
    async with raw(server, headers={}, subprotocols=protocols) as client:
        assert client.ws.subprotocol == "realtime"
        await client.wait_for(lambda e: e["type"] == "session.created")
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        minted = await http.post(
            "/v1/realtime/client_secrets",
            headers={"Authorization": f"Bearer {KEY}"},
            json={"session": {"type": "realtime", "instructions": "Speak like a pirate."}},
        )
    secret = minted.json()["value"]
    async with raw(server, headers={"Authorization": f"Bearer {secret}"}) as client:
        created = await client.wait_for(lambda e: e["type"] == "session.created")
        assert created["session"]["instructions"] == "Speak like a pirate."


async def test_the_session_cap_is_an_error_event_then_a_close(server: ServedApp) -> None:
    async with raw(server) as one, raw(server) as two:
        for client in (one, two):
            await client.wait_for(lambda e: e["type"] == "session.created")
        async with raw(server) as three:
            error = await three.next()
            assert error["type"] == "error" and error["error"]["code"] == "session_limit"
            with pytest.raises(ConnectionClosed) as closed:
                await three.ws.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013


async def test_a_dropped_connection_resumes_with_the_missed_events_exactly_once(
    server: ServedApp,
) -> None:
    async with raw(server) as first:
        created = await first.wait_for(lambda e: e["type"] == "session.created")
        session_id = created["session"]["id"]
        token = created["session"]["parley"]["resume_token"]
        await first.append(utterance("What is the weather like today?"))
        await first.wait_for(lambda e: e["type"] == "response.output_audio.delta")
        for _ in range(3):
            await first.next()
        last = first.events[-1]["event_id"]
        first.ws.transport.abort()  # the network drops: no close frame, nothing more read
    manager = server.services.manager
    assert manager is not None
    session = manager.get(session_id)
    async with asyncio.timeout(5):
        while session.responding:  # the server noticed and stopped the answer
            await asyncio.sleep(0.02)
    assert not session.closed

    async with raw(server, f"session_id={session_id}&resume_token=wrong") as intruder:
        error = await intruder.next()
        assert error["error"]["code"] == "session_not_found"
    query = f"session_id={session_id}&resume_token={token}&last_event_id={last}"
    async with raw(server, query) as second:
        replayed = await second.until_quiet()
        await second.send({"type": "session.update", "session": {"instructions": "Go on."}})
        live = await second.wait_for(lambda e: e["type"] == "session.updated")
        # Read while the session lives: the clean close at the end of the block ends it,
        # and its log with it.
        await session.event_log.flushed()
        logged = [
            body["event_id"]
            for body in await session.event_log.replay()
            if body["type"] not in PARLEY_TYPES  # not sent: the client did not opt in
        ]

    ids_before = [e["event_id"] for e in first.events]
    ids_after = [e["event_id"] for e in replayed]
    assert len(set(ids_after)) == len(ids_after)
    assert not set(ids_before) & set(ids_after)
    assert live["event_id"] not in ids_after
    # Every session event logged after the client's last one, in order, and nothing else.
    after_last = logged[logged.index(source_id(last)) + 1 : logged.index(live["event_id"])]
    assert [i for i in ids_after if i in set(logged)] == after_last
    assert {source_id(i) for i in ids_after} <= set(after_last) | {source_id(last)}
    done = [e for e in replayed if e["type"] == "response.done"]
    # the drop cut it short: nobody cancelled it
    assert len(done) == 1 and done[0]["response"]["status"] == "incomplete"
    assert done[0]["response"]["status_details"]["parley"] == {"reason": "client_disconnected"}
    assert "response.output_audio.delta" not in types(replayed)  # stale audio is not replayed


async def test_a_resume_takes_over_from_a_connection_the_server_still_holds(
    server: ServedApp,
) -> None:
    async with raw(server) as first:
        created = await first.wait_for(lambda e: e["type"] == "session.created")
        session = created["session"]
        query = (
            f"session_id={session['id']}&resume_token={session['parley']['resume_token']}"
            f"&last_event_id={created['event_id']}"
        )
        async with raw(server, query) as second:
            with pytest.raises(ConnectionClosed) as closed:
                await first.read_to_the_end()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
            await second.send({"type": "session.update", "session": {"instructions": "Hi."}})
            updated = await second.wait_for(lambda e: e["type"] == "session.updated")
            assert updated["session"]["id"] == session["id"]


async def test_beta_clients_get_beta_event_names(server: ServedApp) -> None:
    async with raw(
        server, headers={"Authorization": f"Bearer {KEY}", "OpenAI-Beta": "realtime=v1"}
    ) as client:
        await client.wait_for(lambda e: e["type"] == "session.created")
        await client.send(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Hello?"}],
                },
            }
        )
        created = await client.wait_for(lambda e: e["type"].startswith("conversation.item."))
        assert created["type"] == "conversation.item.created"


def test_in_process_clients_are_held_to_the_size_limit_too(graph: str, redis_url: str) -> None:
    """Without uvicorn's ws_max_size (an ASGI test client), the connection checks itself."""
    app = create_app(Settings(pipeline=graph, api_key=KEY), redis_url)
    with TestClient(app) as http:
        deadline = time.monotonic() + 10
        while not app.state.services.pipeline_ready and time.monotonic() < deadline:
            time.sleep(0.02)
        headers = {"Authorization": f"Bearer {KEY}"}
        with http.websocket_connect("/v1/realtime?model=parley", headers=headers) as ws:
            assert ws.receive_json()["type"] == "session.created"
            ws.send_text("x" * (MAX_MESSAGE_BYTES + 1))
            with pytest.raises(WebSocketDisconnect) as closed:
                _read_until_closed(ws)
            assert closed.value.code == 1009


def _read_until_closed(ws: WebSocketTestSession) -> None:
    while True:
        ws.receive_json()
