"""Server settings: the slow-client bound (`--slow-client-s`), the resume grace
(`--resume-grace-s`)."""

from __future__ import annotations

import pytest

from realtime.slow_clients import DEFAULT_STALL_S
from realtime.transports.websocket.connections import DEFAULT_GRACE_S
from web.app import create_app
from web.settings import SettingsError, parse_settings


def test_the_slow_client_bound_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert parse_settings(["serve"])[1].slow_client_s == DEFAULT_STALL_S == 10.0
    assert parse_settings(["serve", "--slow-client-s", "2.5"])[1].slow_client_s == 2.5
    monkeypatch.setenv("PARLEY_SLOW_CLIENT_S", "15")
    assert parse_settings(["serve"])[1].slow_client_s == 15.0
    for bad in ("0", "-1", "soon", "601"):
        with pytest.raises(SettingsError, match="--slow-client-s"):
            parse_settings(["serve", "--slow-client-s", bad])


def test_the_resume_grace_from_the_flag_or_the_environment_reaches_the_app(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """How long a dropped WebSocket or WebRTC call's session waits to be resumed."""
    assert parse_settings(["serve"])[1].resume_grace_s == DEFAULT_GRACE_S == 30.0
    settings = parse_settings(["serve", "--resume-grace-s", "120"])[1]
    assert settings.resume_grace_s == 120.0
    assert create_app(settings, "redis://unused").state.services.resume_grace_s == 120.0
    monkeypatch.setenv("PARLEY_RESUME_GRACE_S", "0")  # no resume: a drop ends the session
    assert parse_settings(["serve"])[1].resume_grace_s == 0.0
    for bad in ("-1", "later", "3601"):
        with pytest.raises(SettingsError, match="--resume-grace-s"):
            parse_settings(["serve", "--resume-grace-s", bad])


def test_gpt_live_storage_retention_and_recording_cap_from_the_flags() -> None:
    """How long a stored GPT-Live session is kept, and its recording's cap."""
    settings = parse_settings(["serve"])[1]
    assert (settings.live_store_retention_s, settings.live_recording_max_s) == (86_400, 600)
    flags = ["serve", "--live-store-retention-s", "3600", "--live-recording-max-s", "60"]
    settings = parse_settings(flags)[1]
    assert (settings.live_store_retention_s, settings.live_recording_max_s) == (3600, 60)
    with pytest.raises(SettingsError, match="--live-store-retention-s"):
        parse_settings(["serve", "--live-store-retention-s", "0"])
