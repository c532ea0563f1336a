"""Several API keys, each its own caller; secrets count against the key that minted them."""

from __future__ import annotations

import base64
import json

import pytest

from realtime.auth import (
    PREFIX,
    Authenticator,
    AuthError,
    Grant,
    address_caller,
    key_caller,
    with_caller,
)

KEY_A, KEY_B = "sk-tenant-a", "sk-tenant-b"


def test_each_key_is_its_own_caller_and_never_in_clear() -> None:
    auth = Authenticator(f" {KEY_A} , {KEY_B},")
    a = auth.check(f"Bearer {KEY_A}")
    b = auth.check(f"Bearer {KEY_B}")
    assert (a.kind, b.kind) == ("api_key", "api_key")
    assert a.caller == key_caller(KEY_A) != b.caller == key_caller(KEY_B)
    assert a.caller is not None and KEY_A not in a.caller
    with pytest.raises(AuthError, match="wrong API key"):
        auth.check(f"Bearer {KEY_A}x")
    with pytest.raises(AuthError):
        auth.check(None)


def test_a_secret_counts_against_the_key_that_minted_it() -> None:
    auth = Authenticator(f"{KEY_A},{KEY_B}")
    minter = auth.check_key(f"Bearer {KEY_B}")
    value, _ = auth.mint({"instructions": "Hi."}, 60, minter.caller)
    grant = auth.check(f"Bearer {value}")
    assert (grant.kind, grant.caller, grant.session) == (
        "secret",
        key_caller(KEY_B),
        {"instructions": "Hi."},
    )
    assert Authenticator(KEY_B).check(f"Bearer {value}").caller == key_caller(KEY_B)
    with pytest.raises(AuthError, match="not valid"):
        Authenticator(KEY_A).check(f"Bearer {value}")  # B's secret, and B is not here
    with pytest.raises(ValueError, match="one of the server's API keys"):
        auth.mint({}, 60, key_caller("sk-someone-else"))


def test_a_secret_cannot_be_moved_to_another_key() -> None:
    auth = Authenticator(f"{KEY_A},{KEY_B}")
    value, _ = auth.mint({}, 60, key_caller(KEY_A))
    payload, _, signature = value[len(PREFIX) :].partition(".")
    body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    body["kid"] = key_caller(KEY_B)
    moved = base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=").decode()
    with pytest.raises(AuthError, match="not valid"):
        auth.check(f"Bearer {PREFIX}{moved}.{signature}")


def test_a_secret_minted_before_secrets_named_a_key_counts_against_the_first() -> None:
    auth = Authenticator(KEY_A)
    value, _ = auth.mint({}, 60)  # no caller named: the first key's
    assert auth.check(f"Bearer {value}").caller == key_caller(KEY_A)


def test_an_open_server_counts_by_address() -> None:
    auth = Authenticator(None)
    assert auth.check(None) == Grant("open")
    value, _ = auth.mint({}, 60)
    secret = auth.check(f"Bearer {value}")
    assert secret.kind == "secret" and secret.caller is None
    assert with_caller(secret, "10.0.0.7").caller == address_caller("10.0.0.7")
    assert with_caller(Grant("api_key", caller="key:x"), "10.0.0.7").caller == "key:x"
    assert Authenticator(",").api_key is None  # a list of no keys is no key
