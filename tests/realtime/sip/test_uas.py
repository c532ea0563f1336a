"""The user agent server's own rules: bind refusal, allowlist, 405/481, retransmissions
absorbed, redirects, and Parley ending calls (hangup, close) against sipp."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from realtime.transports.sip.allow import Allowlist
from realtime.transports.sip.handler import Answer, IncomingCall, Rejection
from realtime.transports.sip.uas import SipServer

from .support import ANSWER_SDP, ScriptedHandler, requires_sipp, run_sipp, serve
from .test_malformed import Client, request


@pytest.fixture
def handler() -> ScriptedHandler:
    return ScriptedHandler()


@pytest.fixture
async def server(handler: ScriptedHandler) -> AsyncIterator[SipServer]:
    async for server in serve(handler):
        yield server


async def exchange(server: SipServer, *datagrams: bytes, wait: float = 0.3) -> list[bytes]:
    loop = asyncio.get_running_loop()
    transport, client = await loop.create_datagram_endpoint(
        Client, local_addr=("127.0.0.1", 0), remote_addr=("127.0.0.1", server.port)
    )
    try:
        for data in datagrams:
            transport.sendto(data)
        await asyncio.sleep(wait)
        return [client.received.get_nowait() for _ in range(client.received.qsize())]
    finally:
        transport.close()


def test_no_public_bind_without_auth_or_allowlist(handler: ScriptedHandler) -> None:
    with pytest.raises(ValueError, match="--sip-auth"):
        SipServer(handler, host="0.0.0.0", port=5060)
    SipServer(handler, host="0.0.0.0", port=5060, auth=("u", "p"))
    SipServer(handler, host="0.0.0.0", port=5060, allow=Allowlist.parse("10.0.0.0/8"))
    SipServer(handler, host="::", port=5060, allow=["10.0.0.0/8", "2001:db8::/32"])
    SipServer(handler, host="localhost", port=5060)
    with pytest.raises(ValueError, match="does not appear to be"):
        SipServer(handler, host="127.0.0.1", port=5060, allow="not-a-network")


async def test_an_unlisted_source_gets_no_answer(handler: ScriptedHandler) -> None:
    async for server in serve(handler, allow=Allowlist.parse("10.0.0.0/8, 192.0.2.1")):
        assert await exchange(server, request(0, "OPTIONS", body="")) == []
    async for server in serve(handler, allow="127.0.0.0/8"):
        (answer,) = await exchange(server, request(0, "OPTIONS", body=""))
        assert answer.startswith(b"SIP/2.0 200 OK")


async def test_405_with_allow_and_481_outside_a_dialog(server: SipServer) -> None:
    answers = await exchange(
        server,
        request(0, "REGISTER", branch="r1"),
        request(0, "BYE", branch="b2"),
        request(0, "CANCEL", branch="c3"),
        request(0, "INVITE", branch="i4").replace(
            b"To: <sip:parley@127.0.0.1>", b"To: <sip:parley@127.0.0.1>;tag=nope"
        ),
    )
    # a non-2xx to an INVITE is retransmitted until its ACK: count each request once
    heads = {a.split(b"\r\n")[0] for a in answers}
    assert heads == {
        b"SIP/2.0 405 Method Not Allowed",
        b"SIP/2.0 481 Call/Transaction Does Not Exist",
    }
    assert sum(a.startswith(b"SIP/2.0 481") and b"CSeq: 1 INVITE" not in a for a in answers) == 2
    assert any(b"Allow: INVITE, ACK, BYE, CANCEL, OPTIONS" in a for a in answers)


async def test_415_for_a_body_not_sdp_and_420_for_a_required_extension(
    server: SipServer, handler: ScriptedHandler
) -> None:
    answers = await exchange(
        server,
        request(0, branch="ct").replace(b"application/sdp", b"text/plain"),
        request(0, branch="rq", extra="Require: 100rel\r\n"),
    )
    finals = sorted({a.split(b"\r\n")[0] for a in answers})  # retransmitted until an ACK
    assert finals == [b"SIP/2.0 415 Unsupported Media Type", b"SIP/2.0 420 Bad Extension"]
    assert any(b"Unsupported: 100rel" in a for a in answers) and handler.invited == []


async def test_a_retransmitted_request_gets_the_same_response(server: SipServer) -> None:
    options = request(0, "OPTIONS", body="")
    first, second = await exchange(server, options, options)
    assert first == second


async def test_a_retransmitted_invite_is_absorbed_before_and_after_the_answer(
    server: SipServer, handler: ScriptedHandler
) -> None:
    gate = asyncio.Event()

    async def answer_later(call: IncomingCall) -> Answer:
        await gate.wait()
        return Answer(ANSWER_SDP)

    handler.invite = answer_later  # type: ignore[method-assign]
    invite = request(0, branch="again")
    loop = asyncio.get_running_loop()
    transport, client = await loop.create_datagram_endpoint(
        Client, local_addr=("127.0.0.1", 0), remote_addr=("127.0.0.1", server.port)
    )
    try:
        transport.sendto(invite)
        first = [await client.next(), await client.next()]
        transport.sendto(invite)  # before the answer: the last response again, no new call
        ringing = first[1]
        assert ringing is not None and ringing.startswith(b"SIP/2.0 180")
        assert await client.next() == ringing
        gate.set()
        ok = await client.next()
        assert ok is not None and ok.startswith(b"SIP/2.0 200 OK")
        transport.sendto(invite)  # after the answer: the same 200
        assert await client.next() == ok
        assert len(server.calls) == 1
    finally:
        transport.close()
    await server.close()
    assert list(handler.ended_calls.values()) == ["server closing"]


async def test_cancel_of_a_reinvite_keeps_the_call(
    server: SipServer, handler: ScriptedHandler
) -> None:
    async def never(call_id: str, sdp: str) -> Answer:
        await asyncio.sleep(30)
        raise AssertionError("cancelled")

    handler.reinvite = never  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    transport, client = await loop.create_datagram_endpoint(
        Client, local_addr=("127.0.0.1", 0), remote_addr=("127.0.0.1", server.port)
    )
    try:
        transport.sendto(request(0, branch="dlg"))
        while (answer := await client.next()) is not None and b" 200 OK" not in answer[:20]:
            pass
        assert answer is not None
        to = next(line for line in answer.split(b"\r\n") if line.startswith(b"To:"))
        in_dialog = (
            request(0, "ACK", branch="dlg-ack")
            .replace(b"To: <sip:parley@127.0.0.1>", to)
            .replace(b"Call-ID: c-dlg-ack", b"Call-ID: c-dlg")
        )
        transport.sendto(in_dialog)
        while not handler.confirmed_ids:
            await asyncio.sleep(0.01)
        reinvite = in_dialog.replace(b"ACK", b"INVITE").replace(
            b"CSeq: 1 INVITE", b"CSeq: 2 INVITE"
        )
        transport.sendto(reinvite)
        assert (await client.next() or b"").startswith(b"SIP/2.0 100 Trying")
        cancel = reinvite.replace(b"INVITE sip:", b"CANCEL sip:").replace(b"2 INVITE", b"2 CANCEL")
        transport.sendto(cancel)
        answers = {(await client.next() or b"").split(b"\r\n")[0] for _ in range(2)}
        assert answers == {b"SIP/2.0 200 OK", b"SIP/2.0 487 Request Terminated"}
        assert list(server.calls) == ["c-dlg"] and handler.ended_calls == {}
    finally:
        transport.close()


async def test_a_redirect_carries_its_contact(server: SipServer, handler: ScriptedHandler) -> None:
    async def refer(call: IncomingCall) -> Rejection:
        return Rejection(302, "Moved Temporarily", contact="sip:desk@192.0.2.9")

    handler.invite = refer  # type: ignore[method-assign]
    answers = await exchange(server, request(0, branch="redir"))
    final = answers[-1]
    assert final.startswith(b"SIP/2.0 302 Moved Temporarily")
    assert b"Contact: <sip:desk@192.0.2.9>" in final
    await handler.wait_ended(1)


@requires_sipp
async def test_hangup_sends_bye_in_the_dialog(
    server: SipServer, handler: ScriptedHandler, tmp_path: Path
) -> None:
    async def hang_up_when_confirmed() -> None:
        while not handler.confirmed_ids:
            await asyncio.sleep(0.01)
        await server.hangup(handler.confirmed_ids[0])

    hanging = asyncio.create_task(hang_up_when_confirmed())
    code, _ = await run_sipp("hangup", server, tmp_path)
    await hanging
    assert code == 0
    await handler.wait_ended(1)
    assert list(handler.ended_calls.values()) == ["hangup"] and not server.calls


@requires_sipp
async def test_close_byes_every_call_and_is_idempotent(
    server: SipServer, handler: ScriptedHandler, tmp_path: Path
) -> None:
    async def close_when_confirmed() -> None:
        while not handler.confirmed_ids:
            await asyncio.sleep(0.01)
        await server.close()

    closing = asyncio.create_task(close_when_confirmed())
    code, _ = await run_sipp("hangup", server, tmp_path)
    await closing
    await server.close()
    assert code == 0
    assert list(handler.ended_calls.values()) == ["server closing"]
    assert not server.calls and len(server.transactions) == 0


async def transfer_when_confirmed(
    server: SipServer, handler: ScriptedHandler, target: str = "sip:desk@192.0.2.9"
) -> int:
    while not handler.confirmed_ids:
        await asyncio.sleep(0.01)
    return await server.refer(handler.confirmed_ids[0], target)


@requires_sipp
async def test_a_transfer_the_target_answers_ends_the_call_with_a_bye(
    server: SipServer, handler: ScriptedHandler, tmp_path: Path
) -> None:
    """The caller's side takes the REFER on, reports trying then the target's 200: Parley
    leaves the call (its BYE; the scenario fails without it), `ended` says why."""
    transferring = asyncio.create_task(transfer_when_confirmed(server, handler))
    code, messages = await run_sipp("refer", server, tmp_path)
    assert code == 0 and await transferring == 202
    refer = messages[messages.index("REFER sip:") :]
    assert "Refer-To: <sip:desk@192.0.2.9>" in refer and "Referred-By: <sip:parley@" in refer
    await handler.wait_ended(1)
    assert list(handler.ended_calls.values()) == ["transferred"] and not server.calls


@requires_sipp
async def test_a_transfer_that_fails_or_is_refused_leaves_the_call_up(
    server: SipServer, handler: ScriptedHandler, tmp_path: Path
) -> None:
    """A busy target (486 in the sipfrag), or a REFER refused outright (603): no BYE from
    Parley, the call goes on until the caller hangs up."""
    for scenario, status in (("refer_fails", 202), ("refer_refused", 603)):
        handler.confirmed_ids.clear()
        handler.ended_calls.clear()
        transferring = asyncio.create_task(transfer_when_confirmed(server, handler))
        code, _ = await run_sipp(scenario, server, tmp_path)
        assert code == 0 and await transferring == status
        await handler.wait_ended(1)
        assert list(handler.ended_calls.values()) == ["bye"] and not server.calls


async def test_a_refer_of_no_call_up_is_481(server: SipServer) -> None:
    assert await server.refer("no-such-call@example.com", "sip:desk@192.0.2.9") == 481
