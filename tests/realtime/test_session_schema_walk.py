"""No silent drops (OpenAI Realtime issue 45, item 4): every field of OpenAI's GA session
object, as the pinned `openai` SDK declares it (`RealtimeSessionCreateRequestParam` and
`RealtimeTranscriptionSessionCreateRequestParam`), has one fate in Parley, written in
`FATES` and checked on the wire.

The SDK's TypedDicts are walked (`typing.get_type_hints`, every arm of every union) down to
each leaf; each leaf gets sample values (every value of a Literal, both booleans, a number
or a string Parley takes) inside the smallest session object the SDK allows around it. Each
sample goes in a `session.update` of its own connection to a served app (the fake graph)
and meets its fate:

- `HONOURED`: it takes effect, and `session.updated` echoes the value sent (the behaviour
  itself is tested where it is made: tests/sessions, and below for `parallel_tool_calls`);
- `ECHOED`: accepted and echoed as sent, and the docs say it changes nothing (OpenAI's
  advisory fields, a model's name);
- `Refused(param)`: an `error` whose `param` names it, and the rest of the update applies.

A leaf of the SDK that `FATES` does not list fails `test_every_field_of_the_sdk_has_a_fate`,
so a field the SDK gains can never be dropped unseen; every field is also in the fates table
of docs/protocols/session-settings.md.

A key is a path: `[]` is an array's element, `{mcp}` the arm of a union that `type` names;
`key=value` gives one value a fate of its own.
"""

from __future__ import annotations

import contextlib
import re
import types
import typing
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import httpx
import pytest
import pytest_asyncio
from openai.types.realtime.realtime_session_create_request_param import (
    RealtimeSessionCreateRequestParam,
)
from openai.types.realtime.realtime_transcription_session_create_request_param import (
    RealtimeTranscriptionSessionCreateRequestParam,
)
from websockets.asyncio.client import connect

from tests.conftest import fail_on_keys_left
from web.settings import Settings

from .apps import ServedApp, fake_graph_file, served_app
from .clients import Event, RecordingClient

KEY = "sk-test-parley-schema"
DB = 12
"""The server's database on the test redis-server (the tests' own is 0)."""
LOOP = pytest.mark.asyncio(loop_scope="module")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "protocols" / "session-settings.md"


@dataclass(frozen=True)
class Refused:
    param: str
    """The `param` of the error (`[0]`: the sample's only tool)."""


HONOURED = "honoured"
ECHOED = "echoed"
Fate = str | Refused

TOOL = "session.tools[0]"
TD = "session.audio.input.turn_detection"
TRANSCRIPTION = "session.audio.input.transcription"

_SHARED: dict[str, Fate] = {
    "session.audio.input.format{audio/pcm}.rate": HONOURED,
    "session.audio.input.format{audio/pcm}.type": HONOURED,
    "session.audio.input.format{audio/pcmu}.type": HONOURED,
    "session.audio.input.format{audio/pcma}.type": HONOURED,
    "session.audio.input.noise_reduction": HONOURED,
    "session.audio.input.noise_reduction.type": HONOURED,
    "session.audio.input.noise_reduction.strength": HONOURED,
    "session.audio.input.transcription.model": ECHOED,
    "session.audio.input.transcription.language": HONOURED,
    "session.audio.input.transcription.prompt": HONOURED,
    "session.audio.input.transcription.keywords[]": HONOURED,
    "session.audio.input.transcription.languages[]": HONOURED,
    "session.audio.input.transcription.delay": Refused(f"{TRANSCRIPTION}.delay"),
    "session.audio.input.turn_detection": HONOURED,
    "session.audio.input.turn_detection{server_vad}.type": HONOURED,
    "session.audio.input.turn_detection{server_vad}.threshold": HONOURED,
    "session.audio.input.turn_detection{server_vad}.prefix_padding_ms": HONOURED,
    "session.audio.input.turn_detection{server_vad}.silence_duration_ms": HONOURED,
    "session.audio.input.turn_detection{server_vad}.create_response": HONOURED,
    "session.audio.input.turn_detection{server_vad}.interrupt_response": HONOURED,
    "session.audio.input.turn_detection{server_vad}.idle_timeout_ms": HONOURED,
    "session.audio.input.turn_detection{semantic_vad}.type": HONOURED,
    "session.audio.input.turn_detection{semantic_vad}.eagerness": HONOURED,
    "session.audio.input.turn_detection{semantic_vad}.create_response": HONOURED,
    "session.audio.input.turn_detection{semantic_vad}.interrupt_response": HONOURED,
    "session.include[]": HONOURED,
}

