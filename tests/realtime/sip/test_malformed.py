"""Malformed SIP over raw UDP and TCP: a 400 when a Via says where, else silence; the server
stays up, raises nothing, and holds no call or transaction for any of it."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Callable

import pytest

from realtime.transports.sip.uas import SipServer

from .support import ScriptedHandler, serve

VIA = "Via: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bK{branch};rport\r\n"


def request(
    port: int,
    method: str = "INVITE",
    *,
    branch: str = "b1",
    body: str = "v=0\r\n",
    extra: str = "",
    cseq: str = "",
) -> bytes:
    return (
        f"{method} sip:parley@127.0.0.1 SIP/2.0\r\n"
        + VIA.format(port=port, branch=branch)
        + "From: <sip:a@127.0.0.1>;tag=t1\r\nTo: <sip:parley@127.0.0.1>\r\n"
        f"Call-ID: c-{branch}\r\nCSeq: {cseq or '1 ' + method}\r\nMax-Forwards: 70\r\n"
        f"Contact: <sip:a@127.0.0.1:{port}>\r\n{extra}"
        f"Content-Type: application/sdp\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode()


class Client(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.received: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.received.put_nowait(data)

    async def next(self, timeout: float = 1.0) -> bytes | None:
        try:
            return await asyncio.wait_for(self.received.get(), timeout)
        except TimeoutError:
            return None


@pytest.fixture
def handler() -> ScriptedHandler:
    return ScriptedHandler()


@pytest.fixture
async def server(handler: ScriptedHandler) -> AsyncIterator[SipServer]:
    async for server in serve(handler):
        yield server


@pytest.fixture
async def udp(server: SipServer) -> AsyncIterator[tuple[asyncio.DatagramTransport, Client, int]]:
    loop = asyncio.get_running_loop()
    transport, client = await loop.create_datagram_endpoint(
        Client, local_addr=("127.0.0.1", 0), remote_addr=("127.0.0.1", server.port)
    )
    yield transport, client, transport.get_extra_info("sockname")[1]
    transport.close()


async def assert_alive(transport: asyncio.DatagramTransport, client: Client, port: int) -> None:
    while client.received.qsize():
        client.received.get_nowait()
    transport.sendto(request(port, "OPTIONS", branch="alive", body=""))
    answer = await client.next()
    assert answer is not None and answer.startswith(b"SIP/2.0 200 OK")


CASES: dict[str, Callable[[int], bytes]] = {
    "no Max-Forwards": lambda p: request(p).replace(b"Max-Forwards: 70\r\n", b""),
    "no Call-ID": lambda p: request(p).replace(b"Call-ID: c-b1\r\n", b""),
    "no From": lambda p: request(p).replace(b"From: <sip:a@127.0.0.1>;tag=t1\r\n", b""),
    "bad CSeq": lambda p: request(p, cseq="one INVITE"),
    "CSeq of another method": lambda p: request(p, cseq="1 BYE"),
    "truncated body": lambda p: request(p)[:-3],
    "huge header": lambda p: request(p, extra="X-Big: " + "a" * 5000 + "\r\n"),
    "many headers": lambda p: request(p, extra="X-A: 1\r\n" * 150),
    "bad start line": lambda p: request(p).replace(b"SIP/2.0\r\n", b"HTTP/1.1\r\n", 1),
}
DROPPED: dict[str, Callable[[int], bytes]] = {
    "no Via": lambda p: request(p).replace(VIA.format(port=p, branch="b1").encode(), b""),
    "garbage": lambda p: bytes(random.Random(1).getrandbits(8) for _ in range(300)),
    "headers only, no end": lambda p: request(p).split(b"\r\n\r\n")[0],
    "a bad ACK": lambda p: request(p, "ACK").replace(b"Max-Forwards: 70\r\n", b""),
    "a response": lambda p: b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP x;branch=z9hG4bKq\r\n\r\n",
}


async def test_malformed_datagrams_get_400_or_nothing(
    server: SipServer, handler: ScriptedHandler, udp: tuple[asyncio.DatagramTransport, Client, int]
) -> None:
    transport, client, port = udp
    for name, make in CASES.items():
        transport.sendto(make(port))
        answer = await client.next()
        assert answer is not None and answer.startswith(b"SIP/2.0 400 Bad Request"), name
    for name, make in DROPPED.items():
        transport.sendto(make(port))
        assert await client.next(0.15) is None, name
    await assert_alive(transport, client, port)
    assert server.malformed == len(CASES) + len(DROPPED)
    assert handler.invited == [] and not server.calls
    assert all(key[-1] == "OPTIONS" for key in server.transactions.server)


async def test_fuzzed_invites_raise_nothing_and_leak_no_call(
    server: SipServer,
    handler: ScriptedHandler,
    udp: tuple[asyncio.DatagramTransport, Client, int],
    caplog: pytest.LogCaptureFixture,
) -> None:
    transport, client, port = udp
    rng = random.Random(13)
    for index in range(300):
        data = bytearray(request(port, branch=f"f{index}"))
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        transport.sendto(bytes(data[: rng.randint(20, len(data))] if index % 3 == 0 else data))
    await asyncio.sleep(0.3)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    await assert_alive(transport, client, port)
    await server.close()
    assert set(handler.ended_calls) == {call.call_id for call in handler.invited}
    assert not server.calls and len(server.transactions) == 0


async def test_tcp_400_for_a_framed_bad_request_and_close_for_an_unframed_one(
    server: SipServer,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.tcp_port)
    bad = request(0, cseq="x INVITE").replace(b"SIP/2.0/UDP", b"SIP/2.0/TCP")
    writer.write(bad[:40])
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.write(bad[40:])
    answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
    assert answer.startswith(b"SIP/2.0 400 Bad Request")
    writer.write(b"GARBAGE WITHOUT A LENGTH\r\n\r\n")
    assert await asyncio.wait_for(reader.read(), 2) == b""  # the server closed the stream
    writer.close()
    await writer.wait_closed()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.tcp_port)
    writer.write(request(0).replace(b"Content-Length: 5", b"Content-Length: 70000"))
    assert await asyncio.wait_for(reader.read(), 2) == b""  # over the message size limit
    writer.close()
    await writer.wait_closed()
    assert not server.calls
