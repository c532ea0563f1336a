"""Server settings: the slow-client bound (`--slow-client-s`)."""

from __future__ import annotations

import pytest

from realtime.slow_clients import DEFAULT_STALL_S
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
