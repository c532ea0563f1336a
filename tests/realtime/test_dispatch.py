"""Client events performed on a real Session (real Redis, fake engine, clocked sink)."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import numpy as np
from PIL import Image

from realtime.openai.client_events import AudioFormats, parse_client_event
from realtime.openai.dispatch import ClientEventDispatcher, Transport
from realtime.openai.server_events import to_wire
from sessions.events import ErrorEvent, Event, ResponseCreated, ResponseDone, SessionUpdated
from sessions.session import Session
from tests.fakes.fake_engine import FakeEngine
from tests.fakes.sink import ClockedSink

from .conftest import MakeSession


def msg(**fields: Any) -> str:
    return json.dumps(fields)


async def dispatcher(
    make_session: MakeSession, transport: Transport = "websocket", **kwargs: Any
) -> tuple[ClientEventDispatcher, Session, ClockedSink]:
    session, sink = await make_session()
    return ClientEventDispatcher(session, transport=transport, **kwargs), session, sink


def errors(sink: ClockedSink) -> list[ErrorEvent]:
    return [e for e in sink.events if isinstance(e, ErrorEvent)]


def jpeg_data_url(shade: int = 128) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (32, 24), (shade, 64, 200)).save(buf, format="JPEG")
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def is_done(event: Event) -> bool:
    return isinstance(event, ResponseDone)


async def test_session_update_changes_the_config_and_says_so(make_session: MakeSession) -> None:
    d, session, sink = await dispatcher(make_session)
    await d.handle_raw(
        msg(
            type="session.update",
            event_id="evt_c1",
            session={
                "type": "realtime",
                "instructions": "Speak like a pirate.",
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 800}},
                    "output": {"voice": "marin"},
                },
                "parley": {"video": {"num_frames": 8}},
            },
        )
    )
    assert not errors(sink)
    assert session.config.instructions == "Speak like a pirate."
    assert session.config.voice == "marin"
    assert session.config.turn_detection is not None
    assert session.config.turn_detection.silence_duration_ms == 800
    assert session.config.video.num_frames == 8
    updated = sink.of(SessionUpdated)[-1]
    wire = to_wire(updated, formats=d.formats)
    assert wire is not None and wire["session"]["instructions"] == "Speak like a pirate."
    assert wire["session"]["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 800


async def test_a_bad_value_is_an_error_naming_it_and_the_rest_applies(
    make_session: MakeSession,
) -> None:
    d, session, sink = await dispatcher(make_session)
    vad = {"type": "server_vad", "threshold": 5, "silence_duration_ms": 900}
    bad = {"instructions": "changed", "audio": {"input": {"turn_detection": vad}}}
    await d.handle_raw(msg(type="session.update", event_id="evt_bad", session=bad))
    (error,) = errors(sink)
    assert (error.client_event_id, error.code) == ("evt_bad", "invalid_config")
    assert error.param == "turn_detection.threshold" and "between 0 and 1" in error.message
    assert session.config.instructions == "changed"
    assert session.config.turn_detection is not None
    assert session.config.turn_detection.threshold == 0.5  # left as it was
    assert session.config.turn_detection.silence_duration_ms == 900
    wire = to_wire(sink.of(SessionUpdated)[-1], formats=d.formats)
    assert wire is not None and wire["session"]["instructions"] == "changed"
    assert sink.events.index(error) < sink.events.index(sink.of(SessionUpdated)[-1])


async def test_instructions_apply_despite_an_unsupported_field(
    make_session: MakeSession,
) -> None:
    d, session, sink = await dispatcher(make_session)
    update = {
        "instructions": "Be brief.",
        "audio": {
            "input": {"turn_detection": {"type": "magic_vad"}},
            "output": {"voice": "alloy", "format": {"type": "audio/pcmu"}},
        },
    }
    await d.handle_raw(msg(type="session.update", event_id="evt_u", session=update))
    params = {(e.client_event_id, e.param) for e in errors(sink)}
    assert params == {
        ("evt_u", "session.audio.input.turn_detection.type"),
        ("evt_u", "session.audio"),  # no G.711 codec on this connection
    }
    wire = to_wire(sink.of(SessionUpdated)[-1], formats=d.formats)
    assert wire is not None
    assert wire["session"]["instructions"] == "Be brief."
    assert wire["session"]["audio"]["output"]["voice"] == "alloy"
    assert wire["session"]["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24_000}
    assert wire["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"


async def test_semantic_vad_applies_with_its_eagerness(make_session: MakeSession) -> None:
    d, session, sink = await dispatcher(make_session)
    vad = {"type": "semantic_vad", "eagerness": "low", "create_response": True}
    update = {"instructions": "Agent.", "audio": {"input": {"turn_detection": vad}}}
    await d.handle_raw(msg(type="session.update", event_id="evt_s", session=update))
    assert not errors(sink)
    td = session.config.turn_detection
    assert td is not None and td.type == "semantic_vad" and td.silence_duration_ms == 1200
    wire = to_wire(sink.of(SessionUpdated)[-1], formats=d.formats)
    assert wire is not None
    assert wire["session"]["audio"]["input"]["turn_detection"] == {
        "type": "semantic_vad",
        "eagerness": "low",
        "create_response": True,
        "interrupt_response": True,
    }
    beta = {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}
    await d.handle_raw(msg(type="session.update", session=beta))
    td = session.config.turn_detection
    assert td is not None and (td.eagerness, td.silence_duration_ms) == ("high", 350)
    await d.handle_raw(
        msg(type="session.update", session={"turn_detection": {"type": "server_vad"}})
    )
    td = session.config.turn_detection
    assert td is not None and (td.type, td.silence_duration_ms) == ("server_vad", 500)
    assert not errors(sink)


async def test_text_item_and_response_create_get_an_answer(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    d, session, sink = await dispatcher(make_session, transport="webrtc")
    await d.handle_raw(
        msg(
            type="conversation.item.create",
            event_id="evt_item",
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "What is two plus two?"}],
            },
        )
    )
    await d.handle_raw(msg(type="response.create", event_id="evt_resp"))
    done = await sink.wait_for(is_done)
    assert isinstance(done, ResponseDone) and done.status == "completed"
    assert not errors(sink)
    (request,) = engine.requests
    assert request.text == "What is two plus two?"
    wire = to_wire(done)
    assert wire is not None and wire["response"]["output"][0]["role"] == "assistant"


async def test_response_metadata_is_echoed_in_created_and_done(
    make_session: MakeSession,
) -> None:
    d, session, sink = await dispatcher(make_session)
    await d.handle_raw(
        msg(
            type="conversation.item.create",
            item={"role": "user", "content": [{"type": "input_text", "text": "Hello."}]},
        )
    )
    metadata = {"client_event_id": "evt_lk_1"}
    await d.handle_raw(msg(type="response.create", response={"metadata": metadata}))
    done = await sink.wait_for(is_done)
    (created,) = sink.of(ResponseCreated)
    for event in (created, done):
        wire = to_wire(event)
        assert wire is not None and wire["response"]["metadata"] == metadata
    await d.handle_raw(
        msg(type="response.create", event_id="evt_m", response={"metadata": {"n": 1}})
    )
    (error,) = errors(sink)
    assert (error.client_event_id, error.param) == ("evt_m", "response.metadata")


async def test_response_cancel_stops_the_answer_and_a_second_cancel_is_an_error(
    make_session: MakeSession,
) -> None:
    d, session, sink = await dispatcher(make_session)
    await d.handle_raw(
        msg(
            type="conversation.item.create",
            item={"role": "user", "content": [{"type": "input_text", "text": "Tell a story."}]},
        )
    )
    await d.handle_raw(msg(type="response.create"))
    # Cancel once it streams: a cancel during the response's first Redis read loses its
    # response.done (sessions/response.py reads the history outside its cancel handling).
    await sink.wait_for(lambda e: e.type == "response.output_audio_transcript.delta")
    await d.handle_raw(msg(type="response.cancel", event_id="evt_cancel"))
    done = await sink.wait_for(is_done)
    assert isinstance(done, ResponseDone)
    assert (done.status, done.reason) == ("cancelled", "client_cancelled")
    await d.handle_raw(msg(type="response.cancel", event_id="evt_again"))
    (error,) = errors(sink)
    assert (error.client_event_id, error.code) == ("evt_again", "response_cancel_not_active")


async def test_input_image_lands_in_the_frame_cache(make_session: MakeSession) -> None:
    d, session, sink = await dispatcher(make_session)
    await d.handle_raw(
        msg(
            type="conversation.item.create",
            event_id="evt_img",
            item={
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": jpeg_data_url()},
                    {"type": "input_text", "text": "What do you see?"},
                ],
            },
        )
    )
    assert not errors(sink)
    assert await session.frames.count() == 1
    assert any(e.type == "conversation.item.created" for e in sink.events)


async def test_bad_image_data_is_an_error_event(make_session: MakeSession) -> None:
    d, session, sink = await dispatcher(make_session)
    not_an_image = "data:image/jpeg;base64," + base64.b64encode(b"hello").decode()
    for event_id, url in (("evt_b64", "data:image/jpeg;base64,@@@"), ("evt_img", not_an_image)):
        await d.handle_raw(
            msg(
                type="conversation.item.create",
                event_id=event_id,
                item={"role": "user", "content": [{"type": "input_image", "image_url": url}]},
            )
        )
    first, second = errors(sink)
    assert (first.client_event_id, first.code) == ("evt_b64", "invalid_value")
    assert (second.client_event_id, second.code) == ("evt_img", "invalid_media")
    assert await session.frames.count() == 0


async def test_malformed_and_unknown_events_are_errors_and_the_session_stays_up(
    make_session: MakeSession,
) -> None:
    d, session, sink = await dispatcher(make_session)
    await d.handle_raw("{oops")
    await d.handle_raw(msg(type="session.teleport", event_id="evt_unknown"))
    await d.handle_raw(msg(type="conversation.item.truncate", event_id="evt_t", item_id=3))
    await d.handle_raw(msg(type="conversation.item.delete", event_id="evt_del", item_id="x"))
    await d.handle_raw(
        msg(type="conversation.item.truncate", event_id="evt_tr", item_id="nope", audio_end_ms=5)
    )
    got = [(e.client_event_id, e.code) for e in errors(sink)]
    assert got == [
        (None, "invalid_json"),
        ("evt_unknown", "unknown_event_type"),
        ("evt_t", "invalid_type"),
        ("evt_del", "item_delete_invalid_item_id"),
        ("evt_tr", "item_truncate_invalid_item_id"),
    ]
    assert not session.closed
    await d.handle_raw(msg(type="session.update", session={"instructions": "still here"}))
    assert session.config.instructions == "still here"


async def test_audio_append_is_for_websockets_and_uses_the_connection_format(
    make_session: MakeSession,
) -> None:
    d, session, sink = await dispatcher(make_session, transport="websocket")
    tone = (3000 * np.sin(np.arange(4800) / 10)).astype(np.int16)  # 200 ms at 24 kHz
    audio = base64.b64encode(tone.tobytes()).decode()
    await d.handle_raw(msg(type="input_audio_buffer.append", audio=audio))
    assert 160 <= session.describe()["input_audio_ms"] <= 200  # less any resampler latency
    await d.handle_raw(msg(type="input_audio_buffer.append", event_id="evt_b", audio="**"))
    (error,) = errors(sink)
    assert (error.client_event_id, error.code) == ("evt_b", "invalid_value")

    rtc, _, rtc_sink = await dispatcher(make_session, transport="webrtc")
    await rtc.handle_raw(msg(type="input_audio_buffer.append", event_id="evt_rtc", audio=audio))
    (error,) = errors(rtc_sink)
    assert error.client_event_id == "evt_rtc" and "audio track" in error.message


async def test_manual_turn_commit_and_clear(make_session: MakeSession) -> None:
    d, session, sink = await dispatcher(make_session)
    await d.handle_raw(msg(type="session.update", session={"turn_detection": None}))
    assert session.config.turn_detection is None
    silence = base64.b64encode(bytes(24_000 * 2 // 5)).decode()  # 200 ms at 24 kHz
    await d.handle_raw(msg(type="input_audio_buffer.append", audio=silence))
    await d.handle_raw(msg(type="input_audio_buffer.commit", event_id="evt_commit"))
    await d.handle_raw(msg(type="input_audio_buffer.commit", event_id="evt_empty"))
    await d.handle_raw(msg(type="input_audio_buffer.clear"))
    types = sink.types()
    assert "input_audio_buffer.committed" in types and "input_audio_buffer.cleared" in types
    (error,) = errors(sink)
    assert error.client_event_id == "evt_empty"  # nothing left to commit


async def test_formats_follow_updates_only_where_the_transport_has_them(
    make_session: MakeSession,
) -> None:
    g711 = {"audio": {"input": {"format": {"type": "audio/pcmu"}}}}
    ws, session, sink = await dispatcher(make_session, transport="websocket")
    await ws.handle_raw(msg(type="session.update", event_id="evt_g711", session=g711))
    (error,) = errors(sink)
    assert error.client_event_id == "evt_g711" and "G.711" in error.message
    assert ws.formats == AudioFormats()

    rate = {"audio": {"output": {"format": {"type": "audio/pcm", "rate": 16_000}}}}
    await ws.handle_raw(msg(type="session.update", session=rate))
    assert ws.formats.output_rate == 16_000 and session.config.output_sample_rate == 16_000

    rtc, rtc_session, rtc_sink = await dispatcher(make_session, transport="webrtc")
    await rtc.handle_raw(msg(type="session.update", session={**g711, **rate}))
    assert not errors(rtc_sink)  # WebRTC's codecs come from the SDP: formats are ignored
    assert rtc.formats == AudioFormats() and rtc_session.config.output_sample_rate == 24_000


async def test_output_audio_buffer_clear_calls_the_transport(make_session: MakeSession) -> None:
    cleared: list[bool] = []
    rtc, _, rtc_sink = await dispatcher(
        make_session, transport="webrtc", clear_output=lambda: cleared.append(True)
    )
    await rtc.handle(parse_client_event(msg(type="output_audio_buffer.clear")))
    assert cleared == [True] and not errors(rtc_sink)

    ws, _, ws_sink = await dispatcher(make_session, transport="websocket")
    await ws.handle_raw(msg(type="output_audio_buffer.clear", event_id="evt_clear"))
    (error,) = errors(ws_sink)
    assert (error.client_event_id, error.code) == ("evt_clear", "unsupported")
