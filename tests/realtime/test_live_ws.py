"""GPT-Live over a WebSocket (`/v1/live/sessions`), end to end: the official SDK's
`client.live` and a raw client against a real uvicorn server on a loopback port, with a
fake model engine behind a graph file."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from openai import AsyncOpenAI
from openai.types.live import SessionConfigParam
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from loadtest.speech import silence, speak, trim_silence
from tests.realtime.apps import ServedApp, fake_graph_file, served_app
from web.settings import Settings

KEY = "sk-test-parley-live"
RATE = 24_000
START = {"model": "gpt-live-1", "instructions": "You are terse."}


@pytest.fixture
def graph(tmp_path: Path) -> str:
    return fake_graph_file(tmp_path, "audio_ms: 2000, realtime_factor: 4.0")


@pytest.fixture
async def server(graph: str, redis_url: str) -> AsyncIterator[ServedApp]:
    settings = Settings(pipeline=graph, api_key=KEY, max_sessions=2)
    async with served_app(settings, redis_url) as served:
        yield served


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def utterance(text: str, rate: int = RATE) -> np.ndarray:
    speech = trim_silence(speak(text, rate=rate))
    return np.concatenate([silence(300, rate), speech, silence(900, rate)])


def silent(payload: bytes) -> bool:
    """Silence in any of the formats: one byte value throughout (0 in PCM16, 0xFF in
    mu-law, 0xD5 in A-law); an answer's audio never is."""
    return len(set(payload)) <= 1


def answer_samples(event: Any) -> int:
    """Samples of answer audio in an event (0 for the silence streamed between answers)."""
    if event.type != "session.output_audio.delta":
        return 0
    payload = base64.b64decode(event.delta)
    return 0 if silent(payload) else len(payload) // 2


def is_silence(event: Any) -> bool:
    return event.type == "session.output_audio.delta" and not answer_samples(event)


async def recv_until(conn: Any, kind: str, timeout_s: float = 30) -> list[Any]:
    """Events up to the first of `kind`, leaving out the silence between answers."""
    events: list[Any] = []
    async with asyncio.timeout(timeout_s):
        while not events or events[-1].type != kind:
            event = await conn.recv()
            if not is_silence(event):
                events.append(event)
    return events


async def next_message(ws: Any) -> dict[str, Any]:
    """A raw client's next message other than silence between answers."""
    while True:
        message: dict[str, Any] = json.loads(await ws.recv())
        if message["type"] != "session.output_audio.delta":
            return message
        if not silent(base64.b64decode(message["delta"])):
            return message


@pytest.mark.slow
async def test_the_sdk_live_client_holds_a_spoken_turn_and_closes(server: ServedApp) -> None:
    async with (
        AsyncOpenAI(api_key=KEY, base_url=f"{server.http_url}/v1") as client,
        client.live.connect() as conn,
    ):
        config: SessionConfigParam = {"model": "gpt-live-1", "instructions": "You are terse."}
        await conn.session.start(session=config, event_id="start-1")
        started = await conn.recv()
        assert started.type == "session.started"
        assert started.client_event_id == "start-1"
        assert started.session.model == "gpt-live-1" and started.session.id.startswith("sess_")
        served = started.session.audio
        assert served is not None and served.format is not None
        assert (served.format.type, served.format.rate) == ("audio/pcm", RATE)
        await conn.session.instructions.append(
            content="Use metric units.", delegation_id=None, event_id="i-1"
        )
        (appended,) = await recv_until(conn, "session.instructions.appended")
        assert appended.client_event_id == "i-1" and appended.start_ms >= 0

        pcm = utterance("What is the weather like today?")
        step = RATE // 10
        for begin in range(0, len(pcm), step):
            chunk = pcm[begin : begin + step].astype("<i2").tobytes()
            await conn.session.input_audio.append(audio=b64(chunk))
        heard: list[Any] = []
        async with asyncio.timeout(30):
            audio = 0
            while audio < 2 * RATE:  # the fake engine's whole 2 s answer
                event = await conn.recv()
                heard.append(event)
                audio += answer_samples(event)
        kinds = {e.type for e in heard}
        assert "session.output_transcript.delta" in kinds, kinds
        asked = [e for e in heard if e.type == "session.input_transcript.delta"]
        assert asked, kinds  # the user's speech, where it was heard on the timeline
        assert asked[0].end_ms > asked[0].start_ms >= 200
        said = "".join(e.delta for e in heard if e.type == "session.output_transcript.delta")
        assert said.startswith("Hello there")
        for e in heard:
            if e.type.endswith("transcript.delta"):
                assert 0 <= e.start_ms <= e.end_ms
        assert not any(e.type == "error" for e in heard), heard

        await conn.session.close(event_id="bye")
        closed = (await recv_until(conn, "session.closed"))[-1]
        assert closed.reason == "close_requested"
        assert closed.session.id == started.session.id
        assert closed.usage.seconds >= 0


