"""Checks on an SDP offer before any peer connection exists.

A bad offer must be refused fast (a 400 within milliseconds) and cost nothing: these checks
read the text only, so a peer connection is created just for offers that can work.

They also keep out what aiortc 1.x accepts but cannot handle. Its parser takes any number
of m-sections; its answer then goes wrong in ways that are not errors of the offer's
syntax: two m-sections with one mid, or a BUNDLE group naming a mid that no m-section has,
leave transceivers or transports unset, so `setLocalDescription` raises an AttributeError
and `close()` raises too, halfway, leaving sockets open and later closes waiting forever;
an m-section without its own or a session-level fingerprint fails an assertion inside
aiortc's background connect task ("Task exception was never retrieved"). Parley takes one
microphone, at most one camera and one data channel, so an offer with more of a kind is
refused here too (two inbound audio tracks would interleave in one input buffer).
Whatever aiortc still raises for an offer that passes is a 400 as well
(`realtime.transports.webrtc.registry`); these checks make that rare and its message clear.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

MAX_OFFER_BYTES = 64 * 1024
MAX_LINE_CHARS = 4096
"""Far above any real line (a sha-512 fingerprint is ~200 characters)."""
MAX_CANDIDATES = 64
AUDIO_CODECS = ("opus", "pcmu", "pcma")
KINDS = ("audio", "video", "application")
FINGERPRINT_ALGORITHMS = ("sha-256", "sha-384", "sha-512")
"""The ones aiortc verifies; an offer with only others could never connect."""
SETUP_ROLES = ("actpass", "active", "passive")

_M_LINE = re.compile(r"m=([a-z]+) ([0-9]{1,5})(?:/[0-9]+)? ([A-Za-z/]+)( [^ ]+)+")
_MID = re.compile(r"[A-Za-z0-9_.~+-]{1,64}")
_FINGERPRINT = re.compile(r"([A-Za-z0-9-]+) ([0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2})*)")
_ICE_CHARS = re.compile(r"[A-Za-z0-9+/]+")
_CANDIDATE = re.compile(
    r"a=candidate:\S{1,32} ([0-9]{1,10}) (udp|tcp) ([0-9]{1,10}) (\S{1,253}) ([0-9]{1,10})"
    r" typ (host|srflx|prflx|relay)((?: \S+ \S+)*)",
    re.IGNORECASE,
)


class OfferError(ValueError):
    """The offer cannot be answered; the message says why, for the developer."""


class OfferTooLarge(OfferError):
    """Over MAX_OFFER_BYTES (HTTP 413)."""


@dataclass
class _Section:
    kind: str
    m_line: str
    lines: list[str] = field(default_factory=list)

    def values(self, name: str) -> list[str]:
        prefix = f"a={name}"
        return [
            line[len(prefix) + 1 :] if line[len(prefix) :].startswith(":") else ""
            for line in self.lines
            if line == prefix or line.startswith(prefix + ":")
        ]


def check_offer(body: bytes) -> str:
    """The offer as text, or OfferError."""
    if not body:
        raise OfferError("the request body is empty: send the SDP offer")
    if len(body) > MAX_OFFER_BYTES:
        raise OfferTooLarge(f"the offer is {len(body)} bytes; the limit is {MAX_OFFER_BYTES}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise OfferError("the offer is not UTF-8 text") from None
    lines = [line.strip() for line in text.replace("\r\n", "\n").split("\n") if line.strip()]
    if not lines or lines[0] != "v=0" or not any(line.startswith("o=") for line in lines):
        raise OfferError("the body is not an SDP offer (it must start with v=0)")
    session, sections = _split(lines)
    audio = [s for s in sections if s.kind == "audio"]
    if not audio:
        raise OfferError("the offer has no audio m-line: Parley needs a microphone track")
    if not any(line.startswith("a=fingerprint:") for line in lines):
        if any(line.startswith("a=crypto:") for line in lines):
            raise OfferError("SDES-only crypto (a=crypto) is not supported: use DTLS-SRTP")
        raise OfferError("the offer has no DTLS fingerprint (a=fingerprint)")
    codecs = {
        m.group(1).lower()
        for section in audio
        for line in section.lines
        if (m := re.match(r"a=rtpmap:\d+ ([A-Za-z0-9-]+)/", line))
    }
    if not codecs & set(AUDIO_CODECS):
        offered = ", ".join(sorted(codecs)) or "none"
        raise OfferError(
            f"no audio codec in common (offered: {offered}; Parley speaks Opus, PCMU, PCMA)"
        )
    _check_lines(lines)
    _check_sections(sections)
    _check_bundle(session, sections)
    for section in sections:
        _check_transport(session, section)
    return text


def _split(lines: list[str]) -> tuple[_Section, list[_Section]]:
    """(the session part as a pseudo-section, the m-sections)"""
    session = _Section("session", "")
    sections: list[_Section] = []
    for line in lines:
        if line.startswith("m="):
            sections.append(_Section(line[2:].split(" ", 1)[0], line))
        else:
            (sections[-1] if sections else session).lines.append(line)
    return session, sections


def _check_lines(lines: list[str]) -> None:
    for number, line in enumerate(lines, start=1):
        if len(line) > MAX_LINE_CHARS:
            raise OfferError(
                f"line {number} ({line[:20]}...) is {len(line)} characters; "
                f"the limit is {MAX_LINE_CHARS}"
            )
        if any(ord(c) < 0x20 and c != "\t" for c in line):
            raise OfferError(f"line {number} ({line[:20]!r}...) has control characters")
    candidates = [line for line in lines if line.startswith("a=candidate:")]
    if len(candidates) > MAX_CANDIDATES:
        raise OfferError(
            f"the offer has {len(candidates)} ICE candidates; the limit is {MAX_CANDIDATES}"
        )
    for line in candidates:
        _check_candidate(line)


def _check_candidate(line: str) -> None:
    """aiortc parses candidates loosely; a port past 65535 reached the socket's sendto()
    as an OverflowError that closed the call's ICE socket."""
    m = _CANDIDATE.fullmatch(line)
    if m is None:
        raise OfferError(f"malformed ICE candidate: {line[:80]}")
    component, transport, priority, address, port, _kind, extra = m.groups()
    low_port = 1 if transport.lower() == "udp" else 0
    if not (1 <= int(component) <= 256 and int(priority) < 2**32):
        raise OfferError(f"ICE candidate with a bad component or priority: {line[:80]}")
    if not low_port <= int(port) <= 65535:
        raise OfferError(f"ICE candidate with port {port}: {line[:80]}")
    if not address.lower().endswith(".local"):
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise OfferError(
                f"ICE candidate address {address[:40]!r} is neither an IP address nor an "
                "mDNS .local name"
            ) from None
    fields = extra.split()
    for name, value in zip(fields[::2], fields[1::2], strict=True):
        if name == "rport" and not (value.isdigit() and int(value) <= 65535):
            raise OfferError(f"ICE candidate with rport {value[:10]}: {line[:80]}")


