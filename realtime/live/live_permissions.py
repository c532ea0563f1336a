"""Which GPT-Live events a WebRTC front end may send and read (`client.data_channel`).

A browser is not trusted: the application's server, which holds the key and makes the
session, says at start which client events the page may send on its data channel
(`allowed_client_events`) and which server events it may read there
(`allowed_server_events`; a Responses event is chosen by its nested type, as
`{type: "response.event", response_event: "response.output_text.delta"}`). Either left
out allows everything, `"all"` too, and an empty list nothing.

A client event not allowed is not applied: the page gets an `error` naming it (if it may
read errors). A server event not allowed is not sent on the channel, whatever it is,
`session.started` and `error` included: the server chose what the page sees. Sidebands
are the application's own and are not filtered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .live_config import LiveDataChannel, LiveSessionConfig


@dataclass(frozen=True)
class DataChannelPermissions:
    client_events: frozenset[str] | None
    """The client event types the page may send; None: any."""
    server_events: frozenset[str] | None
    """The server event types the page may read; None: any."""
    response_events: frozenset[str] | None
    """The nested types of the `response.event`s it may read; None: any."""

    @classmethod
    def of(cls, live: LiveSessionConfig) -> DataChannelPermissions:
        channel = live.client.data_channel if live.client is not None else LiveDataChannel()
        client = channel.allowed_client_events
        server = channel.allowed_server_events
        if server is None or server == "all":
            server_events = response_events = None
        else:
            server_events = frozenset(s.type for s in server if s.type != "response.event")
            response_events = frozenset(
                s.response_event for s in server if s.response_event is not None
            )
        return cls(
            client_events=None if client is None or client == "all" else frozenset(client),
            server_events=server_events,
            response_events=response_events,
        )

    def may_send(self, kind: str) -> bool:
        """Whether the page may send a client event of this type."""
        return self.client_events is None or kind in self.client_events

    def may_read(self, message: dict[str, Any]) -> bool:
        """Whether the page may read this server message."""
        kind = message.get("type")
        if kind == "response.event":
            if self.response_events is None:
                return True
            nested = message.get("event")
            return isinstance(nested, dict) and nested.get("type") in self.response_events
        return self.server_events is None or kind in self.server_events