async def raw_start(server: ServedApp, start: dict[str, Any]) -> tuple[list[Any], int | None]:
    """The messages a raw client gets for a first message `start`, and the close code."""
    url = f"{server.ws_url}/v1/live/sessions"
    got: list[Any] = []
    async with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        await ws.send(json.dumps(start))
        try:
            async with asyncio.timeout(10):
                while True:
                    got.append(await next_message(ws))
        except ConnectionClosed:
            pass
        return got, ws.close_code


@pytest.mark.parametrize(
    ("start", "code", "param"),
    [
        ({"type": "session.start", "session": {**START, "voice": "marin"}}, "unknown_parameter",
         "session.voice"),
        ({"type": "session.start", "session": {"instructions": "hi"}},
         "missing_required_parameter", "session.model"),
        ({"type": "session.start", "session": {**START, "audio": {"format": {
            "type": "audio/pcm", "rate": 44_100}}}}, "invalid_value", "session.audio.format"),
        ({"type": "session.start", "session": {**START, "delegation": {"type": "decisions"}}},
         "unsupported_value", "session.delegation.type"),
        ({"type": "session.start", "session": {**START, "delegation": {
            "type": "responses", "responses": {"tools": [{"type": "web_search"}]}}}},
         "unsupported_value", "session.delegation.responses.tools.0.type"),
        ({"type": "session.start", "session": {**START, "delegation": {
            "type": "responses", "responses": {"tools": [{"type": "function", "name": "a b"}]}}}},
         "invalid_value", "session.delegation.responses.tools"),
        ({"type": "session.input_audio.append", "audio": ""}, "session_not_started", None),
    ],
)  # fmt: skip
async def test_a_bad_start_is_refused_with_the_field_named_and_no_session(
    server: ServedApp, start: dict[str, Any], code: str, param: str | None
) -> None:
    start = {**start, "event_id": "evt-first"}
    got, close_code = await raw_start(server, start)
    (error,) = got
    assert error["type"] == "error" and error["error"]["code"] == code, error
    assert error["error"].get("param") == param
    assert error["error"]["client_event_id"] == "evt-first"
    assert close_code == 1008
    assert len(server.app.state.services.running.manager) == 0


async def test_mute_unknown_events_and_g711(server: ServedApp) -> None:
    """One format both ways (mu-law at 8 kHz here); mute and unmute are acknowledged; an
    event GPT-Live has but Parley does not serve is an error naming it, and the session
    goes on."""
    url = f"{server.ws_url}/v1/live/sessions"
    start = {"type": "session.start", "session": {
        **START, "audio": {"format": {"type": "audio/pcmu", "rate": 8000}}}}  # fmt: skip
    async with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        await ws.send(json.dumps(start))
        started = await next_message(ws)
        assert started["session"]["audio"]["format"] == {"type": "audio/pcmu", "rate": 8000}
        await ws.send(json.dumps({"type": "session.input_audio.mute", "event_id": "m"}))
        await ws.send(json.dumps({"type": "response.create", "event_id": "c"}))
        await ws.send(json.dumps({"type": "session.input_audio.append", "audio": "!!"}))
        await ws.send(json.dumps({"type": "session.input_audio.append", "audio": ""}))
        await ws.send(json.dumps({"type": "session.input_audio.unmute", "event_id": "u"}))
        got = [await next_message(ws) for _ in range(5)]
        assert [m["type"] for m in got] == [
            "session.input_audio.muted",
            "error",
            "error",
            "error",
            "session.input_audio.unmuted",
        ]
        assert got[0]["client_event_id"] == "m" and got[4]["client_event_id"] == "u"
        assert got[1]["error"]["code"] == "invalid_request"  # needs responses delegation
        assert got[1]["error"]["client_event_id"] == "c"
        assert got[2]["error"]["param"] == "audio"
        assert got[3]["error"]["param"] == "audio" and "empty" in got[3]["error"]["message"]
        await ws.send(json.dumps({"type": "session.close"}))
        closed = await next_message(ws)
        assert closed["type"] == "session.closed" and closed["reason"] == "close_requested"


