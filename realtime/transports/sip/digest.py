"""Digest authentication for the SIP port (RFC 2617 / RFC 7616, MD5, qop=auth).

MD5 because it is what SIP phones, trunks and sipp speak. Nonces are stateless: a timestamp
signed with a per-server secret, so a challenge costs no memory and a replayed old nonce is
refused once it is older than `NONCE_TTL_S` (the client is then told `stale=true`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

from .message import split_commas

NONCE_TTL_S = 300.0


def _md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


def parse_credentials(value: str) -> dict[str, str]:
    """The parameters of `Digest k=v, k="v"`; empty when it is not a Digest header."""
    scheme, _, rest = value.strip().partition(" ")
    if scheme.lower() != "digest":
        return {}
    params: dict[str, str] = {}
    for part in split_commas(rest):
        key, eq, val = part.partition("=")
        if eq:
            params[key.strip().lower()] = val.strip().strip('"')
    return params


class DigestAuth:
    def __init__(self, user: str, password: str, realm: str = "parley") -> None:
        self.user = user
        self.realm = realm
        self._ha1 = _md5(f"{user}:{realm}:{password}")
        self._secret = secrets.token_bytes(32)

    def _sign(self, stamp: str) -> str:
        return hmac.new(self._secret, stamp.encode(), hashlib.sha256).hexdigest()[:32]

    def nonce(self) -> str:
        stamp = f"{time.time():.3f}"
        return f"{stamp}.{self._sign(stamp)}"

    def challenge(self, stale: bool = False) -> str:
        """The WWW-Authenticate value of a 401."""
        extra = ", stale=true" if stale else ""
        return (
            f'Digest realm="{self.realm}", nonce="{self.nonce()}", algorithm=MD5, qop="auth"{extra}'
        )

    def _fresh(self, nonce: str) -> bool | None:
        """True if valid and fresh, False if valid but old, None if forged."""
        stamp, _, signature = nonce.rpartition(".")
        if not stamp or not hmac.compare_digest(self._sign(stamp), signature):
            return None
        try:
            age = time.time() - float(stamp)
        except ValueError:
            return None
        return -5.0 <= age <= NONCE_TTL_S

    def check(self, method: str, authorization: str | None) -> str:
        """'ok', 'stale' (challenge again with stale=true) or 'denied'."""
        if not authorization:
            return "denied"
        p = parse_credentials(authorization)
        if p.get("username") != self.user or p.get("realm") != self.realm:
            return "denied"
        if p.get("algorithm", "MD5").upper() != "MD5" or "uri" not in p:
            return "denied"
        fresh = self._fresh(p.get("nonce", ""))
        if fresh is None:
            return "denied"
        ha2 = _md5(f"{method}:{p['uri']}")
        qop = p.get("qop")
        if qop == "auth":
            expected = _md5(
                f"{self._ha1}:{p['nonce']}:{p.get('nc', '')}:{p.get('cnonce', '')}:auth:{ha2}"
            )
        elif qop is None:
            expected = _md5(f"{self._ha1}:{p['nonce']}:{ha2}")
        else:
            return "denied"
        if not hmac.compare_digest(expected, p.get("response", "")):
            return "denied"
        return "ok" if fresh else "stale"
