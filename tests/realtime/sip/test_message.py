"""SIP message parsing: compact forms, multi-value Via, strict limits, TCP framing."""

from __future__ import annotations

import pytest

from realtime.transports.sip.message import (
    MAX_HEADER_LINE_BYTES,
    MalformedMessage,
    frame,
    header_param,
    parse,
    reply,
)

INVITE = (
    "INVITE sip:parley@127.0.0.1 SIP/2.0\r\n"
    "v: SIP/2.0/UDP 10.0.0.1:5062;branch=z9hG4bK1, SIP/2.0/UDP 10.0.0.2;branch=z9hG4bK2\r\n"
    "Via: SIP/2.0/UDP 10.0.0.3;branch=z9hG4bK3\r\n"
    'f: "A, B" <sip:a@x>;tag=abc\r\n'
    "t: <sip:parley@127.0.0.1>\r\n"
    "i: call-1@x\r\n"
    "CSeq: 7 INVITE\r\n"
    "Max-Forwards: 70\r\n"
    "m: <sip:a@10.0.0.1:5062>\r\n"
    "Subject: folded\r\n  onto two lines\r\n"
    "c: application/sdp\r\n"
    "l: 4\r\n\r\nv=0\n"
)


def test_compact_forms_and_multi_value_via() -> None:
    message = parse(INVITE.encode())
    assert message.method == "INVITE" and message.uri == "sip:parley@127.0.0.1"
    assert len(message.get_all("Via")) == 3
    assert header_param(message.header("Via"), "branch") == "z9hG4bK1"
    assert header_param(message.header("From"), "tag") == "abc"
    assert message.header("Call-ID") == "call-1@x" and message.cseq == (7, "INVITE")
    assert message.header("Subject") == "folded onto two lines"
    assert message.body == b"v=0\n"


def test_a_reply_copies_the_transaction_headers_and_serialises() -> None:
    response = reply(parse(INVITE.encode()), 200, "OK", to_tag="xyz", body=b"sdp")
    again = parse(response.serialise())
    assert again.status == 200 and again.reason == "OK"
    assert [k for k, _ in again.headers] == ["Via"] * 3 + [
        "From",
        "To",
        "Call-ID",
        "CSeq",
        "Content-Length",
    ]
    assert header_param(again.header("To"), "tag") == "xyz" and again.body == b"sdp"


@pytest.mark.parametrize(
    "names", [("v", "Via"), ("f",), ("t",), ("i",), ("CSeq",), ("Max-Forwards",)]
)
def test_a_missing_mandatory_header_is_refused(names: tuple[str, ...]) -> None:
    lines = [line for line in INVITE.split("\r\n") if line.split(":")[0] not in names]
    with pytest.raises(MalformedMessage, match="missing"):
        parse("\r\n".join(lines).encode())


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        ("CSeq: 7 INVITE", "CSeq: x INVITE", "bad CSeq"),
        ("CSeq: 7 INVITE", "CSeq: 7 BYE", "does not match"),
        ("CSeq: 7 INVITE", "CSeq: 99999999999 INVITE", "bad CSeq"),
        ("Max-Forwards: 70", "Max-Forwards: -1", "Max-Forwards"),
        ("l: 4", "l: 40", "shorter"),
        ("l: 4", "l: four", "Content-Length"),
        ("INVITE sip:parley@127.0.0.1 SIP/2.0", "INVITE sip:parley@127.0.0.1 SIP/3.0", "start"),
        ("i: call-1@x", "i: call-1@x\r\nCall-ID: call-2", "more than one"),
        ("Max-Forwards: 70", "Max-Forwards 70", "bad header"),
        ("c: application/sdp", "X: " + "y" * MAX_HEADER_LINE_BYTES, "too long"),
    ],
)
def test_malformed_requests_are_refused(old: str, new: str, reason: str) -> None:
    with pytest.raises(MalformedMessage, match=reason) as caught:
        parse(INVITE.replace(old, new).encode())
    if reason != "start":
        assert any(k == "Via" for k, _ in caught.value.headers)  # a 400 can be addressed


def test_limits_and_garbage() -> None:
    too_many = INVITE.replace("Max-Forwards: 70\r\n", "Max-Forwards: 70\r\n" + "X: 1\r\n" * 120)
    for data in (
        too_many.encode(),
        b"\x00\xff" * 100,
        b"INVITE",
        INVITE.encode()[:60],
        b"x" * 70_000,
        INVITE.encode().replace(b"parley", b"\xff\xfe"),
    ):
        with pytest.raises(MalformedMessage):
            parse(data)


def test_udp_discards_bytes_after_the_body_and_tcp_requires_a_length() -> None:
    assert parse(INVITE.encode() + b"junk").body == b"v=0\n"
    with pytest.raises(MalformedMessage, match="Content-Length"):
        parse(INVITE.replace("l: 4\r\n", "").encode(), stream=True)


def test_framing_on_a_stream() -> None:
    buffer = bytearray(b"\r\n\r\n" + INVITE.encode() * 2 + INVITE.encode()[:30])
    assert frame(buffer) == INVITE.encode()
    assert frame(buffer) == INVITE.encode()
    assert frame(buffer) is None and len(buffer) == 30
    with pytest.raises(MalformedMessage):
        frame(bytearray(b"GARBAGE\r\n\r\n"))
    with pytest.raises(MalformedMessage):
        frame(bytearray(b"X" * 20_000))