async def start_and_ask(conn: Any, config: SessionConfigParam, question: str) -> None:
    """Start the session, then say `question` into it (in appends of 100 ms, at once)."""
    await conn.session.start(session=config)
    assert (await conn.recv()).type == "session.started"
    pcm = utterance(question)
    step = RATE // 10
    for begin in range(0, len(pcm), step):
        await conn.session.input_audio.append(audio=b64(pcm[begin : begin + step].tobytes()))


async def said_until(conn: Any, times: int, timeout_s: float = 30) -> list[Any]:
    """Events until the assistant has said the fake engine's answer `times` times whole."""
    heard: list[Any] = []
    async with asyncio.timeout(timeout_s):
        audio = 0
        while audio < times * 2 * RATE:
            event = await conn.recv()
            heard.append(event)
            audio += answer_samples(event)
    return heard


@pytest.mark.slow
async def test_commentary_is_spoken_now_or_after_the_answer_in_progress(
    server: ServedApp,
) -> None:
    """`session.commentary.append` is context to be said: with nobody talking the assistant
    says it at once; appended while it talks, it is said in an answer of its own after."""
    async with (
        AsyncOpenAI(api_key=KEY, base_url=f"{server.http_url}/v1") as client,
        client.live.connect() as conn,
    ):
        await conn.session.start(session={"model": "gpt-live-1"})
        assert (await conn.recv()).type == "session.started"
        await conn.session.commentary.append(
            content="Your table is ready.", delegation_id=None, event_id="c-1"
        )
        (appended,) = await recv_until(conn, "session.commentary.appended")
        assert appended.client_event_id == "c-1" and appended.start_ms >= 0
        first = await recv_until(conn, "session.output_transcript.delta")  # it speaks
        await conn.session.commentary.append(
            content="The kitchen closes at ten.", delegation_id=None, event_id="c-2"
        )
        heard = first + await said_until(conn, 2)
        assert [e.client_event_id for e in heard if e.type.endswith(".appended")] == ["c-2"]
        said = "".join(e.delta for e in heard if e.type == "session.output_transcript.delta")
        assert said.count("Hello there") == 2, said  # two answers, one after the other
        assert not any(e.type == "error" for e in heard), heard
        await conn.session.close()
        assert (await recv_until(conn, "session.closed"))[-1].reason == "close_requested"


@pytest.mark.parametrize(
    ("event", "code", "param"),
    [
        ({"content": "Ready."}, "missing_required_parameter", "delegation_id"),
        ({"content": "Ready.", "delegation_id": "deleg_1"}, "invalid_value", "delegation_id"),
        ({"content": " ", "delegation_id": None}, "invalid_value", "content"),
        ({"content": "word " * 600, "delegation_id": None}, "invalid_value", "content"),
    ],
)
async def test_a_bad_commentary_is_refused_and_nothing_is_said(
    server: ServedApp, event: dict[str, Any], code: str, param: str
) -> None:
    url = f"{server.ws_url}/v1/live/sessions"
    async with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        await ws.send(json.dumps({"type": "session.start", "session": START}))
        assert (await next_message(ws))["type"] == "session.started"
        bad = {"type": "session.commentary.append", "event_id": "c", **event}
        await ws.send(json.dumps(bad))
        error = await next_message(ws)
        assert error["type"] == "error", error
        assert (error["error"]["code"], error["error"].get("param")) == (code, param)
        assert error["error"]["client_event_id"] == "c"
        await ws.send(json.dumps({"type": "session.close"}))
        closed = await next_message(ws)  # no answer was started by it
        assert closed["type"] == "session.closed", closed


