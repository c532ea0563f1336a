"""Origins as a browser writes them: `scheme://host[:port]`, and `*` for any.

Apart from the allowlist (`origins.py`) because the settings validate `--allowed-origin`
with them, and the allowlist is built from the settings.
"""

from __future__ import annotations

import ipaddress
import urllib.parse

ANY_ORIGIN = "*"
DEFAULT_PORTS = {"http": 80, "https": 443}


def normalize_origin(text: str) -> str:
    """`scheme://host[:port]` as a browser serializes it; ValueError if `text` is not one.

    Lower case, no default port, and a trailing slash forgiven (people paste URLs)."""
    candidate = text.strip()
    if candidate.endswith("/"):
        candidate = candidate[:-1]
    try:
        parts = urllib.parse.urlsplit(candidate)
    except ValueError:  # an unclosed [ of an IPv6 host
        raise ValueError(f"{text!r} is not an origin (scheme://host[:port])") from None
    host = parts.hostname
    if not parts.scheme or not host or parts.path or parts.query or parts.fragment:
        raise ValueError(f"{text!r} is not an origin (scheme://host[:port])")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{text!r} is not an origin: it has credentials")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{text!r} is not an origin: its port is not one") from None
    if port == 0:
        raise ValueError(f"{text!r} is not an origin: port 0")
    scheme = parts.scheme.lower()
    serialized = f"{scheme}://{bracketed(host)}"
    return serialized if port in (None, DEFAULT_PORTS.get(scheme)) else f"{serialized}:{port}"


def bracketed(host: str) -> str:
    """An IPv6 host in brackets, as it stands in a URL; any other host as it is."""
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host
