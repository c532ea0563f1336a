"""The user agent server against a real SIP peer: sipp playing the caller's side."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from realtime.transports.sip.uas import SipServer

from .support import ScriptedHandler, requires_sipp, run_sipp, serve

pytestmark = requires_sipp


@pytest.fixture
def handler() -> ScriptedHandler:
    return ScriptedHandler()


@pytest.fixture
async def server(handler: ScriptedHandler) -> AsyncIterator[SipServer]:
    async for server in serve(handler):
        yield server


async def test_options_lists_the_methods(server: SipServer, tmp_path: Path) -> None:
    code, _ = await run_sipp("options", server, tmp_path)
    assert code == 0
    assert not server.calls


@pytest.mark.parametrize("transport", ["u1", "t1"])
async def test_invite_ack_bye(
    server: SipServer, handler: ScriptedHandler, tmp_path: Path, transport: str
) -> None:
    code, messages = await run_sipp("call", server, tmp_path, transport=transport)
    assert code == 0
    await handler.wait_ended(1)
    (call,) = handler.invited
    assert "m=audio" in call.sdp and call.source[0] == "127.0.0.1"
    assert handler.confirmed_ids == [call.call_id]
    assert handler.ended_calls == {call.call_id: "bye"}
    assert "SIP/2.0 100 Trying" in messages and "SIP/2.0 180 Ringing" in messages
    assert "Content-Type: application/sdp" in messages and "a=rtpmap:0 PCMU/8000" in messages
    assert not server.calls


async def test_cancel_before_the_answer(
    server: SipServer, handler: ScriptedHandler, tmp_path: Path
) -> None:
    code, _ = await run_sipp("cancel", server, tmp_path)
    assert code == 0
    await handler.wait_ended(1)
    assert list(handler.ended_calls.values()) == ["cancel"]
    assert handler.confirmed_ids == [] and not server.calls


@pytest.mark.parametrize("transport", ["u1", "t1"])
async def test_no_ack_retransmits_the_200_then_byes(
    server: SipServer, handler: ScriptedHandler, tmp_path: Path, transport: str
) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    code, messages = await run_sipp("no_ack", server, tmp_path, transport=transport)
    assert code == 0
    await handler.wait_ended(1)
    assert list(handler.ended_calls.values()) == ["no ACK"]
    oks = len(re.findall(r"SIP/2\.0 200 OK\r?\n(?:[^\r\n]+\r?\n)*?CSeq: 1 INVITE", messages))
    if transport == "u1":  # 50, 100, 200, 400, 400... ms apart
        assert oks >= 6, f"the 200 was sent {oks} times"
    else:  # TCP delivers: one 200, then only the wait for the ACK
        assert oks == 1
    assert loop.time() - started >= 64 * 0.05  # Timer H
    assert handler.confirmed_ids == [] and not server.calls


async def test_reinvite_in_an_established_call(
    server: SipServer, handler: ScriptedHandler, tmp_path: Path
) -> None:
    code, messages = await run_sipp("reinvite", server, tmp_path)
    assert code == 0
    await handler.wait_ended(1)
    ((call_id, sdp),) = handler.reinvites
    assert "a=sendonly" in sdp
    assert "a=recvonly" in messages
    assert handler.confirmed_ids == [call_id]
    assert handler.ended_calls == {call_id: "bye"}


async def test_a_rejection_is_the_final_response(
    server: SipServer, handler: ScriptedHandler, tmp_path: Path
) -> None:
    code, _ = await run_sipp("reject_488", server, tmp_path)
    assert code == 0
    await handler.wait_ended(1)
    assert list(handler.ended_calls.values()) == ["rejected 488"]
    assert not server.calls


async def test_busy_at_the_call_limit(handler: ScriptedHandler, tmp_path: Path) -> None:
    async for server in serve(handler, max_calls=0):
        code, _ = await run_sipp("reject_486", server, tmp_path)
        assert code == 0
        assert handler.invited == [] and not server.calls


async def test_digest_auth_challenges_then_accepts(
    handler: ScriptedHandler, tmp_path: Path
) -> None:
    async for server in serve(handler, auth=("alice", "s3cret")):
        code, messages = await run_sipp(
            "auth", server, tmp_path, extra=["-au", "alice", "-ap", "s3cret"]
        )
        assert code == 0
        assert 'WWW-Authenticate: Digest realm="parley"' in messages and 'qop="auth"' in messages
        await handler.wait_ended(1)
        assert len(handler.invited) == 1 and len(handler.confirmed_ids) == 1


async def test_digest_auth_refuses_a_wrong_password(
    handler: ScriptedHandler, tmp_path: Path
) -> None:
    async for server in serve(handler, auth=("alice", "s3cret")):
        code, messages = await run_sipp(
            "auth_refused", server, tmp_path, extra=["-au", "alice", "-ap", "nope"]
        )
        assert code == 0
        assert messages.count("SIP/2.0 401 Unauthorized") == 2 and "stale" not in messages
        assert handler.invited == [] and not server.calls
