"""ICE settings: which host addresses to offer, and which STUN/TURN servers to use.

aiortc's ICE library gathers host candidates from every interface except 127.0.0.1, and
with no configuration aiortc asks a public STUN server. Neither suits a server: tests and a
local browser need loopback candidates, and a closed network has no public STUN. So the
addresses to gather are set here, process-wide (ICE gathering is process-wide in aioice),
and the STUN/TURN list is always explicit (empty by default).

aiortc and aioice are imported where they are used, not here: the server reads
`is_loopback` and builds its `IceSettings` at start-up whether or not it ever answers a
WebRTC call, and aiortc pulls in PyAV (FFmpeg) with it, which a host that serves only
WebSockets need not have installed.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiortc import RTCConfiguration, RTCIceServer

_original_gather: Any = None
"""aioice's own gatherer, kept at the first `apply()` so that a later one can restore it."""


@dataclass(frozen=True, slots=True)
class IceSettings:
    host_addresses: tuple[str, ...] | None = None
    """Addresses to gather host candidates on; None gathers every non-loopback interface."""
    servers: tuple[RTCIceServer, ...] = field(default_factory=tuple)

    @classmethod
    def for_listen_host(
        cls, host: str, servers: Sequence[RTCIceServer] = (), addresses: Sequence[str] = ()
    ) -> IceSettings:
        """Loopback-only candidates when the server itself listens on loopback."""
        if addresses:
            return cls(tuple(addresses), tuple(servers))
        if is_loopback(host):
            return cls(("127.0.0.1",), tuple(servers))
        return cls(None, tuple(servers))

    def rtc_configuration(self) -> RTCConfiguration:
        from aiortc import RTCConfiguration

        return RTCConfiguration(iceServers=list(self.servers))

    def apply(self) -> None:
        """Make aioice gather on our addresses (process-wide)."""
        import aioice.ice

        global _original_gather
        if _original_gather is None:
            _original_gather = aioice.ice.get_host_addresses
        if self.host_addresses is None:
            aioice.ice.get_host_addresses = _original_gather
            return
        chosen = list(self.host_addresses)

        def gather(use_ipv4: bool, use_ipv6: bool) -> list[str]:
            return [a for a in chosen if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

        aioice.ice.get_host_addresses = gather


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_ice_servers(spec: str) -> tuple[RTCIceServer, ...]:
    """`stun:host:3478,turn:user:pass@host:3478` -> RTCIceServer list (credentials optional)."""
    items = [part.strip() for part in spec.split(",") if part.strip()]
    if not items:
        return ()  # the default: no aiortc needed to say so
    from aiortc import RTCIceServer

    servers = []
    for item in items:
        scheme, _, rest = item.partition(":")
        if scheme not in ("stun", "turn", "turns"):
            raise ValueError(f"ICE server {item!r}: expected stun:, turn: or turns:")
        username = credential = None
        if "@" in rest:
            creds, rest = rest.rsplit("@", 1)
            username, _, credential = creds.partition(":")
        servers.append(RTCIceServer(f"{scheme}:{rest}", username=username, credential=credential))
    return tuple(servers)
