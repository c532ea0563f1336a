"""SDP offer/answer for a SIP call's audio: codec choice, telephone-event, hold, 488."""

from __future__ import annotations

import pytest

from realtime.g711 import PCMA, PCMU
from realtime.transports.sip.handler import Rejection
from realtime.transports.sip.sdp_audio import (
    Negotiated,
    SdpError,
    build_answer,
    negotiate,
    parse_offer,
)


def offer(media: str, *attributes: str, address: str = "192.0.2.10") -> str:
    lines = [
        "v=0",
        f"o=caller 1 1 IN IP4 {address}",
        "s=-",
        f"c=IN IP4 {address}",
        "t=0 0",
        f"m=audio 40000 RTP/AVP {media}",
        *attributes,
    ]
    return "\r\n".join(lines) + "\r\n"


def agreed(sdp: str) -> Negotiated:
    result = negotiate(parse_offer(sdp))
    assert isinstance(result, Negotiated)
    return result


def test_pcmu_first_in_the_offerers_order() -> None:
    media = agreed(offer("0 8 101", "a=rtpmap:101 telephone-event/8000", "a=fmtp:101 0-15"))
    assert (media.payload_type, media.format) == (0, PCMU)
    assert media.telephone_event == 101
    assert media.remote == ("192.0.2.10", 40000)
    assert media.direction == "sendrecv"


def test_pcma_when_offered_first_or_alone() -> None:
    assert agreed(offer("8 0")).format == PCMA
    only = agreed(offer("8"))
    assert (only.payload_type, only.format, only.telephone_event) == (8, PCMA, None)


def test_unknown_codecs_are_skipped() -> None:
    sdp = offer("9 96 8", "a=rtpmap:9 G722/8000", "a=rtpmap:96 opus/48000/2")
    assert agreed(sdp).format == PCMA


def test_a_dynamic_payload_type_named_pcmu_is_used() -> None:
    media = agreed(offer("98", "a=rtpmap:98 PCMU/8000"))
    assert (media.payload_type, media.format) == (98, PCMU)


def test_no_common_codec_is_a_488() -> None:
    result = negotiate(parse_offer(offer("9 96", "a=rtpmap:96 opus/48000/2")))
    assert result == Rejection(488, "Not Acceptable Here")


def test_telephone_event_at_another_rate_is_not_kept() -> None:
    media = agreed(offer("0 101", "a=rtpmap:101 telephone-event/48000"))
    assert media.telephone_event is None


@pytest.mark.parametrize(
    ("theirs", "ours"),
    [
        ("sendrecv", "sendrecv"),
        ("sendonly", "recvonly"),
        ("recvonly", "sendonly"),
        ("inactive", "inactive"),
    ],
)
def test_direction_is_mirrored(theirs: str, ours: str) -> None:
    media = agreed(offer("0", f"a={theirs}"))
    assert media.direction == ours
    assert f"a={ours}" in build_answer(media, "127.0.0.1", 30000).splitlines()


def test_session_level_direction_and_media_level_address() -> None:
    sdp = offer("0").replace("t=0 0", "t=0 0\r\na=sendonly") + "c=IN IP4 198.51.100.7\r\n"
    media = agreed(sdp)
    assert media.direction == "recvonly"  # hold
    assert media.remote == ("198.51.100.7", 40000)


def test_answer_lines() -> None:
    media = agreed(offer("0 101", "a=rtpmap:101 telephone-event/8000", "a=ptime:30"))
    lines = build_answer(media, "127.0.0.1", 30000, session_id=7, version=2).splitlines()
    assert "o=parley 7 9 IN IP4 127.0.0.1" in lines
    assert "c=IN IP4 127.0.0.1" in lines
    assert "m=audio 30000 RTP/AVP 0 101" in lines
    assert "a=rtpmap:0 PCMU/8000" in lines
    assert "a=rtpmap:101 telephone-event/8000" in lines
    assert "a=ptime:20" in lines
    assert lines[0] == "v=0"


@pytest.mark.parametrize(
    "sdp",
    [
        "",
        "v=0\r\nm=video 4000 RTP/AVP 96\r\nc=IN IP4 1.2.3.4\r\n",
        offer("0").replace("c=IN IP4 192.0.2.10\r\n", ""),
        offer("0").replace("RTP/AVP", "RTP/SAVP"),
        offer("x y"),
        offer("0", "a=rtpmap:zz PCMU/8000"),
        offer("0").replace("c=IN IP4 192.0.2.10", "c=IN IP4"),
        offer("0").replace("40000", "99999"),
    ],
)
def test_bad_offers(sdp: str) -> None:
    with pytest.raises(SdpError):
        parse_offer(sdp)