FATES: dict[str, Fate] = {
    **_SHARED,
    "session.type": HONOURED,
    "session.audio.output.format{audio/pcm}.rate": HONOURED,
    "session.audio.output.format{audio/pcm}.type": HONOURED,
    "session.audio.output.format{audio/pcmu}.type": HONOURED,
    "session.audio.output.format{audio/pcma}.type": HONOURED,
    "session.audio.output.speed": HONOURED,
    "session.audio.output.voice": HONOURED,
    "session.audio.output.voice.id": Refused("session.audio.output.voice"),
    "session.instructions": HONOURED,
    "session.max_output_tokens": HONOURED,
    "session.model": ECHOED,
    "session.output_modalities[]": HONOURED,
    "session.parallel_tool_calls": HONOURED,
    "session.prompt": HONOURED,  # null: no stored prompt
    "session.prompt.id": Refused("session.prompt"),
    "session.prompt.variables": Refused("session.prompt"),
    "session.prompt.version": Refused("session.prompt"),
    "session.reasoning.effort": ECHOED,
    "session.tool_choice": HONOURED,
    "session.tool_choice{function}.type": HONOURED,
    "session.tool_choice{function}.name": HONOURED,
    "session.tool_choice{mcp}.type": Refused("session.tool_choice"),
    "session.tool_choice{mcp}.server_label": Refused("session.tool_choice"),
    "session.tool_choice{mcp}.name": Refused("session.tool_choice"),
    "session.tools[]{function}.type": HONOURED,
    "session.tools[]{function}.name": HONOURED,
    "session.tools[]{function}.description": HONOURED,
    "session.tools[]{function}.parameters": HONOURED,
    "session.tools[]{mcp}.type": HONOURED,
    "session.tools[]{mcp}.server_label": HONOURED,
    "session.tools[]{mcp}.server_url": HONOURED,
    "session.tools[]{mcp}.headers": HONOURED,
    "session.tools[]{mcp}.authorization": HONOURED,  # echoed redacted: ECHO_AS
    "session.tools[]{mcp}.allowed_tools": HONOURED,
    "session.tools[]{mcp}.allowed_tools[]": HONOURED,
    "session.tools[]{mcp}.allowed_tools.read_only": HONOURED,
    "session.tools[]{mcp}.allowed_tools.tool_names[]": HONOURED,
    "session.tools[]{mcp}.require_approval": HONOURED,
    "session.tools[]{mcp}.require_approval.always.read_only": HONOURED,
    "session.tools[]{mcp}.require_approval.always.tool_names[]": HONOURED,
    "session.tools[]{mcp}.require_approval.never.read_only": HONOURED,
    "session.tools[]{mcp}.require_approval.never.tool_names[]": HONOURED,
    "session.tools[]{mcp}.server_description": HONOURED,
    "session.tools[]{mcp}.allowed_callers": HONOURED,
    "session.tools[]{mcp}.allowed_callers[]": HONOURED,
    "session.tools[]{mcp}.allowed_callers[]='programmatic'": Refused(f"{TOOL}.allowed_callers"),
    "session.tools[]{mcp}.defer_loading": HONOURED,
    "session.tools[]{mcp}.defer_loading=True": Refused(f"{TOOL}.defer_loading"),
    "session.tools[]{mcp}.connector_id": Refused(f"{TOOL}.connector_id"),
    "session.tools[]{mcp}.tunnel_id": Refused(f"{TOOL}.tunnel_id"),
    "session.tracing": ECHOED,
    "session.tracing.group_id": ECHOED,
    "session.tracing.metadata": ECHOED,
    "session.tracing.workflow_name": ECHOED,
    "session.truncation": HONOURED,
    "session.truncation.type": HONOURED,
    "session.truncation.retention_ratio": HONOURED,
    "session.truncation.token_limits.post_instructions": HONOURED,
}
"""A conversation session's fields (`RealtimeSessionCreateRequestParam`)."""