async def test_output_audio_streams_silence_between_answers_at_real_time_pace(
    server: ServedApp,
) -> None:
    """GPT-Live's output never pauses: with nothing said, silence arrives at about real
    time (not faster: a client that plays what it gets must not fall behind)."""
    url = f"{server.ws_url}/v1/live/sessions"
    async with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        await ws.send(json.dumps({"type": "session.start", "session": START}))
        assert json.loads(await ws.recv())["type"] == "session.started"
        samples, began = 0, asyncio.get_running_loop().time()
        while (elapsed := asyncio.get_running_loop().time() - began) < 1.0:
            message = json.loads(await ws.recv())
            assert message["type"] == "session.output_audio.delta", message
            pcm = np.frombuffer(base64.b64decode(message["delta"]), dtype="<i2")
            assert not pcm.any()
            samples += len(pcm)
        assert 0.7 * elapsed <= samples / RATE <= elapsed + 0.2, (samples, elapsed)
        await ws.send(json.dumps({"type": "session.close"}))
        while (message := json.loads(await ws.recv()))["type"] != "session.closed":
            assert message["type"] == "session.output_audio.delta"


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather now in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.mark.slow
async def test_responses_delegation_calls_a_function_and_speaks_with_its_output(
    server: ServedApp,
) -> None:
    """Parley's model is the Responses backend: its function call reaches the SDK as a
    delegation with nested Responses events; the output and one `response.create` give a
    spoken answer, whose own lifecycle is nested under the same delegation."""
    async with (
        AsyncOpenAI(api_key=KEY, base_url=f"{server.http_url}/v1") as client,
        client.live.connect() as conn,
    ):
        config: SessionConfigParam = {
            **START,  # type: ignore[typeddict-item]
            "delegation": {
                "type": "responses",
                "responses": {"model": "parley", "tools": [WEATHER]},
            },
        }
        await start_and_ask(conn, config, "What is the weather like in Paris?")
        events = await recv_until(conn, "response.event")
        (created,) = [e for e in events if e.type == "session.delegation.created"]
        delegation = created.delegation
        assert delegation.target == "responses" and delegation.response_id
        assert created.offset_ms > 0
        nested: list[dict[str, Any]] = []
        async with asyncio.timeout(30):
            while not nested or nested[-1]["type"] != "response.completed":
                event = await conn.recv()
                if event.type == "response.event":
                    assert event.delegation_id == delegation.id
                    nested.append(event.event)
        calls = [e["item"] for e in nested if e["type"] == "response.output_item.done"]
        assert len(calls) == 1 and calls[0]["type"] == "function_call"
        call = calls[0]
        assert call["name"] == "get_weather" and call["status"] == "completed"
        assert json.loads(call["arguments"]) == {"city": "fake"}

        await conn.response.item.create(
            item={"type": "function_call_output", "call_id": "call_nope", "output": "{}"},
            event_id="bad",
        )
        refused = (await recv_until(conn, "error"))[-1]
        assert refused.error.param == "item.call_id" and refused.client_event_id == "bad"

        await conn.response.item.create(
            item={"type": "function_call_output", "call_id": call["call_id"], "output": "18 C"}
        )
        await conn.response.create()
        heard = await said_until(conn, 1)
        again = [e.event["type"] for e in heard if e.type == "response.event"]
        assert again[:1] == ["response.created"], again
        assert not any(e.type == "error" for e in heard), heard
        await conn.session.close()
        await recv_until(conn, "session.closed")


@pytest.mark.slow
async def test_client_delegation_hands_work_to_the_app_which_answers_by_its_id(
    server: ServedApp,
) -> None:
    """`delegation: {type: client}`: Parley's model delegates the question (the fake model
    uses every tool it is given), the SDK gets `session.delegation.created`, an
    acknowledgement is said, and the app's commentary under the delegation's id is said
    after it; an unknown id is refused, thinking under the id is taken silently."""
    async with (
        AsyncOpenAI(api_key=KEY, base_url=f"{server.http_url}/v1") as client,
        client.live.connect() as conn,
    ):
        config: SessionConfigParam = {**START, "delegation": {"type": "client"}}  # type: ignore[typeddict-item]
        await start_and_ask(conn, config, "What is the weather like in Paris?")
        events = await recv_until(conn, "session.delegation.created")
        created = events[-1]
        assert created.delegation.target == "client" and created.delegation.id
        assert created.delegation.response_id is None and created.offset_ms > 0
        delegation_id = created.delegation.id
        acknowledged = await said_until(conn, 1)  # said without being asked
        assert any(e.type == "session.output_transcript.delta" for e in acknowledged)

        await conn.session.thinking.append(
            content="Paris: 18 C, dry.", delegation_id="deleg_x", event_id="t1"
        )
        refused = (await recv_until(conn, "error"))[-1]
        assert refused.error.param == "delegation_id" and refused.client_event_id == "t1"
        await conn.session.thinking.append(content="Looking it up.", delegation_id=delegation_id)
        await recv_until(conn, "session.thinking.appended")
        await conn.session.commentary.append(
            content="It is 18 degrees and dry in Paris.", delegation_id=delegation_id
        )
        await recv_until(conn, "session.commentary.appended")
        heard = await said_until(conn, 1)  # the app's result, said
        assert not any(e.type == "error" for e in heard), heard
        words = "".join(e.delta for e in heard if e.type == "session.output_transcript.delta")
        assert "18 degrees and dry" in words  # relayed as the delegation's result
        assert not any(e.type == "session.delegation.created" for e in heard)
        await conn.session.close()
        await recv_until(conn, "session.closed")
