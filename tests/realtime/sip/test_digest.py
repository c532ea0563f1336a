"""Digest auth (RFC 2617, MD5, qop=auth) checked against a response computed by hand."""

from __future__ import annotations

import hashlib

from realtime.transports.sip.digest import DigestAuth, parse_credentials


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def credentials(auth: DigestAuth, password: str, nonce: str, qop: bool = True) -> str:
    ha1 = md5(f"alice:{auth.realm}:{password}")
    ha2 = md5("INVITE:sip:parley@127.0.0.1")
    if qop:
        response = md5(f"{ha1}:{nonce}:00000001:c0ffee:auth:{ha2}")
        tail = ', qop=auth, nc=00000001, cnonce="c0ffee"'
    else:
        response, tail = md5(f"{ha1}:{nonce}:{ha2}"), ""
    return (
        f'Digest username="alice", realm="{auth.realm}", nonce="{nonce}", '
        f'uri="sip:parley@127.0.0.1", response="{response}", algorithm=MD5{tail}'
    )


def test_challenge_and_check() -> None:
    auth = DigestAuth("alice", "s3cret")
    nonce = parse_credentials(auth.challenge())["nonce"]
    assert auth.check("INVITE", credentials(auth, "s3cret", nonce)) == "ok"
    assert auth.check("INVITE", credentials(auth, "s3cret", nonce, qop=False)) == "ok"
    assert auth.check("INVITE", credentials(auth, "wrong", nonce)) == "denied"
    assert auth.check("BYE", credentials(auth, "s3cret", nonce)) == "denied"
    assert auth.check("INVITE", None) == "denied"
    assert auth.check("INVITE", "Basic YWxpY2U6czNjcmV0") == "denied"


def test_forged_and_stale_nonces() -> None:
    auth = DigestAuth("alice", "s3cret")
    assert auth.check("INVITE", credentials(auth, "s3cret", "123.456")) == "denied"
    old = "1000.000"
    stale_nonce = f"{old}.{auth._sign(old)}"
    assert auth.check("INVITE", credentials(auth, "s3cret", stale_nonce)) == "stale"
    other = DigestAuth("alice", "s3cret")  # another server's nonce is not ours
    nonce = parse_credentials(other.challenge())["nonce"]
    assert auth.check("INVITE", credentials(auth, "s3cret", nonce)) == "denied"
