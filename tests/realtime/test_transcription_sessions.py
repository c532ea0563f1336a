"""OpenAI Realtime transcription sessions (`intent=transcription`, `"type": "transcription"`)
end to end: the official SDK and a raw client against a real uvicorn serving the embedded
cascade (its Whisper transcribes), with espeak-ng's speech sent faster than real time; a
real aiortc caller over WebRTC (a client secret then the offer, and the SDK's multipart
form), its microphone speaking in real time; and a pipeline with no recogniser (the fake
engine), which refuses the session."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from openai.types.realtime import LogProbProperties, RealtimeServerEvent
from pydantic import TypeAdapter
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from loadtest.speech import silence, speak, trim_silence
from loadtest.webrtc_client import Caller
from tests.conftest import fail_on_tasks_left
from tests.frameworks.conftest import sessions_ended
from web.settings import Settings

from .apps import ServedApp, fake_graph_file, served_app, served_cascade
from .clients import RecordingClient

KEY = "sk-test-parley-transcription"
AUTH = {"Authorization": f"Bearer {KEY}"}
RATE = 24_000
DB = 2
"""The cascade server's database on the test redis-server (the tests' own is 0)."""
LOOP = pytest.mark.asyncio(loop_scope="module")
SETUP: dict[str, Any] = {
    "type": "transcription",
    "audio": {
        "input": {
            "format": {"type": "audio/pcm", "rate": RATE},
            "transcription": {"model": "gpt-4o-mini-transcribe", "language": "en"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
        }
    },
}

TYPED: dict[str, Any] = {
    "type": "message",
    "role": "user",
    "content": [{"type": "input_text", "text": "Hello"}],
}
SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
pytestmark = [LOOP, pytest.mark.slow]


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def _no_leaked_tasks() -> AsyncIterator[None]:
    before = asyncio.all_tasks()
    yield
    await fail_on_tasks_left(before)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cascade(redis_socket: str) -> AsyncIterator[ServedApp]:
    """The embedded cascade, served once for the module (its start is most of the time)."""
    async with served_cascade(redis_socket, DB, KEY, "the transcription tests' server") as app:
        yield app


@pytest_asyncio.fixture(loop_scope="module")
async def server(cascade: ServedApp) -> AsyncIterator[ServedApp]:
    await sessions_ended(cascade)
    yield cascade
    await sessions_ended(cascade)


@lru_cache(maxsize=8)
def said(text: str, rate: int = RATE) -> np.ndarray:
    """`text` spoken by espeak-ng (24 kHz unless told), with a pause after it that ends
    the turn."""
    speech = trim_silence(speak(text, rate=rate))
    return np.concatenate([silence(300, rate), speech, silence(1000, rate)])


def b64(pcm: np.ndarray) -> str:
    return base64.b64encode(pcm.astype("<i2").tobytes()).decode("ascii")


async def send_audio(conn: Any, pcm: np.ndarray, chunk_ms: int = 100) -> None:
    """`pcm` in `chunk_ms` appends on the SDK's connection, at four times a microphone's
    pace."""
    step = RATE * chunk_ms // 1000
    for start in range(0, len(pcm), step):
        await conn.input_audio_buffer.append(audio=b64(pcm[start : start + step]))
        await asyncio.sleep(chunk_ms / 4000)


def sdk(server: ServedApp) -> AsyncOpenAI:
    return AsyncOpenAI(api_key=KEY, base_url=f"{server.http_url}/v1")


async def recv_until(conn: Any, kind: str, count: int = 1, within_s: float = 30) -> list[Any]:
    """Events up to the `count`th of `kind`."""
    events: list[Any] = []
    async with asyncio.timeout(within_s):
        while sum(e.type == kind for e in events) < count:
            events.append(await conn.recv())
    return events


@contextlib.asynccontextmanager
async def raw(server: ServedApp, query: str = "intent=transcription") -> AsyncIterator[Any]:
    url = f"{server.ws_url}/v1/realtime?{query}"
    headers = {"Authorization": f"Bearer {KEY}"}
    async with connect(url, additional_headers=headers, proxy=None) as ws:
        yield RecordingClient(ws, wait_s=30)


def words(text: str) -> set[str]:
    return {w.strip(".,?!").lower() for w in text.split()}


async def test_the_sdk_gets_deltas_and_a_transcript_for_each_of_two_utterances(
    server: ServedApp,
) -> None:
    async with (
        sdk(server) as client,
        client.realtime.connect(extra_query={"intent": "transcription"}) as conn,
    ):
        created = await conn.recv()
        assert created.type == "session.created"
        assert created.session.type == "transcription"
        await conn.session.update(session=SETUP)  # type: ignore[arg-type]
        updated = await recv_until(conn, "session.updated")
        session = updated[-1].session
        assert session.type == "transcription"
        assert session.audio.input.transcription.language == "en"

        async def speak_both() -> None:
            await send_audio(conn, said("I would like a cup of coffee."))
            await send_audio(conn, said("Please open the window."))

        speaking = asyncio.create_task(speak_both())
        try:
            events = await recv_until(
                conn, "conversation.item.input_audio_transcription.completed", count=2
            )
        finally:
            await speaking
    got = [e.type for e in events]
    assert not any(t.startswith("response.") or t == "error" for t in got), got
    completed = [e for e in events if e.type.endswith("transcription.completed")]
    committed = [e for e in events if e.type == "input_audio_buffer.committed"]
    assert [c.item_id for c in committed] == [c.item_id for c in completed]
    assert len({c.item_id for c in completed}) == 2
    first, second = (words(c.transcript) for c in completed)
    assert {"cup", "coffee"} <= first, completed[0].transcript
    assert {"open", "window"} <= second, completed[1].transcript
    for done in completed:
        deltas = [
            e.delta
            for e in events
            if e.type.endswith("transcription.delta") and e.item_id == done.item_id
        ]
        assert deltas and words("".join(deltas)) & words(done.transcript), (deltas, done)
        assert done.usage.type == "duration" and done.usage.seconds > 1.0
        item = got.index("conversation.item.added", events.index(committed[completed.index(done)]))
        assert events[item].item.id == done.item_id


async def test_manual_commits_with_turn_detection_off(server: ServedApp) -> None:
    setup = {**SETUP, "audio": {"input": {**SETUP["audio"]["input"], "turn_detection": None}}}
    async with sdk(server) as client, client.realtime.connect(model="parley") as conn:
        await recv_until(conn, "session.created")
        await conn.session.update(session=setup)  # type: ignore[arg-type]
        updated = (await recv_until(conn, "session.updated"))[-1]
        assert updated.session.type == "transcription"
        assert updated.session.audio.input.turn_detection is None
        await send_audio(conn, said("Good morning everyone."))
        await asyncio.sleep(1.0)
        await conn.input_audio_buffer.commit()
        events = await recv_until(conn, "conversation.item.input_audio_transcription.completed")
    got = [e.type for e in events]
    assert "input_audio_buffer.speech_started" not in got  # no turn detection
    assert got.index("input_audio_buffer.committed") < got.index("conversation.item.added")
    assert {"good", "morning"} <= words(events[-1].transcript), events[-1].transcript


async def test_response_create_and_item_create_are_errors_and_the_session_goes_on(
    server: ServedApp,
) -> None:
    async with (
        sdk(server) as client,
        client.realtime.connect(extra_query={"intent": "transcription"}) as conn,
    ):
        await recv_until(conn, "session.created")
        await conn.response.create(event_id="evt_answer")
        error = (await recv_until(conn, "error"))[-1]
        assert error.error.message.startswith(
            "response.create is not supported in transcription sessions"
        )
        assert error.error.type == "invalid_request_error"
        assert error.error.event_id == "evt_answer"
        await conn.conversation.item.create(item=TYPED, event_id="evt_item")  # type: ignore[arg-type]
        error = (await recv_until(conn, "error"))[-1]
        assert error.error.message.startswith(
            "conversation.item.create is not supported in transcription sessions"
        )
        assert error.error.event_id == "evt_item"
        await conn.session.update(session={"type": "realtime"})
        refused = (await recv_until(conn, "error"))[-1]
        assert refused.error.param == "type" or "realtime" in refused.error.message
        await send_audio(conn, said("Please open the window."))
        events = await recv_until(conn, "conversation.item.input_audio_transcription.completed")
    assert {"open", "window"} <= words(events[-1].transcript), events[-1].transcript
    got = [e.type for e in events]
    assert not any(t.startswith(("response.", "output_audio")) for t in got), got


async def test_every_event_of_a_transcription_session_is_one_the_sdk_declares(
    server: ServedApp,
) -> None:
    """Two spoken turns, a manual commit, a refused response: every event validates
    against the SDK's server event union."""
    async with raw(server) as client:
        await client.wait_type("session.created")
        await client.send({"type": "session.update", "session": SETUP})
        await client.wait_type("session.updated")
        await client.append(said("I would like a cup of coffee."))
        await client.wait_type("conversation.item.input_audio_transcription.completed")
        await client.send({"type": "response.create"})
        await client.wait_type("error")
        off = {**SETUP, "audio": {"input": {"turn_detection": None}}}
        await client.send({"type": "session.update", "session": off})
        await client.wait_type("session.updated")
        await client.append(said("Please open the window."))
        await client.send({"type": "input_audio_buffer.commit"})
        await client.wait_type("conversation.item.input_audio_transcription.completed")
        await client.send({"type": "input_audio_buffer.clear"})
        await client.wait_type("input_audio_buffer.cleared")
        sent = list(client.events)
    for message in sent:
        assert SERVER_EVENT.validate_python(message).type == message["type"], message
    seen = {m["type"] for m in sent}
    assert {
        "session.created",
        "session.updated",
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.completed",
        "error",
    } <= seen, seen
    assert not any(t.startswith(("response.", "output_audio")) for t in seen), seen


