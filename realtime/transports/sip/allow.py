"""Who may talk to the SIP port: a CIDR allowlist, and the refusal to listen publicly open.

Like the HTTP side, a SIP port with neither digest auth nor an allowlist only binds loopback:
an open SIP port on the internet is found by scanners within minutes and used for toll fraud.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class Allowlist:
    def __init__(self, cidrs: Iterable[str]) -> None:
        self.networks: list[Network] = [
            ipaddress.ip_network(c.strip(), strict=False) for c in cidrs
        ]

    @classmethod
    def parse(cls, text: str) -> Allowlist:
        """From `--sip-allow 10.0.0.0/8,192.0.2.7`."""
        return cls(part for part in text.split(",") if part.strip())

    def allows(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host.split("%")[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped
        return any(address in network for network in self.networks)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, *, auth: bool, allow: Allowlist | None) -> None:
    """Raise ValueError for a non-loopback bind with neither auth nor an allowlist."""
    if not auth and allow is None and not is_loopback(host):
        raise ValueError(
            f"refusing to listen for SIP on {host!r} with neither digest auth nor an "
            "allowlist: set --sip-auth user:pass or --sip-allow CIDR,... (or bind 127.0.0.1)"
        )
