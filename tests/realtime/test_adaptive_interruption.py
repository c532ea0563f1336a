"""`turn_detection.interruption` over OpenAI Realtime on a WebSocket, end to end: the
setting is taken, echoed and refused as other session fields are, and with `adaptive` a
backchannel over an answer leaves it whole while real speech still cuts it. A real server
on a loopback port, a fake engine whose recogniser hears "Yeah." in anything."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from loadtest.speech import silence, speak, trim_silence
from realtime.live.live_config import parley_config, parse_live_config
from sessions import SessionConfig
from tests.realtime.apps import ServedApp, fake_graph_file, served_app
from tests.realtime.clients import RecordingClient
from tests.realtime.test_openai_ws import KEY, RATE, raw, utterance
from web.settings import Settings

ANSWER_MS = 4_000
ADAPTIVE = {"type": "server_vad", "interruption": "adaptive"}


@pytest.fixture
async def server(tmp_path: Path, redis_url: str) -> AsyncIterator[ServedApp]:
    engine = f"audio_ms: {ANSWER_MS}, realtime_factor: 4.0, transcript: 'Yeah.'"
    settings = Settings(pipeline=fake_graph_file(tmp_path, engine), api_key=KEY)
    async with served_app(settings, redis_url) as served:
        yield served


async def update(client: RecordingClient, detection: dict[str, Any] | None) -> dict[str, Any]:
    session = {"type": "realtime", "audio": {"input": {"turn_detection": detection}}}
    await client.send({"type": "session.update", "event_id": "evt_td", "session": session})
    return await client.wait_for(lambda e: e["type"] in ("session.updated", "error"))


async def speak_live(client: RecordingClient, text: str) -> None:
    """`text` and a second of silence, sent in 20 ms pieces at a microphone's pace."""
    pcm = np.concatenate([trim_silence(speak(text, rate=RATE)), silence(1000, RATE)])
    step, start = RATE // 50, time.monotonic()
    for k, at in enumerate(range(0, len(pcm), step)):
        await asyncio.sleep(max(0.0, start + k * 0.02 - time.monotonic()))
        chunk = pcm[at : at + step].astype("<i2").tobytes()
        await client.send(
            {"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()}
        )


async def test_interruption_is_taken_echoed_and_refused_when_unknown(server: ServedApp) -> None:
    async with raw(server) as client:
        created = await client.wait_type("session.created")
        vad = created["session"]["audio"]["input"]["turn_detection"]
        assert "interruption" not in vad  # the default, OpenAI's meaning: nothing new shown
        updated = await update(client, ADAPTIVE)
        assert updated["type"] == "session.updated"
        vad = updated["session"]["audio"]["input"]["turn_detection"]
        assert vad["interruption"] == "adaptive" and vad["interrupt_response"] is True
        assert updated["session"]["parley"]["interruption_deadline_ms"] == 1000
        event: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
        assert event.validate_python(updated).type == "session.updated"  # the SDK takes it
        error = await update(client, {"type": "server_vad", "interruption": "sometimes"})
        assert error["type"] == "error"
        assert error["error"]["param"] == "session.audio.input.turn_detection.interruption"
        assert "'always' or 'adaptive'" in error["error"]["message"]
        assert error["error"]["event_id"] == "evt_td"
        kept = await client.wait_type("session.updated")  # the rest of the update applies
        assert kept["session"]["audio"]["input"]["turn_detection"]["interruption"] == "adaptive"
        semantic = await update(client, {"type": "semantic_vad", "interruption": "adaptive"})
        vad = semantic["session"]["audio"]["input"]["turn_detection"]
        assert (vad["type"], vad["interruption"]) == ("semantic_vad", "adaptive")
        always = await update(client, {"type": "server_vad", "interruption": "always"})
        assert "interruption" not in always["session"]["audio"]["input"]["turn_detection"]


async def test_a_backchannel_leaves_the_answer_whole(server: ServedApp) -> None:
    async with raw(server) as client:
        await client.wait_type("session.created")
        assert (await update(client, ADAPTIVE))["type"] == "session.updated"
        await client.append(utterance("What is the weather like today?"))
        delta = await client.wait_type("response.output_audio.delta")
        await asyncio.sleep(0.6)  # the answer plays on
        await speak_live(client, "Yeah.")
        done = await client.wait_type("response.done", within_s=20)
        assert done["response"]["status"] == "completed"
        names = [e["type"] for e in client.events]
        starts = [i for i, name in enumerate(names) if name == "input_audio_buffer.speech_started"]
        assert len(starts) == 2 and starts[1] < names.index("response.done")  # over the answer
        assert names.count("input_audio_buffer.speech_stopped") == 2  # it was heard...
        assert "conversation.item.truncated" not in names  # ...and cut nothing
        assert names.count("response.created") == 1  # nor started another answer
        assert client.audio_ms(delta["response_id"]) == pytest.approx(ANSWER_MS, abs=1)
    sdk_event: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
    for message in client.events:  # a strict client knows every event it got
        assert sdk_event.validate_python(message).type == message["type"]


async def test_real_speech_over_the_answer_still_cuts_it(server: ServedApp) -> None:
    async with raw(server) as client:
        await client.wait_type("session.created")
        assert (await update(client, ADAPTIVE))["type"] == "session.updated"
        await client.append(utterance("What is the weather like today?"))
        await client.wait_type("response.output_audio.delta")
        await asyncio.sleep(0.6)
        await speak_live(client, "Hold on, stop, wait a moment please.")  # long: a turn
        done = await client.wait_type("response.done", within_s=20)
        assert done["response"]["status"] == "cancelled"
        truncated = await client.wait_type("conversation.item.truncated")
        assert 400 <= truncated["audio_end_ms"] < ANSWER_MS
        await client.wait_type("response.created")  # the interruption is the next turn
        await client.send({"type": "response.cancel"})  # so the socket closes at once
        await client.wait_type("response.done")


def test_gpt_live_sessions_are_adaptive_by_default() -> None:
    """GPT-Live leaves the turns to the server: Parley decides, and a backchannel never cuts
    an answer."""
    live = parse_live_config({"model": "gpt-live-1"})
    config, _ = parley_config(live, SessionConfig())
    assert config.turn_detection is not None
    assert config.turn_detection.interruption == "adaptive"
    manual, _ = parley_config(live, SessionConfig.parse({"turn_detection": None}))
    assert manual.turn_detection is None