async def test_the_language_and_the_prompt_reach_the_recogniser(server: ServedApp) -> None:
    """`audio.input.transcription`'s language and prompt are used, not only echoed:
    French speech named French comes back in French (Whisper translated it to English),
    and a prompt spells a name it names (unprompted, Whisper hears another)."""
    french = np.concatenate(
        [
            silence(300, RATE),
            trim_silence(speak("Bonjour, je voudrais une tasse de café.", RATE, "fr")),
            silence(1000, RATE),
        ]
    )
    names = said("My name is Siobhan Quinlivan and I work at Zyxtrel.")
    input_setup = SETUP["audio"]["input"]
    async with (
        sdk(server) as client,
        client.realtime.connect(extra_query={"intent": "transcription"}) as conn,
    ):
        await recv_until(conn, "session.created")
        heard = []
        rounds: list[tuple[dict[str, str], np.ndarray]] = [
            ({"language": "fr"}, french),
            ({"language": "en"}, names),
            ({"language": "en", "prompt": "Siobhan Quinlivan, Zyxtrel"}, names),
        ]
        for transcription, pcm in rounds:
            setup = {**SETUP, "audio": {"input": {**input_setup, "transcription": transcription}}}
            await conn.session.update(session=setup)  # type: ignore[arg-type]
            updated = (await recv_until(conn, "session.updated"))[-1]
            echoed = updated.session.audio.input.transcription
            assert echoed.language == transcription["language"]
            assert echoed.prompt == transcription.get("prompt")
            await send_audio(conn, pcm)
            done = await recv_until(conn, "conversation.item.input_audio_transcription.completed")
            heard.append(done[-1].transcript)
    assert {"bonjour", "café"} <= words(heard[0]), heard[0]
    assert "Quinlivan" not in heard[1] and "Quinlivan" in heard[2], heard[1:]


