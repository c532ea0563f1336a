"""SIP messages (RFC 3261 §7, §20): strict parsing and serialising of the subset a UAS needs.

Strict because the SIP port faces the internet: every limit is checked before anything is
stored, and a malformed message raises `MalformedMessage` carrying whatever headers were read,
so the server can still address a 400 when a Via made it through. Header names are kept in
their canonical long form (compact forms such as i/f/t/v/m/l/c/k/o expanded); a
comma-separated Via is split into one entry per hop, as §7.3.1 allows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_MESSAGE_BYTES = 65_535
"""A whole message (a UDP datagram cannot be larger; TCP messages are held to the same)."""
MAX_HEADER_SECTION_BYTES = 16_384
MAX_HEADER_LINE_BYTES = 4_096
MAX_HEADERS = 100

COMPACT = {
    "i": "Call-ID",
    "f": "From",
    "t": "To",
    "v": "Via",
    "m": "Contact",
    "l": "Content-Length",
    "c": "Content-Type",
    "k": "Supported",
    "s": "Subject",
    "e": "Content-Encoding",
    "o": "Event",
    "r": "Refer-To",
    "b": "Referred-By",
}
CANONICAL = {
    name.lower(): name
    for name in [
        "Via",
        "From",
        "To",
        "Call-ID",
        "CSeq",
        "Max-Forwards",
        "Contact",
        "Content-Length",
        "Content-Type",
        "Supported",
        "Allow",
        "Accept",
        "Authorization",
        "WWW-Authenticate",
        "Record-Route",
        "Route",
        "User-Agent",
        "Server",
        "Retry-After",
        "Subject",
        "Content-Encoding",
        "Require",
        "Unsupported",
        "Expires",
        "Reason",
        "Warning",
        "Event",
        "Subscription-State",
        "Refer-To",
        "Referred-By",
    ]
}
MANDATORY = ("Via", "From", "To", "Call-ID", "CSeq", "Max-Forwards")
_TOKEN = re.compile(r"^[A-Za-z0-9\-.!%*_+`'~]+$")
_REQUEST_LINE = re.compile(r"^([A-Za-z0-9\-.!%*_+`'~]+) (\S+) SIP/2\.0$")
_STATUS_LINE = re.compile(r"^SIP/2\.0 ([1-6][0-9][0-9]) ([^\r\n]*)$")
_CSEQ = re.compile(r"^([0-9]{1,10})\s+([A-Za-z0-9\-.!%*_+`'~]+)$")


class MalformedMessage(ValueError):
    """Why a message was refused, with the headers read before it failed (for a 400)."""

    def __init__(self, reason: str, headers: list[tuple[str, str]] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.headers = headers or []


@dataclass(slots=True)
class Message:
    """A request (`method` set) or a response (`status` set)."""

    method: str = ""
    uri: str = ""
    status: int = 0
    reason: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    @property
    def is_request(self) -> bool:
        return bool(self.method)

    def get(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def get_all(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key == name]

    def header(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    @property
    def cseq(self) -> tuple[int, str]:
        number, method = self.header("CSeq").split()
        return int(number), method

    def serialise(self) -> bytes:
        if self.is_request:
            lines = [f"{self.method} {self.uri} SIP/2.0"]
        else:
            lines = [f"SIP/2.0 {self.status} {self.reason}"]
        lines += [f"{k}: {v}" for k, v in self.headers if k != "Content-Length"]
        lines.append(f"Content-Length: {len(self.body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + self.body


def header_param(value: str, name: str) -> str | None:
    """A `;name=value` parameter of a header value (outside <...>), or "" for a flag."""
    outside = value.rsplit(">", 1)[-1] if "<" in value else value
    for part in outside.split(";")[1:]:
        key, _, param = part.strip().partition("=")
        if key.strip().lower() == name:
            return param.strip().strip('"')
    return None


def split_commas(value: str) -> list[str]:
    """Split a header value on commas outside quotes and <...> (multi-value headers)."""
    parts: list[str] = []
    current: list[str] = []
    quoted = angled = False
    for ch in value:
        if ch == '"':
            quoted = not quoted
        elif ch == "<" and not quoted:
            angled = True
        elif ch == ">" and not quoted:
            angled = False
        if ch == "," and not quoted and not angled:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    parts.append("".join(current).strip())
    return [p for p in parts if p]


def _headers(section: str) -> list[tuple[str, str]]:
    headers: list[tuple[str, str]] = []
    for line in section.split("\r\n"):
        if len(line) > MAX_HEADER_LINE_BYTES:
            raise MalformedMessage("header line too long", headers)
        if line[:1] in (" ", "\t"):  # folded continuation (§7.3.1)
            if not headers:
                raise MalformedMessage("continuation without a header", headers)
            name, value = headers[-1]
            headers[-1] = (name, f"{value} {line.strip()}")
            continue
        name, colon, value = line.partition(":")
        name = name.strip()
        if not colon or not _TOKEN.match(name):
            raise MalformedMessage("bad header line", headers)
        lower = name.lower()
        name = COMPACT.get(lower) or CANONICAL.get(lower) or name
        value = value.strip()
        if name == "Via":
            headers += [("Via", v) for v in split_commas(value)]
        else:
            headers.append((name, value))
        if len(headers) > MAX_HEADERS:
            raise MalformedMessage("too many headers", headers)
    return headers


def parse(data: bytes, *, stream: bool = False) -> Message:
    """Parse one whole message; `stream` (TCP) requires a Content-Length."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise MalformedMessage("message too large")
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        raise MalformedMessage("no end of headers")
    if len(head) > MAX_HEADER_SECTION_BYTES:
        raise MalformedMessage("header section too large")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as error:
        raise MalformedMessage("headers not UTF-8") from error
    start, _, section = text.partition("\r\n")
    headers = _headers(section) if section else []
    message = Message(headers=headers)
    if match := _REQUEST_LINE.match(start):
        message.method, message.uri = match.group(1).upper(), match.group(2)
    elif match := _STATUS_LINE.match(start):
        message.status, message.reason = int(match.group(1)), match.group(2)
    else:
        raise MalformedMessage("bad start line", headers)
    _check(message, body, stream)
    return message