TRANSCRIPTION_FATES: dict[str, Fate] = {
    **_SHARED,
    "session.type": HONOURED,
    # A transcription session never answers: turn detection's answer settings are off.
    f"{TD}{{server_vad}}.create_response=True": Refused(f"{TD}.create_response"),
    f"{TD}{{server_vad}}.interrupt_response=True": Refused(f"{TD}.interrupt_response"),
    f"{TD}{{server_vad}}.idle_timeout_ms": Refused(f"{TD}.idle_timeout_ms"),
    f"{TD}{{server_vad}}.idle_timeout_ms=None": HONOURED,
    f"{TD}{{semantic_vad}}.create_response=True": Refused(f"{TD}.create_response"),
    f"{TD}{{semantic_vad}}.interrupt_response=True": Refused(f"{TD}.interrupt_response"),
}
"""A transcription session's fields (`RealtimeTranscriptionSessionCreateRequestParam`)."""

MCP_URL = "http://127.0.0.1:9/mcp"
"""Nothing listens there: the listing fails at once (an `mcp_list_tools_failed` error,
which is not the update's), and the settings are echoed all the same."""
VALUES: dict[str, list[Any]] = {
    "session.audio.output.voice": ["marin"],
    "session.audio.output.speed": [1.25],
    "session.audio.input.transcription.language": ["fr"],
    "session.audio.input.transcription.languages[]": ["fr"],
    "session.audio.input.noise_reduction.strength": [0.5],
    f"{TD}{{server_vad}}.threshold": [0.6],
    f"{TD}{{server_vad}}.prefix_padding_ms": [250],
    f"{TD}{{server_vad}}.silence_duration_ms": [650],
    f"{TD}{{server_vad}}.idle_timeout_ms": [5_000],
    "session.max_output_tokens": [100],
    "session.tool_choice{function}.name": ["lookup"],
    "session.tools[]{function}.name": ["lookup"],
    "session.tools[]{function}.parameters": [{"type": "object", "properties": {}}],
    "session.tools[]{mcp}.server_label": ["docs"],
    "session.tools[]{mcp}.server_url": [MCP_URL],
    "session.truncation.retention_ratio": [0.8],
    "session.truncation.token_limits.post_instructions": [1_000],
}
"""Sample values where the generic ones (a string, 1, 0.5) are not ones Parley takes."""
BASE: dict[str, dict[str, Any]] = {
    "session.tools[]{function}": {"name": "lookup"},
    "session.tools[]{mcp}": {"server_url": MCP_URL},
}
"""What an object needs beside its SDK-required keys for Parley to take it."""
CONTEXT: dict[str, dict[str, Any]] = {
    "session.tool_choice{function}": {"tools": [{"type": "function", "name": "lookup"}]},
}
"""Session fields a sample needs beside it (a forced function must be a tool)."""
ECHO_AS: dict[str, Any] = {"session.tools[]{mcp}.authorization": "<redacted>"}
"""Echoed otherwise than sent, as documented: the token is never sent back."""


# --- the walk ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    key: str
    leaf: Any
    session: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.key}={self.leaf!r}"[:90]


def _arms(tp: Any) -> list[Any]:
    if get_origin(tp) in (typing.Union, types.UnionType):
        return [arm for inner in get_args(tp) for arm in _arms(inner)]
    return [tp]