async def test_an_unknown_language_is_refused_by_name_and_a_conversation_echoes_its_own(
    server: ServedApp,
) -> None:
    async with sdk(server) as client, client.realtime.connect(model="parley") as conn:
        await recv_until(conn, "session.created")
        transcription = {"model": "whisper-1", "language": "de", "prompt": "Parley"}
        session: dict[str, Any] = {
            "type": "realtime",
            "audio": {"input": {"transcription": transcription}},
        }
        await conn.session.update(session=session)  # type: ignore[arg-type]
        echoed = (await recv_until(conn, "session.updated"))[-1].session.audio.input
        assert echoed.transcription.model_dump(exclude_none=True) == transcription
        session["audio"] = {"input": {"transcription": {"language": "klingon"}}}
        await conn.session.update(session=session)  # type: ignore[arg-type]
        refused = (await recv_until(conn, "error"))[-1]
        assert refused.error.param == "session.audio.input.transcription.language"
        assert "klingon" in refused.error.message
        kept = (await recv_until(conn, "session.updated"))[-1].session.audio.input
        assert kept.transcription.language == "de"


INCLUDE = ["item.input_audio_transcription.logprobs"]
COMPLETED = "conversation.item.input_audio_transcription.completed"
DELTA = "conversation.item.input_audio_transcription.delta"


def of_item(events: list[dict[str, Any]], kind: str, item_id: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind and e["item_id"] == item_id]


def assert_tokens(message: dict[str, Any], text: str) -> None:
    """`message`'s logprobs are OpenAI's, and its tokens are `text`: each a log-probability
    (never above 0) and the token's UTF-8 bytes."""
    event = SERVER_EVENT.validate_python(message)
    assert event.logprobs and all(isinstance(t, LogProbProperties) for t in event.logprobs)
    assert "".join(t.token for t in event.logprobs) == text, (event.logprobs, text)
    assert all(t.logprob <= 0 and bytes(t.bytes) == t.token.encode() for t in event.logprobs)


