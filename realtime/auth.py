"""Who may start a call: the server's API key, or an ephemeral secret minted with it.

Ephemeral secrets are signed tokens, not stored records: `ek_<payload>.<signature>`, where
the payload holds the expiry and the session settings the call starts with. Any server
process that knows the signing key can check one, nothing is left in Redis, and a secret
cannot be altered to grant other settings. Expiry limits starting calls, not calls running.
Without an API key calls need no auth (the CLI then only listens on loopback), and secrets
are signed with a per-process random key.

The server may have several API keys (`--api-key k1,k2`), one per tenant, so that per-key
limits (sessions/key_limits.py) mean something. A grant names its *caller*, the id its
sessions count against: `key:<hash>` for an API key (never the key in clear), the same id
for a secret minted with that key (the payload carries it, and the key signs it), and none
for an open server, where the web layer counts by the client's address (`address_caller`).
"""

from __future__ import annotations

import base64
import dataclasses
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
    caller: str | None = None
    """Whom its sessions count against: the API key's id (a secret's: its minting key's);
    None for an open server, where the client's address counts instead."""


def key_caller(api_key: str) -> str:
    """The caller id of an API key: a hash, safe to keep in Redis and in logs."""
    return "key:" + hashlib.sha256(b"parley api key\0" + api_key.encode()).hexdigest()[:24]


def address_caller(host: str | None) -> str:
    """The caller id of a client with no key (an open server): its address."""
    return f"addr:{host or 'unknown'}"


def with_caller(grant: Grant, host: str | None) -> Grant:
    """`grant` with its caller named: its own, or (an open server) the client's address
    `host`, so that one place cannot take every session slot."""
    if grant.caller is not None:
        return grant
    return dataclasses.replace(grant, caller=address_caller(host))


def parse_keys(api_key: str | None) -> tuple[str, ...]:
    """`--api-key`: one key, or several separated by commas; empty: none."""
    return tuple(key.strip() for key in (api_key or "").split(",") if key.strip())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signing_key(seed: bytes) -> bytes:
    return hashlib.sha256(b"parley ephemeral secrets\0" + seed).digest()


class Authenticator:
    def __init__(self, api_key: str | None) -> None:
        """`api_key`: the server's key, or several separated by commas; None: open."""
        keys = parse_keys(api_key)
        self.api_key = keys[0] if keys else None
        """The first key: the one that signs secrets minted with no caller named."""
        self._keys = {key_caller(key): key for key in keys}
        self._signing_keys = {
            caller: _signing_key(key.encode()) for caller, key in self._keys.items()
        }
        self._open_signing_key = _signing_key(secrets.token_bytes(32))

    def mint(
        self, session: dict[str, Any], ttl_s: int = DEFAULT_TTL_S, caller: str | None = None
    ) -> tuple[str, int]:
        """A secret for starting calls with `session` settings, and its expiry (unix s).
        `caller`: the grant that mints it (`check_key`'s); its sessions count against it."""
        if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
            raise ValueError(
                f"expires_after.seconds must be between {MIN_TTL_S} and {MAX_TTL_S}, got {ttl_s}"
            )
        if caller is None and self.api_key is not None:
            caller = key_caller(self.api_key)
        expires_at = int(time.time()) + ttl_s
        body: dict[str, Any] = {"exp": expires_at, "session": session}
        if caller is not None:
            body["kid"] = caller
        payload = _b64(json.dumps(body).encode())
        return f"{PREFIX}{payload}.{self._sign(payload, caller)}", expires_at

    def _sign(self, payload: str, caller: str | None) -> str:
        if self._signing_keys:
            key = self._signing_keys.get(caller or "")
            if key is None:
                raise ValueError("secrets are minted with one of the server's API keys")
        else:
            key = self._open_signing_key
        return _b64(hmac.new(key, payload.encode(), hashlib.sha256).digest())

    def check(self, authorization: str | None) -> Grant:
        """The grant for an `Authorization` header value; AuthError if it gives none."""
        token = ""
        if authorization and authorization.lower().startswith("bearer "):
            token = authorization[7:].strip()
        if token.startswith(PREFIX):
            return self._check_secret(token)
        if not self._keys:
            return Grant("open")
        caller = key_caller(token) if token else ""
        key = self._keys.get(caller)
        if key is not None and hmac.compare_digest(token.encode(), key.encode()):
            return Grant("api_key", caller=caller)
        raise AuthError("missing or wrong API key: send Authorization: Bearer <key or secret>")

    def check_key(self, authorization: str | None) -> Grant:
        """Minting secrets needs an API key itself (or no key configured)."""
        grant = self.check(authorization)
        if grant.kind == "secret":
            raise AuthError("an ephemeral secret cannot mint more secrets; use the API key")
        return grant

    def _check_secret(self, token: str) -> Grant:
        payload, _, signature = token[len(PREFIX) :].partition(".")
        invalid = AuthError("this ephemeral secret is not valid on this server")
        try:
            body = json.loads(_unb64(payload))
        except (ValueError, json.JSONDecodeError):
            body = None
        kid = body.get("kid") if isinstance(body, dict) else None
        caller = kid if isinstance(kid, str) else None
        if caller is None and self.api_key is not None:  # minted before secrets named one
            caller = key_caller(self.api_key)
        try:
            expected = self._sign(payload, caller)
        except ValueError:  # minted with a key this server does not have
            raise invalid from None
        if not signature or not hmac.compare_digest(signature, expected):
            raise invalid
        if not isinstance(body, dict):
            raise AuthError("this ephemeral secret is malformed")
        if int(body.get("exp", 0)) < time.time():
            raise AuthError("this ephemeral secret has expired; ask for a new one")
        return Grant("secret", body.get("session") or {}, caller)
