"""Redis key names for one session, in one place.

Every key of a session shares the hash tag `{session_id}`, so on a Redis Cluster all of
a session's keys live in one slot and multi-key operations stay legal.
"""

from __future__ import annotations

from dataclasses import dataclass

NAMESPACE = "parley"
DEFAULT_KEY_TTL_S = 300
"""Keys outlive a crashed process by at most this long; live sessions keep refreshing it."""


@dataclass(frozen=True, slots=True)
class SessionKeys:
    session_id: str
    namespace: str = NAMESPACE

    def _key(self, name: str) -> str:
        return f"{self.namespace}:{{{self.session_id}}}:{name}"

    @property
    def audio(self) -> str:
        """Stream of 20 ms PCM16 16 kHz frames, ids `<offset_ms>-1`."""
        return self._key("audio")

    @property
    def frames(self) -> str:
        """List of packed (timestamp, image) video frames, oldest first."""
        return self._key("frames")

    @property
    def frame_times(self) -> str:
        """List of the video frames' 8-byte timestamps, aligned with `frames` at the end."""
        return self._key("frame_times")

    @property
    def history(self) -> str:
        """List of conversation item ids in order."""
        return self._key("history")

    @property
    def items(self) -> str:
        """Hash item id -> item JSON."""
        return self._key("items")

    @property
    def events(self) -> str:
        """Stream: the session's event log, for resuming a dropped connection."""
        return self._key("events")

    @property
    def meta(self) -> str:
        """Hash: the session record (config, resume token, owner)."""
        return self._key("meta")

    def all(self) -> tuple[str, ...]:
        return (
            self.audio,
            self.frames,
            self.frame_times,
            self.history,
            self.items,
            self.events,
            self.meta,
        )


def leases_key(namespace: str = NAMESPACE) -> str:
    """Sorted set of session ids scored by lease expiry, shared by every server process."""
    return f"{namespace}:leases"


def caller_keys(caller: str, namespace: str = NAMESPACE) -> tuple[str, str]:
    """A caller's (an API key's, or an address's) per-key limits: the sorted set of its
    session ids scored by lease expiry, and its session-creation rate state. One hash tag
    `{caller:<id>}`, so one script may touch both on a Redis Cluster."""
    tag = f"{namespace}:{{caller:{caller}}}"
    return f"{tag}:sessions", f"{tag}:rate"