def _is_object(tp: Any) -> bool:
    return isinstance(tp, type) and hasattr(tp, "__total__")


def _is_array(tp: Any) -> bool:
    origin = get_origin(tp)
    return origin is not None and getattr(origin, "__name__", "") in {
        "list",
        "Iterable",
        "Sequence",
        "SequenceNotStr",
    }


def _required(td: Any) -> list[str]:
    hints = get_type_hints(td, include_extras=True)
    return [key for key, hint in hints.items() if get_origin(hint) is typing.Required]


def _leaf_values(key: str, tp: Any) -> list[Any]:
    if get_origin(tp) is Literal:
        return list(get_args(tp))
    if tp is type(None):
        return [None]
    if key in VALUES:
        return VALUES[key]
    if tp is bool:
        return [True, False]
    samples: dict[Any, list[Any]] = {int: [1], float: [0.5], str: ["sample"], object: [{"k": "v"}]}
    if tp in samples:
        return samples[tp]
    if get_origin(tp) is dict:
        return [{"k": "v"}]
    raise AssertionError(f"no sample value for {key} ({tp}): add one to VALUES")


def walk(tp: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    """(key, leaf value, a value of `tp` holding it) for every leaf under `tp`."""
    arms = _arms(tp)
    objects = [arm for arm in arms if _is_object(arm)]
    for arm in arms:
        if _is_object(arm):
            hints = get_type_hints(arm)
            tag = ""
            if len(objects) > 1 and get_origin(hints.get("type")) is Literal:
                tag = "{" + str(get_args(hints["type"])[0]) + "}"
            here = path + tag
            base = {key: next(walk(hints[key], f"{here}.{key}"))[2] for key in _required(arm)}
            base |= BASE.get(here, {})
            for key, hint in hints.items():
                for leaf_key, leaf, value in walk(hint, f"{here}.{key}"):
                    yield leaf_key, leaf, {**base, key: value}
        elif _is_array(arm):
            for leaf_key, leaf, value in walk(get_args(arm)[0], path + "[]"):
                yield leaf_key, leaf, [value]
        else:
            for value in _leaf_values(path, arm):
                yield path, value, value


def samples(root: Any) -> list[Sample]:
    out = []
    for key, leaf, session in walk(root, "session"):
        for prefix, context in CONTEXT.items():
            if key.startswith(prefix):
                session = {**context, **session}
        out.append(Sample(key, leaf, session))
    return out


CONVERSATION = samples(RealtimeSessionCreateRequestParam)
TRANSCRIPTIONS = samples(RealtimeTranscriptionSessionCreateRequestParam)


def fate(fates: dict[str, Fate], sample: Sample) -> Fate:
    return fates.get(f"{sample.key}={sample.leaf!r}", fates.get(sample.key, "unlisted"))


def at(obj: Any, key: str) -> Any:
    """The value at `key` (tags dropped, `[]` the first element); None where absent."""
    for part in key.split(".")[1:]:
        part = re.sub(r"\{[^}]*\}", "", part)
        array = part.endswith("[]")
        part = part.removesuffix("[]")
        obj = obj.get(part) if isinstance(obj, dict) else None
        if array:
            obj = obj[0] if isinstance(obj, list) and obj else None
    return obj


def base_key(key: str) -> str:
    return key.split("=", 1)[0]


# --- the fates -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fates", "walked"), [(FATES, CONVERSATION), (TRANSCRIPTION_FATES, TRANSCRIPTIONS)]
)
def test_every_field_of_the_sdk_has_a_fate(fates: dict[str, Fate], walked: list[Sample]) -> None:
    """A field the SDK gains is unlisted here and fails; a fate for a field it no longer
    has fails too."""
    keys = {sample.key for sample in walked}
    listed = {base_key(key) for key in fates}
    assert sorted(keys - listed) == [], "fields of the SDK with no fate in FATES"
    assert sorted(listed - keys) == [], "fates of fields the SDK does not have"
    variants = {key for key in fates if "=" in key}
    values = {f"{sample.key}={sample.leaf!r}" for sample in walked}
    assert sorted(variants - values) == [], "fates of values the walk never sends"