def assert_transcript_tokens(events: list[dict[str, Any]], item_id: str) -> dict[str, Any]:
    """The item's `.completed` and each of its deltas carry their tokens; the completed."""
    (done,) = of_item(events, COMPLETED, item_id)
    assert_tokens(done, done["transcript"])
    deltas = of_item(events, DELTA, item_id)
    assert deltas
    for delta in deltas:
        assert_tokens(delta, delta["delta"])
    return done


def assert_no_tokens(events: list[dict[str, Any]], item_id: str) -> None:
    """Not asked for: no `logprobs` key (the SDK reads None), in the item's events."""
    for message in of_item(events, COMPLETED, item_id) + of_item(events, DELTA, item_id):
        assert "logprobs" not in message and SERVER_EVENT.validate_python(message).logprobs is None


async def test_include_logprobs_gives_each_tokens_log_probability_in_a_transcription(
    server: ServedApp,
) -> None:
    """`include: ["item.input_audio_transcription.logprobs"]` in a transcription session:
    Whisper's tokens, each with its log-probability, on the deltas and the completed event;
    taken out again, none."""
    async with raw(server) as client:
        await client.wait_type("session.created")
        await client.send({"type": "session.update", "session": {**SETUP, "include": INCLUDE}})
        assert (await client.wait_type("session.updated"))["session"]["include"] == INCLUDE
        await client.append(said("I would like a cup of coffee."))
        asked = await client.wait_type(COMPLETED)
        await client.send({"type": "session.update", "session": {**SETUP, "include": []}})
        await client.wait_type("session.updated")
        await client.append(said("Please open the window."))
        plain = await client.wait_type(COMPLETED)
        events = list(client.events)
    done = assert_transcript_tokens(events, asked["item_id"])
    assert {"cup", "coffee"} <= words(done["transcript"]), done
    assert {"open", "window"} <= words(plain["transcript"]), plain
    assert_no_tokens(events, plain["item_id"])


async def test_include_logprobs_gives_them_in_a_conversation_too(server: ServedApp) -> None:
    """A conversation session that includes them: a turn its server VAD ends (recognised
    at the pause) and a turn committed by hand and answered (the answer recognises it) both
    carry their tokens; a turn after `include` is emptied, none."""
    session: dict[str, Any] = {
        "type": "realtime",
        "include": INCLUDE,
        "output_modalities": ["text"],
        "max_output_tokens": 8,
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE}}},
    }
    manual = {"turn_detection": None, "format": {"type": "audio/pcm", "rate": RATE}}
    async with raw(server, "model=parley") as client:
        await client.wait_type("session.created")
        await client.send({"type": "session.update", "session": session})
        await client.wait_type("session.updated")
        await client.append(said("What is the capital of France?"))
        paused = await client.wait_type(COMPLETED)
        await client.wait_type("response.done")
        await client.send(
            {"type": "session.update", "session": {**session, "audio": {"input": manual}}}
        )
        await client.wait_type("session.updated")
        await client.ask(said("Please open the window."))
        answered = await client.wait_type(COMPLETED)
        await client.wait_type("response.done")
        await client.send({"type": "session.update", "session": {"include": []}})
        await client.wait_type("session.updated")
        await client.ask(said("Good morning everyone."))
        plain = await client.wait_type(COMPLETED)
        await client.wait_type("response.done")
        events = list(client.events)
    assert {"capital", "france"} <= words(
        assert_transcript_tokens(events, paused["item_id"])["transcript"]
    )
    assert {"open", "window"} <= words(
        assert_transcript_tokens(events, answered["item_id"])["transcript"]
    )
    assert {"good", "morning"} <= words(plain["transcript"]), plain
    assert_no_tokens(events, plain["item_id"])


@pytest.fixture
def no_recogniser(tmp_path: Path) -> str:
    return fake_graph_file(tmp_path, "audio_ms: 1000")


@pytest.mark.asyncio(loop_scope="function")
async def test_a_pipeline_without_a_recogniser_refuses(no_recogniser: str, redis_url: str) -> None:
    settings = Settings(pipeline=no_recogniser, api_key=KEY, max_sessions=2)
    async with served_app(settings, redis_url) as app:
        async with (
            sdk(app) as client,
            client.realtime.connect(extra_query={"intent": "transcription"}) as conn,
        ):
            error = await conn.recv()
            assert error.type == "error"
            assert "recogniser" in error.error.message and "'fake'" in error.error.message
            with pytest.raises(ConnectionClosed):
                await conn.recv()
        async with sdk(app) as client, client.realtime.connect(model="parley") as conn:
            await recv_until(conn, "session.created")
            await conn.session.update(session={"type": "transcription"})
            refused = (await recv_until(conn, "error"))[-1]
            assert "'fake'" in refused.error.message
            updated = (await recv_until(conn, "session.updated"))[-1]
            assert updated.session.type == "realtime"


