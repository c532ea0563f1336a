"""SDP offer fuzzing: a seeded mutator over real aiortc offers, and a soak command.

The mutations are what a careless client or a hostile one sends: truncations, deleted and
duplicated lines and m-sections, bad fingerprints, huge attributes, non-UTF-8 bytes, and
offers posted with the wrong Content-Type. The same seed gives the same offers, so a
failure found here or in CI (tests/realtime/test_sdp_fuzz.py) can be replayed.

    .venv/bin/python -m loadtest.sdp_fuzz --url http://127.0.0.1:8080 --count 20000 [--seed 1]

Every answer must come within 200 ms with 400, 413 or 415, or 201 for a mutation that is
still a valid offer (that call is hung up at once); never a 5xx. Afterwards `/readyz`
must count no session.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
from aiortc import RTCConfiguration, RTCPeerConnection

from .webrtc_client import Camera, Microphone

OK_STATUSES = frozenset({201, 400, 413, 415})
DEADLINE_S = 0.2
SDP = "application/sdp"


@dataclass(frozen=True, slots=True)
class Mutant:
    """One request: the body, its Content-Type (None: no header) and what was done."""

    body: bytes
    content_type: str | None
    mutation: str


async def real_offers() -> list[str]:
    """Offers as aiortc makes them: audio only, audio+video, each with the data channel,
    and audio without one."""
    offers = []
    for camera, channel in ((False, True), (True, True), (False, False)):
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        try:
            pc.addTrack(Microphone())
            if camera:
                pc.addTrack(Camera())
            if channel:
                pc.createDataChannel("oai-events")
            await pc.setLocalDescription(await pc.createOffer())
            offers.append(pc.localDescription.sdp)
        finally:
            await pc.close()
    return offers


# --- the mutations ------------------------------------------------------------------------
# Each takes the offer's lines (no line endings) and a Random, and returns the new lines.

Lines = list[str]


def _sections(lines: Lines) -> tuple[Lines, list[Lines]]:
    """(session part, m-sections)"""
    head: Lines = []
    sections: list[Lines] = []
    for line in lines:
        if line.startswith("m="):
            sections.append([line])
        elif sections:
            sections[-1].append(line)
        else:
            head.append(line)
    return head, sections


def _join(head: Lines, sections: list[Lines]) -> Lines:
    return head + [line for section in sections for line in section]


def delete_lines(lines: Lines, rng: random.Random) -> Lines:
    out = list(lines)
    for _ in range(rng.randint(1, 3)):
        if out:
            del out[rng.randrange(len(out))]
    return out


def duplicate_line(lines: Lines, rng: random.Random) -> Lines:
    out = list(lines)
    if not out:
        return out
    line = rng.choice(out)
    out.insert(rng.randrange(len(out) + 1), line)
    return out


def swap_lines(lines: Lines, rng: random.Random) -> Lines:
    out = list(lines)
    if not out:
        return out
    i, j = rng.randrange(len(out)), rng.randrange(len(out))
    out[i], out[j] = out[j], out[i]
    return out


def duplicate_section(lines: Lines, rng: random.Random) -> Lines:
    head, sections = _sections(lines)
    if not sections:
        return lines
    copy = list(rng.choice(sections))
    if rng.random() < 0.4:  # a fresh mid, so the copy is not a plain duplicate
        copy = [
            f"a=mid:{rng.choice(['9', 'x', '0', '1', 'audio'])}"
            if line.startswith("a=mid:")
            else line
            for line in copy
        ]
    sections.insert(rng.randrange(len(sections) + 1), copy)
    return _join(head, sections)


def delete_section(lines: Lines, rng: random.Random) -> Lines:
    head, sections = _sections(lines)
    if not sections:
        return lines
    del sections[rng.randrange(len(sections))]
    return _join(head, sections)


def many_sections(lines: Lines, rng: random.Random) -> Lines:
    head, sections = _sections(lines)
    if not sections:
        return lines
    audio = rng.choice(sections)
    extra = [
        [line if not line.startswith("a=mid:") else f"a=mid:extra{n}" for line in audio]
        for n in range(rng.randint(2, 40))
    ]
    return _join(head, sections + extra)


def _edit_attribute(lines: Lines, prefix: str, edit: Callable[[str], str]) -> Lines:
    return [edit(line) if line.startswith(prefix) else line for line in lines]


def bad_fingerprint(lines: Lines, rng: random.Random) -> Lines:
    choices: list[Callable[[str], str]] = [
        lambda line: "a=fingerprint:sha-256",
        lambda line: "a=fingerprint:sha-256 ZZ:" + "GG:" * 31,
        lambda line: "a=fingerprint:md5 00:11",
        lambda line: "a=fingerprint:" + "x" * rng.randint(1, 300),
        lambda line: line[: rng.randrange(len(line))],
        lambda line: "a=fingerprint:sha-256 " + "AB:" * rng.randint(0, 5000),
        lambda line: "a=fingerprint: ",
    ]
    return _edit_attribute(lines, "a=fingerprint:", rng.choice(choices))


def huge_attribute(lines: Lines, rng: random.Random) -> Lines:
    out = list(lines)
    size = rng.choice([1_000, 30_000, 60_000, 70_000, 200_000])
    name = rng.choice(["a=x-junk:", "a=ice-ufrag:", "a=candidate:", "a=ssrc:1 cname:", "a=mid:"])
    out.insert(rng.randrange(1, len(out) + 1), name + "A" * size)
    return out


def garbled_values(lines: Lines, rng: random.Random) -> Lines:
    """Fields aiortc parses as numbers, addresses or enums, given nonsense."""
    junk = rng.choice(["", "x", "-1", "99999999999999999999", "0", "🎤", "1 2 3", "::::"])
    edits: dict[str, Callable[[str], str]] = {
        "m=": lambda line: " ".join(
            junk if i == rng.randrange(4) else part for i, part in enumerate(line.split(" "))
        ),
        "a=rtpmap:": lambda line: f"a=rtpmap:{junk} opus/{junk}/2",
        "a=candidate:": lambda line: (
            "a=candidate:"
            + " ".join(junk if rng.random() < 0.3 else part for part in line[12:].split(" "))
        ),
        "a=setup:": lambda line: f"a=setup:{junk}",
        "a=ssrc:": lambda line: f"a=ssrc:{junk} cname:{junk}",
        "a=extmap:": lambda line: f"a=extmap:{junk} {junk}",
        "a=sctp-port:": lambda line: f"a=sctp-port:{junk}",
        "a=max-message-size:": lambda line: f"a=max-message-size:{junk}",
        "a=group:": lambda line: f"a=group:BUNDLE {junk}",
        "c=": lambda line: f"c=IN IP4 {junk}",
        "a=fmtp:": lambda line: f"a=fmtp:{junk} {junk}={junk}",
        "a=rtcp:": lambda line: f"a=rtcp:{junk}",
        "a=msid:": lambda line: f"a=msid:{junk}",
        "v=": lambda line: f"v={junk}",
        "a=mid:": lambda line: f"a=mid:{junk}",
    }
    prefix = rng.choice(list(edits))
    return _edit_attribute(lines, prefix, edits[prefix])


def bundle_mismatch(lines: Lines, rng: random.Random) -> Lines:
    choice = rng.randrange(3)
    if choice == 0:
        return _edit_attribute(lines, "a=group:BUNDLE", lambda line: line + " ghost")
    if choice == 1:
        return _edit_attribute(lines, "a=group:BUNDLE", lambda line: "a=group:BUNDLE ghost")
    return [line for line in lines if not line.startswith("a=mid:")]


def drop_required(lines: Lines, rng: random.Random) -> Lines:
    """Remove every line of one kind aiortc or Parley needs."""
    prefix = rng.choice(
        [
            "a=ice-ufrag:",
            "a=ice-pwd:",
            "a=rtcp-mux",
            "a=rtpmap:",
            "a=fingerprint:",
            "a=setup:",
            "a=candidate:",
            "o=",
            "a=sctp-port:",
            "c=",
        ]
    )
    return [line for line in lines if not line.startswith(prefix)]


MUTATIONS: dict[str, Callable[[Lines, random.Random], Lines]] = {
    "delete_lines": delete_lines,
    "duplicate_line": duplicate_line,
    "swap_lines": swap_lines,
    "duplicate_section": duplicate_section,
    "delete_section": delete_section,
    "many_sections": many_sections,
    "bad_fingerprint": bad_fingerprint,
    "huge_attribute": huge_attribute,
    "garbled_values": garbled_values,
    "bundle_mismatch": bundle_mismatch,
    "drop_required": drop_required,
}

WRONG_CONTENT_TYPES = (
    None,
    "",
    "text/plain",
    "application/x-www-form-urlencoded",
    "application/json",
    "application/octet-stream",
    "text/html; charset=utf-8",
    "sdp",
)


def _bytes_mutation(body: bytes, rng: random.Random) -> tuple[bytes, str]:
    choice = rng.randrange(4)
    if choice == 0:
        return body[: rng.randrange(len(body))], "truncate"
    if choice == 1:
        at = rng.randrange(len(body))
        return body[:at] + bytes([rng.choice([0xFF, 0xC3, 0x80, 0xFE])]) + body[at:], "non_utf8"
    if choice == 2:
        out = bytearray(body)
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] = rng.randrange(256)
        return bytes(out), "byte_flips"
    return body.replace(b"\r\n", b"\n"), "bare_newlines"


def mutants(offers: list[str], seed: int) -> Iterator[Mutant]:
    """An endless, reproducible stream of mutated requests built from `offers`."""
    rng = random.Random(seed)
    names = list(MUTATIONS)
    while True:
        offer = rng.choice(offers)
        lines = offer.rstrip("\r\n").split("\r\n")
        roll = rng.random()
        if roll < 0.06:
            body = offer.encode()
            if rng.random() < 0.5:  # wrong type on a broken body: the type is checked first
                body = body[: rng.randrange(len(body))]
            yield Mutant(body, rng.choice(WRONG_CONTENT_TYPES), "wrong_content_type")
            continue
        if roll < 0.26:
            body, name = _bytes_mutation(offer.encode(), rng)
        else:
            picked = rng.sample(names, rng.choice([1, 1, 1, 2]))
            for name in picked:
                lines = MUTATIONS[name](lines, rng) or [""]
            body, name = ("\r\n".join(lines) + "\r\n").encode(), "+".join(picked)
        content_type = SDP if rng.random() < 0.9 else "application/sdp; charset=utf-8"
        yield Mutant(body, content_type, name)


# --- the soak command ---------------------------------------------------------------------


def headers_for(mutant: Mutant, key: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if mutant.content_type is not None:
        headers["Content-Type"] = mutant.content_type
    return headers


async def soak(url: str, count: int, seed: int, key: str | None) -> int:
    offers = await real_offers()
    statuses: collections.Counter[int] = collections.Counter()
    failures: list[str] = []
    slowest = 0.0
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        stream = mutants(offers, seed)
        for index in range(count):
            mutant = next(stream)
            started = time.monotonic()
            try:
                response = await http.post(
                    "/v1/realtime/calls", content=mutant.body, headers=headers_for(mutant, key)
                )
            except httpx.HTTPError as exc:
                failures.append(f"#{index} {mutant.mutation}: {type(exc).__name__}")
                continue
            took = time.monotonic() - started
            slowest = max(slowest, took)
            statuses[response.status_code] += 1
            if response.status_code not in OK_STATUSES or took > DEADLINE_S:
                failures.append(f"#{index} {mutant.mutation}: {response.status_code} {took:.3f}s")
            if response.status_code == 201:
                call = response.headers["location"]
                await http.post(f"{call}/hangup", headers=headers_for(mutant, key))
        ready = (await http.get("/readyz")).json()
    print(f"{count} offers, seed {seed}: {dict(sorted(statuses.items()))}")
    print(f"slowest answer {slowest * 1000:.0f} ms; sessions open after: {ready.get('sessions')}")
    for line in failures[:20]:
        print("FAIL", line)
    return 1 if failures or ready.get("sessions") else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--key", default=None, help="the server's API key, if it has one")
    args = parser.parse_args(argv)
    return asyncio.run(soak(args.url, args.count, args.seed, args.key))


if __name__ == "__main__":
    sys.exit(main())
