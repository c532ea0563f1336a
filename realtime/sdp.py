"""Checks on an SDP offer before any peer connection exists.

A bad offer must be refused fast (a 400 within milliseconds) and cost nothing: these checks
read the text only, so a peer connection is created just for offers that can work.
"""

from __future__ import annotations

import re

MAX_OFFER_BYTES = 64 * 1024
AUDIO_CODECS = ("opus", "pcmu", "pcma")


class OfferError(ValueError):
    """The offer cannot be answered; the message says why, for the developer."""


def check_offer(body: bytes) -> str:
    """The offer as text, or OfferError."""
    if not body:
        raise OfferError("the request body is empty: send the SDP offer")
    if len(body) > MAX_OFFER_BYTES:
        raise OfferError(f"the offer is {len(body)} bytes; the limit is {MAX_OFFER_BYTES}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise OfferError("the offer is not UTF-8 text") from None
    lines = [line.strip() for line in text.replace("\r\n", "\n").split("\n") if line.strip()]
    if not lines or lines[0] != "v=0" or not any(line.startswith("o=") for line in lines):
        raise OfferError("the body is not an SDP offer (it must start with v=0)")
    audio = _media_sections(lines, "audio")
    if not audio:
        raise OfferError("the offer has no audio m-line: Parley needs a microphone track")
    if not any(line.startswith("a=fingerprint:") for line in lines):
        if any(line.startswith("a=crypto:") for line in lines):
            raise OfferError("SDES-only crypto (a=crypto) is not supported: use DTLS-SRTP")
        raise OfferError("the offer has no DTLS fingerprint (a=fingerprint)")
    codecs = {
        m.group(1).lower()
        for section in audio
        for line in section
        if (m := re.match(r"a=rtpmap:\d+ ([A-Za-z0-9-]+)/", line))
    }
    if not codecs & set(AUDIO_CODECS):
        offered = ", ".join(sorted(codecs)) or "none"
        raise OfferError(
            f"no audio codec in common (offered: {offered}; Parley speaks Opus, PCMU, PCMA)"
        )
    return text


def _media_sections(lines: list[str], kind: str) -> list[list[str]]:
    sections: list[list[str]] = []
    current: list[str] | None = None
    for line in lines:
        if line.startswith("m="):
            current = [] if line.startswith(f"m={kind} ") else None
            if current is not None:
                sections.append(current)
        elif current is not None:
            current.append(line)
    return sections