@contextlib.asynccontextmanager
async def webrtc_call(server: ServedApp) -> AsyncIterator[tuple[httpx.AsyncClient, Caller]]:
    """A real aiortc caller (its microphone sends 16 kHz speech in real time) and a signaling
    client on the server; the call is hung up on the way out (a closed peer alone would
    leave its session waiting for a re-attach)."""
    async with httpx.AsyncClient(base_url=server.http_url, headers=AUTH) as http:
        caller = Caller(http)
        try:
            yield http, caller
        finally:
            try:
                if caller.call_id is not None:
                    await http.post(f"/v1/realtime/calls/{caller.call_id}/hangup")
            finally:
                await caller.close()


def transcribed(caller: Caller) -> list[dict[str, Any]]:
    return [e for e in caller.events if e["type"].endswith("input_audio_transcription.completed")]


async def webrtc_transcript(caller: Caller, text: str) -> dict[str, Any]:
    """`text` said into the call's microphone: its `...input_audio_transcription.completed`."""
    count = len(transcribed(caller))
    caller.mic.say(said(text, 16_000))
    completed = "conversation.item.input_audio_transcription.completed"
    await caller.wait_count(completed, count + 1, within_s=30)
    return transcribed(caller)[count]


async def test_webrtc_a_client_secret_then_the_offer_transcribes_and_refuses_answers(
    server: ServedApp,
) -> None:
    """OpenAI's browser flow: a client secret minted for a transcription session, the
    offer posted with it; the spoken words come back on the data channel, the track
    carries silence, and response.create and conversation.item.create are errors naming
    the event after which the session goes on transcribing."""
    async with webrtc_call(server) as (http, caller):
        minted = await http.post("/v1/realtime/client_secrets", json={"session": SETUP})
        assert minted.status_code == 200, minted.text
        assert minted.json()["session"]["object"] == "realtime.transcription_session"
        secret = {"Authorization": f"Bearer {minted.json()['value']}"}
        assert (await caller.connect(secret)).status_code == 201
        created = await caller.wait_for(lambda e: e["type"] == "session.created")
        assert created["session"]["type"] == "transcription"
        assert created["session"]["object"] == "realtime.transcription_session"
        assert created["session"]["audio"]["input"]["transcription"]["language"] == "en"
        first = await webrtc_transcript(caller, "I would like a cup of coffee.")
        assert {"cup", "coffee"} <= words(first["transcript"]), first
        caller.send({"type": "response.create", "event_id": "evt_answer"})
        caller.send({"type": "conversation.item.create", "event_id": "evt_item", "item": TYPED})
        await caller.wait_count("error", 2)
        second = await webrtc_transcript(caller, "Please open the window.")
        assert {"open", "window"} <= words(second["transcript"]), second
    errors = {e["error"]["event_id"]: e["error"] for e in caller.events if e["type"] == "error"}
    assert "response.create" in errors["evt_answer"]["message"], errors
    assert "conversation.item.create" in errors["evt_item"]["message"], errors
    types = caller.types()
    assert any(t.endswith("input_audio_transcription.delta") for t in types), types
    assert not any(t.startswith(("response.", "output_audio_buffer.")) for t in types), types
    assert not caller.loud_since(0.0)  # the track sent silence only
    for event in caller.events:
        assert SERVER_EVENT.validate_python(event).type == event["type"], event
    assert caller.heard, "the track sent nothing"


async def test_webrtc_the_sdk_form_with_a_transcription_session_transcribes(
    server: ServedApp,
) -> None:
    """The openai SDK's call: the offer and the session as a multipart form."""
    async with webrtc_call(server) as (http, caller):
        form = {"sdp": (None, await caller.offer()), "session": (None, json.dumps(SETUP))}
        response = await http.post("/v1/realtime/calls", files=form)
        assert response.status_code == 201, response.text
        caller.call_id = response.headers["location"].rsplit("/", 1)[1]
        await caller.answered(response.text)
        created = await caller.wait_for(lambda e: e["type"] == "session.created")
        assert created["session"]["object"] == "realtime.transcription_session"
        done = await webrtc_transcript(caller, "Good morning everyone.")
    assert {"good", "morning"} <= words(done["transcript"]), done
    assert not any(t.startswith("response.") for t in caller.types())
