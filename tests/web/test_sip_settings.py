"""`parley serve`'s SIP options: checked at start-up, with a message naming the option."""

from __future__ import annotations

import pytest

from web.settings import Settings, SettingsError, parse_settings


def serve(*args: str) -> Settings:
    return parse_settings(["serve", *args])[1]


def test_sip_is_off_unless_a_port_is_given() -> None:
    assert serve().sip_port is None


def test_the_sip_options_are_read() -> None:
    settings = serve(
        *[
            "--sip-port",
            "5060",
            "--sip-auth",
            "alice:secret",
            "--sip-allow",
            "127.0.0.0/8,10.0.0.0/8",
            "--sip-webhook",
            "http://127.0.0.1:9000/hook",
            "--sip-webhook-secret",
            "whsec_abc",
        ]
    )
    assert settings.sip_port == 5060 and settings.sip_auth == ("alice", "secret")
    assert settings.sip_allow == "127.0.0.0/8,10.0.0.0/8"
    assert settings.sip_webhook == "http://127.0.0.1:9000/hook"
    assert settings.sip_api == "realtime"


def test_a_deployment_takes_gpt_live_sip_calls() -> None:
    webhook = ["--sip-webhook", "http://127.0.0.1:9000/hook", "--sip-webhook-secret", "whsec_a"]
    settings = serve("--sip-port", "5060", *webhook, "--sip-api", "live")
    assert settings.sip_api == "live"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sip-auth", "a:b"], "--sip-auth needs --sip-port"),
        (["--sip-port", "sip"], "--sip-port: 'sip' is not a whole number"),
        (["--sip-port", "5060", "--sip-auth", "alice"], "--sip-auth: must be user:pass"),
        (["--sip-port", "5060", "--sip-allow", "10.0.0.300/8"], "--sip-allow:"),
        (["--sip-port", "5060", "--sip-webhook", "ftp://x"], "--sip-webhook: must be an http"),
        (["--sip-port", "5060", "--sip-webhook", "http://x/"], "needs --sip-webhook-secret"),
        (["--sip-port", "5060", "--sip-api", "live"], "--sip-api live needs --sip-webhook"),
        (["--sip-api", "live"], "--sip-api needs --sip-port"),
        (
            ["--host", "0.0.0.0", "--api-key", "k", "--sip-port", "5060"],
            "needs --sip-auth or --sip-allow",
        ),
    ],
)
def test_bad_sip_options_say_which(args: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("(", r"\(")):
        serve(*args)


def test_a_public_sip_port_with_auth_is_allowed() -> None:
    settings = serve(
        "--host", "0.0.0.0", "--api-key", "k", "--sip-port", "5060", "--sip-auth", "a:b"
    )
    assert settings.sip_auth == ("a", "b")