def _check(message: Message, body: bytes, stream: bool) -> None:
    headers = message.headers
    for name in MANDATORY if message.is_request else MANDATORY[:5]:
        if message.get(name) is None:
            raise MalformedMessage(f"missing {name}", headers)
    for name in ("From", "To", "Call-ID", "CSeq", "Max-Forwards", "Content-Length"):
        if len(message.get_all(name)) > 1:
            raise MalformedMessage(f"more than one {name}", headers)
    cseq = _CSEQ.match(message.header("CSeq"))
    if not cseq or int(cseq.group(1)) >= 2**31:
        raise MalformedMessage("bad CSeq", headers)
    if message.is_request and cseq.group(2).upper() != message.method:
        raise MalformedMessage("CSeq method does not match", headers)
    forwards = message.get("Max-Forwards")
    if forwards is not None and not (forwards.isdigit() and int(forwards) <= 255):
        raise MalformedMessage("bad Max-Forwards", headers)
    if not message.header("Call-ID"):
        raise MalformedMessage("empty Call-ID", headers)
    for via in message.get_all("Via"):
        if not via.upper().startswith("SIP/2.0/"):
            raise MalformedMessage("bad Via", headers)
    declared = message.get("Content-Length")
    if declared is None:
        if stream:
            raise MalformedMessage("no Content-Length on a stream", headers)
        message.body = body
        return
    if not declared.isdigit():
        raise MalformedMessage("bad Content-Length", headers)
    length = int(declared)
    if length > len(body) or (stream and length != len(body)):
        raise MalformedMessage("body shorter than Content-Length", headers)
    message.body = body[:length]  # §18.3: extra datagram bytes are discarded


def frame(buffer: bytearray) -> bytes | None:
    """Take one whole message off a TCP stream buffer (Content-Length framing), or None if
    incomplete. Keep-alive CRLFs (RFC 5626) are skipped; raises MalformedMessage when the
    stream cannot be framed (then the connection must close)."""
    while buffer[:2] == b"\r\n":
        del buffer[:2]
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > MAX_HEADER_SECTION_BYTES:
            raise MalformedMessage("header section too large")
        return None
    if end > MAX_HEADER_SECTION_BYTES:
        raise MalformedMessage("header section too large")
    match = re.search(
        rb"\r\n(?:content-length|l)[ \t]*:[ \t]*([0-9]+)[ \t]*(?=\r\n)",
        bytes(buffer[: end + 2]),
        re.IGNORECASE,
    )
    if not match:
        raise MalformedMessage("no Content-Length on a stream")
    total = end + 4 + int(match.group(1))
    if total > MAX_MESSAGE_BYTES:
        raise MalformedMessage("message too large")
    if len(buffer) < total:
        return None
    data = bytes(buffer[:total])
    del buffer[:total]
    return data


def reply(
    request: Message,
    status: int,
    reason: str,
    *,
    to_tag: str | None = None,
    headers: tuple[tuple[str, str], ...] = (),
    body: bytes = b"",
) -> Message:
    """A response to `request` (§8.2.6): its Vias, From, To (with our tag), Call-ID, CSeq."""
    copied = [("Via", via) for via in request.get_all("Via")]
    for name in ("From", "To", "Call-ID", "CSeq"):
        value = request.get(name)
        if value is None:
            continue
        if name == "To" and to_tag and header_param(value, "tag") is None:
            value = f"{value};tag={to_tag}"
        copied.append((name, value))
    return Message(status=status, reason=reason, headers=copied + list(headers), body=body)
