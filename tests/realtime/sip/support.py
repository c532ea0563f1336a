"""For the SIP tests: a scripted `CallHandler` (the media side's stand-in, answering with a
fixed SDP), a server fixture on loopback with short timers, and sipp run as a subprocess."""

from __future__ import annotations

import asyncio
import random
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from realtime.transports.sip.handler import Answer, IncomingCall, Rejection
from realtime.transports.sip.uas import SipServer

SCENARIOS = Path(__file__).parent / "scenarios"
T1 = 0.05
ANSWER_SDP = (
    "v=0\r\no=parley 1 1 IN IP4 127.0.0.1\r\ns=parley\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
    "m=audio 40000 RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
    "a=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n"
)

requires_sipp = pytest.mark.skipif(shutil.which("sipp") is None, reason="sipp not installed")


class ScriptedHandler:
    """Answers every call, unless its `X-Test` header says `reject` (488) or `slow`."""

    def __init__(self) -> None:
        self.invited: list[IncomingCall] = []
        self.confirmed_ids: list[str] = []
        self.reinvites: list[tuple[str, str]] = []
        self.ended_calls: dict[str, str] = {}
        self.changed = asyncio.Event()

    async def invite(self, call: IncomingCall) -> Answer | Rejection:
        self.invited.append(call)
        test = dict(call.headers).get("X-Test", "")
        if test == "reject":
            return Rejection(488, "Not Acceptable Here")
        if test == "slow":
            await asyncio.sleep(30)
        return Answer(ANSWER_SDP)

    async def confirmed(self, call_id: str) -> None:
        self.confirmed_ids.append(call_id)

    async def reinvite(self, call_id: str, sdp: str) -> Answer | Rejection:
        self.reinvites.append((call_id, sdp))
        return Answer(ANSWER_SDP.replace("a=sendrecv", "a=recvonly"))

    async def ended(self, call_id: str, reason: str) -> None:
        assert call_id not in self.ended_calls, "ended twice"
        self.ended_calls[call_id] = reason
        self.changed.set()

    async def wait_ended(self, count: int, timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.ended_calls) < count:
                self.changed.clear()
                await self.changed.wait()


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def free_sipp_port() -> int:
    """A port free for UDP and for TCP alike, below the kernel's ephemeral range: a port
    free for UDP alone was once taken for TCP (sipp over TCP exited 254, "Unable to bind
    main socket"), and one picked from the ephemeral range (port 0's answer) was taken by
    an outgoing connection between the test's probe and the server's bind (CI: a SIP
    server's TCP listener, EADDRINUSE)."""
    for _ in range(200):
        port = random.randrange(20_000, 32_768)
        with (
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp,
            socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp,
        ):
            try:
                udp.bind(("127.0.0.1", port))
                tcp.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no port free for both UDP and TCP on 127.0.0.1")


async def run_sipp(
    scenario: str,
    server: SipServer,
    tmp: Path,
    *,
    transport: str = "u1",
    extra: list[str] | None = None,
) -> tuple[int, str]:
    """Run one sipp call of `scenario` against `server`: (exit code, received messages)."""
    log = tmp / f"{scenario}.log"
    process = await asyncio.create_subprocess_exec(
        "sipp",
        f"127.0.0.1:{server.port}",
        "-sf",
        str(SCENARIOS / f"{scenario}.xml"),
        "-i",
        "127.0.0.1",
        "-p",
        str(free_sipp_port()),
        "-t",
        transport,
        "-m",
        "1",
        "-nostdin",
        "-timeout",
        "20s",
        "-timeout_error",
        "-trace_msg",
        "-message_file",
        str(log),
        "-trace_err",
        "-error_file",
        str(tmp / f"{scenario}.err"),
        *(extra or []),
        cwd=tmp,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await process.communicate()
    messages = log.read_text(errors="replace") if log.exists() else ""
    if process.returncode != 0:
        errors = tmp / f"{scenario}.err"
        detail = errors.read_text(errors="replace") if errors.exists() else ""
        print(stderr.decode(errors="replace"), detail, messages[-4000:])
    return process.returncode or 0, messages


async def serve(handler: ScriptedHandler, **options: object) -> AsyncIterator[SipServer]:
    server = SipServer(handler, host="127.0.0.1", port=0, t1=T1, **options)  # type: ignore[arg-type]
    await server.start()
    try:
        yield server
    finally:
        await server.close()
