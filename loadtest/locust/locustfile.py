"""Parley's Locust file: users speaking over each public protocol.

    .venv/bin/locust -f loadtest/locust/locustfile.py --host http://127.0.0.1:8000 WsUser
    .venv/bin/locust -f loadtest/locust/locustfile.py --headless -u 50 -r 10 -t 60s \
        --csv out/ws --samples-dir out/ws --host http://127.0.0.1:8000 WsUser

Users: `WsUser` (OpenAI Realtime WebSocket), `RtcUser` (WebRTC, OpenAI's call flow),
`VideoUser` (the video chat stream, with frames), `SipUser` (SIP/RTP over UDP, with
`--sip-port`: the server's). Locust's web UI, `--processes N` and
master/worker all work as with any Locust file; `--samples-dir` makes every process write
its exact samples (and a few answers' audio, for the quality figure) when it quits.
`python -m loadtest.locust.run` runs steps and churn and builds the report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from locust import events

from loadtest.locust.users import RtcUser, Shared, SipUser, VideoUser, WsUser

__all__ = ["RtcUser", "SipUser", "VideoUser", "WsUser"]


def _write_samples(environment: Any, **_: Any) -> None:
    directory = getattr(environment.parsed_options, "samples_dir", "")
    if directory and Shared.rec is not None:
        Shared.rec.dump(Path(directory))


events.quitting.add_listener(_write_samples)  # type: ignore[no-untyped-call]
