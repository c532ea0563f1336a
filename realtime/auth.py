"""Who may start a call: the server's API key, or an ephemeral secret minted with it.

Ephemeral secrets are signed tokens, not stored records: `ek_<payload>.<signature>`, where
the payload holds the expiry and the session settings the call starts with. Any server
process that knows the signing key can check one, nothing is left in Redis, and a secret
cannot be altered to grant other settings. Expiry limits starting calls, not calls running.
Without an API key calls need no auth (the CLI then only listens on loopback), and secrets
are signed with a per-process random key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

PREFIX = "ek_"
MIN_TTL_S, MAX_TTL_S, DEFAULT_TTL_S = 10, 7200, 600


class AuthError(Exception):
    """401: the request carries no valid key or live secret."""


@dataclass(frozen=True, slots=True)
class Grant:
    kind: str
    """"api_key", "secret" or "open" (no key configured)."""
    session: dict[str, Any] | None = None
    """Settings a secret was minted with."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Authenticator:
    def __init__(self, api_key: str | None) -> None:
        self.api_key = api_key
        seed = api_key.encode() if api_key else secrets.token_bytes(32)
        self._signing_key = hashlib.sha256(b"parley ephemeral secrets\0" + seed).digest()

    def mint(self, session: dict[str, Any], ttl_s: int = DEFAULT_TTL_S) -> tuple[str, int]:
        """A secret for starting calls with `session` settings, and its expiry (unix s)."""
        if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
            raise ValueError(
                f"expires_after.seconds must be between {MIN_TTL_S} and {MAX_TTL_S}, got {ttl_s}"
            )
        expires_at = int(time.time()) + ttl_s
        payload = _b64(json.dumps({"exp": expires_at, "session": session}).encode())
        return f"{PREFIX}{payload}.{self._sign(payload)}", expires_at

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._signing_key, payload.encode(), hashlib.sha256).digest())

    def check(self, authorization: str | None) -> Grant:
        """The grant for an `Authorization` header value; AuthError if it gives none."""
        token = ""
        if authorization and authorization.lower().startswith("bearer "):
            token = authorization[7:].strip()
        if token.startswith(PREFIX):
            return self._check_secret(token)
        if self.api_key is None:
            return Grant("open")
        if token and hmac.compare_digest(token.encode(), self.api_key.encode()):
            return Grant("api_key")
        raise AuthError("missing or wrong API key: send Authorization: Bearer <key or secret>")

    def check_key(self, authorization: str | None) -> None:
        """Minting secrets needs the API key itself (or no key configured)."""
        grant = self.check(authorization)
        if grant.kind == "secret":
            raise AuthError("an ephemeral secret cannot mint more secrets; use the API key")

    def _check_secret(self, token: str) -> Grant:
        payload, _, signature = token[len(PREFIX) :].partition(".")
        if not signature or not hmac.compare_digest(signature, self._sign(payload)):
            raise AuthError("this ephemeral secret is not valid on this server")
        try:
            body = json.loads(_unb64(payload))
        except (ValueError, json.JSONDecodeError):
            raise AuthError("this ephemeral secret is malformed") from None
        if int(body.get("exp", 0)) < time.time():
            raise AuthError("this ephemeral secret has expired; ask for a new one")
        return Grant("secret", body.get("session") or {})