def test_every_field_is_in_the_docs_fates_table() -> None:
    """Each field (`audio.input.turn_detection.threshold`, `tools[].connector_id`) is named
    in docs/protocols/session-settings.md's table of fates, as a code span."""
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("## What each field does", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([^`]+)`", section))
    fields = {
        re.sub(r"\{[^}]*\}", "", base_key(key)).removeprefix("session.").removesuffix("[]")
        for key in [*FATES, *TRANSCRIPTION_FATES]
    }
    assert sorted(fields - named) == []


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(
    redis_socket: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ServedApp]:
    graph = fake_graph_file(tmp_path_factory.mktemp("schema"))
    url = f"unix://{redis_socket}?db={DB}"
    async with served_app(Settings(pipeline=graph, api_key=KEY, max_sessions=4), url) as app:
        # The fake engine transcribes ("heard <n> ms"); a graph of it cannot say so, so the
        # served pipeline says it (pipeline/recognition.py reads this attribute first).
        app.services.pipeline.recogniser = "fake"  # type: ignore[union-attr]
        yield app
    fail_on_keys_left(redis_socket, DB, "the session schema tests' server")


@contextlib.asynccontextmanager
async def connected(server: ServedApp, query: str) -> AsyncIterator[RecordingClient]:
    url = f"{server.ws_url}/v1/realtime?{query}"
    headers = {"Authorization": f"Bearer {KEY}"}
    async with connect(url, additional_headers=headers, proxy=None) as ws:
        client = RecordingClient(ws, wait_s=10)
        await client.wait_type("session.created")
        yield client


async def update(client: RecordingClient, session: dict[str, Any]) -> tuple[Event, list[Event]]:
    """session.updated for `session`, and the update's errors before it (an MCP listing's
    failure is the listing's, not the update's)."""
    await client.send({"type": "session.update", "event_id": "evt_walk", "session": session})
    updated = await client.wait_type("session.updated")
    errors = [
        e["error"]
        for e in client.events
        if e["type"] == "error" and e["error"]["code"] != "mcp_list_tools_failed"
    ]
    return updated["session"], errors


def _marked(sample: Sample, marker: str) -> tuple[dict[str, Any], str] | None:
    """The sample with a field beside it that must apply whatever its fate, and that
    field's key; None where the sample is that field."""
    session = sample.session
    if sample.session.get("type") == "transcription":
        key = f"{TRANSCRIPTION}.prompt"
        if sample.key == key:
            return None
        audio = session.get("audio", {})
        inputs = audio.get("input", {})
        transcription = {**inputs.get("transcription", {}), "prompt": marker}
        marked = {**audio, "input": {**inputs, "transcription": transcription}}
        return {**session, "audio": marked}, key
    if sample.key == "session.instructions":
        return None
    return {**session, "instructions": marker}, "session.instructions"


async def meets_its_fate(
    server: ServedApp, query: str, fates: dict[str, Fate], sample: Sample
) -> None:
    expected = fate(fates, sample)
    assert expected != "unlisted", f"{sample.key} has no fate"
    marked = _marked(sample, "kept")
    session = marked[0] if marked else sample.session
    async with connected(server, query) as client:
        echoed, errors = await update(client, session)
    if isinstance(expected, Refused):
        assert [e["param"] for e in errors] == [expected.param], errors
        assert errors[0]["type"] == "invalid_request_error"
        assert errors[0]["code"] in ("invalid_value", "unknown_parameter")
        if marked is not None:  # the rest of the update applied
            assert at(echoed, marked[1]) == "kept", echoed
        return
    assert errors == [], errors
    want = ECHO_AS.get(sample.key, sample.leaf)
    assert at(echoed, sample.key) == want, (sample.session, echoed)


@LOOP
@pytest.mark.parametrize("sample", CONVERSATION, ids=lambda s: s.id)
async def test_a_conversation_sessions_field_meets_its_fate(
    server: ServedApp, sample: Sample
) -> None:
    await meets_its_fate(server, "model=parley", FATES, sample)


@LOOP
@pytest.mark.parametrize("sample", TRANSCRIPTIONS, ids=lambda s: s.id)
async def test_a_transcription_sessions_field_meets_its_fate(
    server: ServedApp, sample: Sample
) -> None:
    await meets_its_fate(server, "intent=transcription", TRANSCRIPTION_FATES, sample)


async def created_with(server: ServedApp, session: dict[str, Any]) -> tuple[int, Event]:
    """A client secret minted for `session`, and the session.created of a connection made
    with it (or the refusal's status and error)."""
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        minted = await http.post(
            "/v1/realtime/client_secrets", json={"session": session}, headers=headers
        )
    body = minted.json()
    if minted.status_code != 200:
        return minted.status_code, body["error"]
    url = f"{server.ws_url}/v1/realtime"
    secret = {"Authorization": f"Bearer {body['value']}"}
    async with connect(url, additional_headers=secret, proxy=None) as ws:
        created = await RecordingClient(ws).wait_type("session.created")
    return 200, created["session"]


@LOOP
@pytest.mark.parametrize(
    ("fates", "sample"),
    [(FATES, s) for s in CONVERSATION] + [(TRANSCRIPTION_FATES, s) for s in TRANSCRIPTIONS],
    ids=lambda x: x.id if isinstance(x, Sample) else "",
)
async def test_a_field_meets_its_fate_when_the_session_is_created_with_it(
    server: ServedApp, fates: dict[str, Fate], sample: Sample
) -> None:
    """The same fates in a session's settings at its creation (a client secret's session,
    then the connection): a refused field refuses the secret, naming it (a session is not
    started on half its settings); any other is in session.created."""
    expected = fate(fates, sample)
    status, got = await created_with(server, sample.session)
    if isinstance(expected, Refused):
        assert (status, got["param"]) == (400, expected.param), got
        return
    assert status == 200, got
    assert at(got, sample.key) == ECHO_AS.get(sample.key, sample.leaf), (sample.session, got)


@LOOP
async def test_a_key_openai_does_not_have_is_refused_by_its_path(server: ServedApp) -> None:
    """As OpenAI refuses it (`unknown_parameter`), at any depth and in a tool; the rest of
    the update applies. `parley` holds Parley's own keys (a transport's too)."""
    session = {
        "instructions": "kept",
        "temperature_c": 21,
        "audio": {"input": {"echo_cancellation": True}, "output": {"voice": "marin"}},
        "tools": [{"type": "function", "name": "lookup", "strict": True}],
        "parley": {"video_fps_idle": 1.0},
    }
    async with connected(server, "model=parley") as client:
        echoed, errors = await update(client, session)
    assert sorted(e["param"] for e in errors) == [
        "session.audio.input.echo_cancellation",
        "session.temperature_c",
        "session.tools[0].strict",
    ]
    assert {e["code"] for e in errors} == {"unknown_parameter"}
    assert echoed["instructions"] == "kept" and echoed["audio"]["output"]["voice"] == "marin"
    assert [tool["name"] for tool in echoed["tools"]] == ["lookup"]


@LOOP
async def test_a_transcription_session_refuses_a_conversations_fields(server: ServedApp) -> None:
    """OpenAI's transcription session has no instructions, voice or tools: each is an
    `unknown_parameter`, and the transcription settings beside them apply."""
    session = {
        "type": "transcription",
        "instructions": "Be brief.",
        "audio": {"input": {"transcription": {"language": "fr"}}, "output": {"voice": "marin"}},
    }
    async with connected(server, "intent=transcription") as client:
        echoed, errors = await update(client, session)
    assert sorted(e["param"] for e in errors) == ["session.audio.output", "session.instructions"]
    assert echoed["audio"]["input"]["transcription"] == {"language": "fr"}