def _check_sections(sections: list[_Section]) -> None:
    mids: set[str] = set()
    for index, section in enumerate(sections):
        where = f"m-section {index} ({section.m_line[:40]})"
        if not _M_LINE.fullmatch(section.m_line):
            raise OfferError(f"{where}: the m-line is malformed")
        if section.kind not in KINDS:
            raise OfferError(
                f"{where}: m={section.kind} is not supported (Parley answers audio, video "
                "and the data channel)"
            )
        section_mids = section.values("mid")
        if len(section_mids) != 1 or not _MID.fullmatch(section_mids[0]):
            raise OfferError(f"{where}: each m-section needs exactly one a=mid token")
        if section_mids[0] in mids:
            raise OfferError(f"{where}: mid {section_mids[0]!r} is used twice")
        mids.add(section_mids[0])
    for kind in KINDS:
        count = sum(1 for s in sections if s.kind == kind)
        if count > 1:
            what = {"audio": "microphone", "video": "camera", "application": "data channel"}
            raise OfferError(
                f"the offer has {count} {kind} m-sections; Parley takes one {what[kind]}"
            )


def _check_bundle(session: _Section, sections: list[_Section]) -> None:
    mids = {s.values("mid")[0] for s in sections}
    for group in session.values("group"):
        semantic, *items = group.split()
        if semantic != "BUNDLE":
            continue
        missing = [item for item in items if item not in mids]
        if missing:
            raise OfferError(f"a=group:BUNDLE names mid {missing[0]!r}, which no m-section has")


def _check_transport(session: _Section, section: _Section) -> None:
    """What aiortc needs of every m-section, given here or at the session level."""
    where = f"m-section {section.values('mid')[0]!r}"
    fingerprints = section.values("fingerprint") + session.values("fingerprint")
    parsed = [m for f in fingerprints if (m := _FINGERPRINT.fullmatch(f))]
    if len(parsed) != len(fingerprints):
        raise OfferError(f"{where}: a=fingerprint must be '<algorithm> <hex>:<hex>:...'")
    if not any(m.group(1).lower() in FINGERPRINT_ALGORITHMS for m in parsed):
        raise OfferError(f"{where}: no DTLS fingerprint with {', '.join(FINGERPRINT_ALGORITHMS)}")
    for name, low in (("ice-ufrag", 4), ("ice-pwd", 22)):
        values = section.values(name) or session.values(name)
        if len(values) < 1 or not (low <= len(values[0]) <= 256):
            raise OfferError(f"{where}: a={name} is missing or not {low} to 256 characters")
        if not _ICE_CHARS.fullmatch(values[0]):
            raise OfferError(f"{where}: a={name} has characters ICE does not allow")
    for role in section.values("setup") or session.values("setup"):
        if role not in SETUP_ROLES:
            raise OfferError(f"{where}: a=setup:{role} is not one of {', '.join(SETUP_ROLES)}")
    if section.kind != "application" and "a=rtcp-mux" not in section.lines:
        raise OfferError(f"{where}: RTP and RTCP must share a port (a=rtcp-mux)")
