"""The protocol error, and the values inside client events that need decoding.

Shared by the event parser (client_events.py) and the item parser (client_items.py):
base64 payloads and inline image URLs are checked the same way wherever they appear, and
a value that cannot be used is a `ProtocolError` naming the parameter.
"""

from __future__ import annotations

import base64
import binascii

from sessions import InvalidRequestError

_IMAGE_TYPES = ("image/jpeg", "image/png")


class ProtocolError(InvalidRequestError):
    """A client event Parley cannot use. The session reports it and goes on.

    `event_id` is the client's own id for the offending event, when it could be read, so
    the `error` event can point at it; `param` names the parameter at fault.
    """

    def __init__(
        self, code: str, message: str, event_id: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message, code)
        self.event_id = event_id
        self.field = param


def decode_base64(payload: str, param: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(
            "invalid_value", f"'{param}' is not valid base64", param=param
        ) from None


def image_bytes(url: str, param: str) -> bytes:
    """Decode an inline `data:image/jpeg;base64,...` URL (JPEG or PNG)."""
    header, comma, payload = url.partition(",")
    media = header.removeprefix("data:").removesuffix(";base64")
    if not comma or not header.startswith("data:") or not header.endswith(";base64"):
        raise ProtocolError(
            "invalid_value",
            "image_url must be an inline data URL (data:image/jpeg;base64,...); "
            "Parley does not fetch images",
            param=param,
        )
    if media not in _IMAGE_TYPES:
        raise ProtocolError(
            "invalid_value",
            f"image type {media!r} is not supported; send image/jpeg or image/png",
            param=param,
        )
    return decode_base64(payload, param)
