"""SDP offer/answer for a phone call's audio (RFC 3264): G.711 and telephone-event.

A SIP caller offers one `m=audio` stream over RTP/AVP with the codecs it can use, in its
order of preference. Parley speaks G.711 only (PCMU, payload type 0; PCMA, 8), so the answer
picks the first of those the offer lists, keeps RFC 4733 telephone-event (DTMF) at the
offerer's payload type if offered at 8 kHz, and mirrors the direction: a caller putting
us on hold sends `sendonly` (or `inactive`) and gets `recvonly` (or `inactive`) back. An
offer with no G.711 gets a 488. The offer's connection address and port are where our RTP
goes until the caller's own packets show where it really is (symmetric RTP).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

from ...g711 import PCMA, PCMU
from .handler import Rejection

Direction = Literal["sendrecv", "sendonly", "recvonly", "inactive"]
DIRECTIONS: tuple[Direction, ...] = ("sendrecv", "sendonly", "recvonly", "inactive")
ANSWER_DIRECTION: dict[Direction, Direction] = {
    "sendrecv": "sendrecv",
    "sendonly": "recvonly",
    "recvonly": "sendonly",
    "inactive": "inactive",
}
STATIC_CODECS = {0: ("PCMU", 8000), 8: ("PCMA", 8000)}
G711_FORMATS = {"PCMU": PCMU, "PCMA": PCMA}
PTIME_MS = 20


class SdpError(ValueError):
    """An offer we cannot read (no audio stream, a bad line)."""


@dataclass(slots=True)
class AudioOffer:
    """What the caller's SDP says about its audio stream."""

    address: str
    port: int
    payload_types: list[int]
    """In the offerer's order of preference."""
    rtpmap: dict[int, tuple[str, int]] = field(default_factory=dict)
    """Payload type -> (encoding name upper-cased, clock rate)."""
    fmtp: dict[int, str] = field(default_factory=dict)
    ptime_ms: int | None = None
    direction: Direction = "sendrecv"

    def codec(self, pt: int) -> tuple[str, int] | None:
        return self.rtpmap.get(pt) or STATIC_CODECS.get(pt)


@dataclass(frozen=True, slots=True)
class Negotiated:
    """The agreed stream: what we send and receive, and where the caller listens."""

    payload_type: int
    format: str
    """`audio/pcmu` or `audio/pcma` (realtime.g711)."""
    telephone_event: int | None
    remote: tuple[str, int]
    direction: Direction
    """Our direction (the answer's)."""

    @property
    def we_send(self) -> bool:
        return self.direction in ("sendrecv", "sendonly")


def parse_offer(sdp: str) -> AudioOffer:
    """The first audio stream of `sdp`. SdpError when there is none or it is malformed."""
    session_address = ""
    session_direction: Direction = "sendrecv"
    offer: AudioOffer | None = None
    in_audio = False
    for raw in sdp.splitlines():
        line = raw.strip()
        if len(line) < 2 or line[1] != "=":
            continue
        kind, value = line[0], line[2:]
        if kind == "m":
            if offer is not None:
                break  # only the first audio stream is used
            in_audio = value.startswith("audio ")
            if in_audio:
                offer = _media_line(value, session_address, session_direction)
        elif kind == "c":
            address = _connection(value)
            if offer is None:
                session_address = address
            elif in_audio:
                offer.address = address
        elif kind == "a":
            name, _, rest = value.partition(":")
            if name in DIRECTIONS:
                if offer is None:
                    session_direction = name
                elif in_audio:
                    offer.direction = name
            elif offer is not None and in_audio:
                _attribute(offer, name, rest)
    if offer is None:
        raise SdpError("the offer has no audio stream")
    if not offer.address:
        raise SdpError("the offer has no connection address (c=)")
    return offer


def _media_line(value: str, address: str, direction: Direction) -> AudioOffer:
    parts = value.split()
    if len(parts) < 4:
        raise SdpError(f"bad media line: m={value}")
    if parts[2] != "RTP/AVP":
        raise SdpError(f"unsupported transport {parts[2]} (RTP/AVP only)")
    try:
        port = int(parts[1].split("/")[0])
        payload_types = [int(pt) for pt in parts[3:]]
    except ValueError:
        raise SdpError(f"bad media line: m={value}") from None
    if not 0 <= port <= 65535:
        raise SdpError(f"bad port {port}")
    return AudioOffer(address, port, payload_types, direction=direction)


def _connection(value: str) -> str:
    parts = value.split()
    if len(parts) != 3 or parts[0] != "IN" or parts[1] not in ("IP4", "IP6"):
        raise SdpError(f"bad connection line: c={value}")
    return parts[2].split("/")[0]


def _attribute(offer: AudioOffer, name: str, rest: str) -> None:
    try:
        if name == "rtpmap":
            pt, _, encoding = rest.partition(" ")
            codec, _, rate = encoding.partition("/")
            offer.rtpmap[int(pt)] = (codec.upper(), int(rate.split("/")[0]))
        elif name == "fmtp":
            pt, _, params = rest.partition(" ")
            offer.fmtp[int(pt)] = params.strip()
        elif name == "ptime":
            offer.ptime_ms = int(rest)
    except ValueError:
        raise SdpError(f"bad attribute: a={name}:{rest}") from None


def negotiate(offer: AudioOffer) -> Negotiated | Rejection:
    """The first G.711 codec in the offerer's order, telephone-event if offered; a 488
    when the offer has no G.711."""
    chosen: tuple[int, str] | None = None
    event: int | None = None
    for pt in offer.payload_types:
        codec = offer.codec(pt)
        if codec is None:
            continue
        name, rate = codec
        if chosen is None and name in G711_FORMATS and rate == 8000:
            chosen = (pt, G711_FORMATS[name])
        elif name == "TELEPHONE-EVENT" and rate == 8000 and event is None:
            event = pt
    if chosen is None:
        return Rejection(488, "Not Acceptable Here")
    return Negotiated(
        payload_type=chosen[0],
        format=chosen[1],
        telephone_event=event,
        remote=(offer.address, offer.port),
        direction=ANSWER_DIRECTION[offer.direction],
    )


def build_answer(
    negotiated: Negotiated, host: str, port: int, session_id: int | None = None, version: int = 0
) -> str:
    """Our SDP answer: our address and RTP port, the chosen codec, ptime 20."""
    ip = "IP6" if ":" in host else "IP4"
    sid = session_id if session_id is not None else int(time.time())
    pts = [negotiated.payload_type]
    name = "PCMU" if negotiated.format == PCMU else "PCMA"
    attributes = [f"a=rtpmap:{negotiated.payload_type} {name}/8000"]
    if negotiated.telephone_event is not None:
        pts.append(negotiated.telephone_event)
        attributes += [
            f"a=rtpmap:{negotiated.telephone_event} telephone-event/8000",
            f"a=fmtp:{negotiated.telephone_event} 0-16",
        ]
    lines = [
        "v=0",
        f"o=parley {sid} {sid + version} IN {ip} {host}",
        "s=parley",
        f"c=IN {ip} {host}",
        "t=0 0",
        f"m=audio {port} RTP/AVP {' '.join(str(pt) for pt in pts)}",
        *attributes,
        f"a=ptime:{PTIME_MS}",
        f"a={negotiated.direction}",
    ]
    return "\r\n".join(lines) + "\r\n"
