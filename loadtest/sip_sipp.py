"""sipp as the SIP benchmark's load: N calls placed at once, each streaming speech for S seconds.

The scenario is an INVITE / ACK, then `rtp_stream` looping a spoken question (8 kHz mu-law
WAV) for the whole call, so every call carries audio both ways (Parley hears speech and the
echo graph answers it), then a BYE. sipp's statistics file says how many calls succeeded.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

from realtime import g711

_SDP = """v=0
o=sipp 1 1 IN IP4 [local_ip]
s=-
c=IN IP4 [media_ip]
t=0 0
m=audio [media_port] RTP/AVP 0
a=rtpmap:0 PCMU/8000"""

_HEAD = """Via: SIP/2.0/UDP [local_ip]:[local_port];branch=[branch];rport
From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]-[call_number]
To: <sip:parley@[remote_ip]:[remote_port]>{to_tag}
Call-ID: [call_id]
Max-Forwards: 70
Contact: <sip:sipp@[local_ip]:[local_port]>"""


def _request(method: str, cseq: int, body: str = "") -> str:
    head = _HEAD.format(to_tag="" if method == "INVITE" else "[peer_tag_param]")
    lines = [
        f"{method} sip:parley@[remote_ip]:[remote_port] SIP/2.0",
        head,
        f"CSeq: {cseq} {method}",
    ]
    if body:
        lines += ["Content-Type: application/sdp", "Content-Length: [len]", "", body]
    else:
        lines += ["Content-Length: 0", "", ""]
    retrans = ' retrans="500"' if method in ("INVITE", "BYE") else ""
    return f"<send{retrans}><![CDATA[\n" + "\n".join(lines) + "\n]]></send>"


def scenario(seconds: float) -> str:
    """Call, stream `speech.wav` looped (-1) while holding for `seconds`, hang up."""
    hold = int(seconds * 1000)
    return "\n".join(
        [
            '<?xml version="1.0" encoding="ISO-8859-1" ?>',
            '<scenario name="sip_bench">',
            _request("INVITE", 1, _SDP),
            '<recv response="100" optional="true"/>',
            '<recv response="180" optional="true"/>',
            '<recv response="200" rtd="true"/>',
            _request("ACK", 1),
            '<nop><action><exec rtp_stream="speech.wav,-1,0"/></action></nop>',
            f'<pause milliseconds="{hold}"/>',
            '<nop><action><exec rtp_stream="pause"/></action></nop>',
            _request("BYE", 2),
            '<recv response="200" crlf="true"/>',
            "</scenario>",
        ]
    )


def mulaw_wav(pcm: np.ndarray) -> bytes:
    """8 kHz mono mu-law in a WAV (format 7), the form sipp's rtp_stream plays."""
    data = g711.ulaw_encode(pcm)
    fmt = struct.pack("<HHIIHHH", 7, 1, 8000, 8000, 1, 8, 0)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"fact" + struct.pack("<II", 4, len(data)) + b"data" + struct.pack("<I", len(data))
    return b"RIFF" + struct.pack("<I", len(body) + len(data)) + body + data


@dataclass
class SippResult:
    successful: int
    failed: int
    cpu_pct: float


class SippRun:
    """`calls` concurrent calls to 127.0.0.1:`sip_port`."""

    def __init__(
        self,
        sip_port: int,
        calls: int,
        seconds: float,
        speech: np.ndarray,
        work: Path,
        ramp: float = 1.0,
    ) -> None:
        """Each call held `seconds`; the calls placed evenly over `ramp` seconds."""
        self.sip_port, self.calls, self.seconds, self.work = sip_port, calls, seconds, work
        self.ramp = ramp
        self.speech = speech
        self.stats = work / f"sipp_{calls}.csv"
        self._proc: asyncio.subprocess.Process | None = None
        self._started = 0.0

    async def start(self) -> None:
        if self.calls == 0:
            return
        (self.work / "speech.wav").write_bytes(mulaw_wav(self.speech))
        (self.work / "bench.xml").write_text(scenario(self.seconds))
        self.stats.unlink(missing_ok=True)
        n = str(self.calls)
        args = ["-sf", "bench.xml", "-i", "127.0.0.1", "-mi", "127.0.0.1", "-p", "0"]
        args += ["-m", n, "-l", n, "-r", n, "-rp", str(int(self.ramp * 1000)), "-nostdin"]
        args += ["-timeout", f"{int(self.seconds) + 60}s", "-trace_stat", "-fd", "1"]
        args += ["-stf", str(self.stats)]
        self._proc = await asyncio.create_subprocess_exec(
            "sipp",
            f"127.0.0.1:{self.sip_port}",
            *args,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            cwd=self.work,
        )
        self._started = time.monotonic()

    async def finish(self) -> SippResult:
        """sipp's CPU so far, then wait for its calls to end and read its statistics."""
        if self._proc is None:
            return SippResult(0, 0, 0.0)
        cpu = 0.0
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(self._proc.pid).cpu_times()
            cpu = 100 * (times.user + times.system) / max(time.monotonic() - self._started, 1e-9)
        try:
            async with asyncio.timeout(self.seconds + 90):
                await self._proc.wait()
        except TimeoutError:
            self._proc.kill()
            await self._proc.wait()
        return SippResult(*_counts(self.stats), cpu)


def _counts(stats: Path) -> tuple[int, int]:
    """(successful, failed) calls from sipp's last statistics line."""
    if not stats.exists():
        return 0, 0
    rows = [line.split(";") for line in stats.read_text().splitlines() if line.strip()]
    if len(rows) < 2:
        return 0, 0
    head, last = rows[0], rows[-1]
    return int(last[head.index("SuccessfulCall(C)")]), int(last[head.index("FailedCall(C)")])
