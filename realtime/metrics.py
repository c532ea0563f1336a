"""Transport instruments: calls, outbound audio frames sent on time or late, offers
refused, inbound media that could not be used, and clients closed for not reading."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

LATE_AFTER_S = 0.040
"""A 20 ms frame handed over more than this after its due time counts as late."""


class TransportMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.calls = Gauge("parley_webrtc_calls", "WebRTC calls open in this process", registry=r)
        self.frames = Counter(
            "parley_webrtc_outbound_frames", "Outbound 20 ms audio frames", registry=r
        )
        self.late_frames = Counter(
            "parley_webrtc_late_frames",
            "Outbound audio frames handed to the encoder more than 40 ms after their due time",
            registry=r,
        )
        self.offers_refused = Counter(
            "parley_webrtc_offers_refused",
            "SDP offers refused: by Parley's checks (checks), because aiortc could not answer "
            "them (unanswerable), or by the server's own failure (timeout, server)",
            ["reason"],
            registry=r,
        )
        self.media_errors = Counter(
            "parley_webrtc_media_errors",
            "Inbound media dropped: datagrams that are not media (datagram), RTP or RTCP "
            "packets that could not be handled (rtp, rtcp), audio or video that failed to "
            "decode (decode), decoded frames that could not be converted (frame) or that "
            "the session refused (refused)",
            ["kind"],
            registry=r,
        )
        self.slow_clients = Counter(
            "parley_slow_clients_closed",
            "Connections closed because the client stopped reading what the server sent, by "
            "transport (openai_ws, video_stream, sideband, twilio, webrtc_events)",
            ["transport"],
            registry=r,
        )

    def frame(self, lateness_s: float) -> None:
        self.frames.inc()
        if lateness_s > LATE_AFTER_S:
            self.late_frames.inc()
