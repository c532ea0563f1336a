"""Per-caller limits: how many sessions one key may hold at once, and how fast it may
start them, shared by every server process through Redis.

A *caller* is an opaque id the web layer derives (realtime/auth.py): a hash of the API key
a request came with (a secret counts against the key that minted it; never the key in
clear), or the client's address where the server has no key.

Each caller has two Redis keys under one hash tag (sessions/keys.py `caller_keys`):
- a sorted set of its session ids scored by lease expiry, as the global `LeaseRegistry`
  keeps them: a session's slot is renewed by the manager's upkeep, freed when the session
  ends, and lapses after `ttl_s` if its process dies. The set is gone once it is empty.
- its creation-rate state, a GCRA ("generic cell rate algorithm", a token bucket kept as
  one timestamp): `per_minute` sessions may start at once, then one every 60/`per_minute`
  seconds. The key expires when the bucket would be full again, so an idle caller leaves
  nothing behind.
One Lua script checks both and takes a slot in one step, so two processes can never both
take a caller's last slot or last token.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis

from .errors import KeyLimitError
from .keys import NAMESPACE, caller_keys

_ADMIT = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1000000
local ttl = tonumber(ARGV[3])
local mode = ARGV[6]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t)
local cap = tonumber(ARGV[2])
if mode ~= 'renew' and not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  if cap > 0 and redis.call('ZCARD', KEYS[1]) >= cap then
    return {-1, 0}
  end
  local interval = tonumber(ARGV[4])
  if interval > 0 then
    local tat = tonumber(redis.call('GET', KEYS[2]) or t)
    if tat < t then tat = t end
    local ahead = tat + interval - t
    local tolerance = interval * tonumber(ARGV[5])
    if ahead > tolerance + 0.000001 then
      return {-2, math.ceil((ahead - tolerance) * 1000)}
    end
    if mode == 'take' then
      local next = string.format('%.6f', tat + interval)
      redis.call('SET', KEYS[2], next, 'PX', math.ceil(ahead * 1000))
    end
  end
end
if mode == 'peek' or cap == 0 then
  return {1, 0}
end
redis.call('ZADD', KEYS[1], t + ttl, ARGV[1])
redis.call('EXPIRE', KEYS[1], math.ceil(ttl) + 1)
return {1, 0}
"""


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """Both limits are off by default: an open server serves loopback only (every client
    is one address) and a server with one key has one caller, so per-key limits below the
    session cap would only shrink it; they matter where several keys share a server."""

    max_sessions: int | None = None
    """Sessions one caller may hold at once; None: no limit but the session cap (and no
    slots kept in Redis)."""
    per_minute: int = 0
    """Sessions one caller may start per minute (all of them at once, then evenly); 0: no
    rate limit."""

    def __post_init__(self) -> None:
        if self.max_sessions is not None and self.max_sessions < 1:
            raise ValueError("the per-key session limit must be at least 1")
        if self.per_minute < 0:
            raise ValueError("the per-key session rate must be 0 (none) or more")

    @property
    def enabled(self) -> bool:
        return self.max_sessions is not None or self.per_minute > 0


class KeyLimiter:
    def __init__(
        self,
        redis: aioredis.Redis,
        limits: KeyLimits,
        ttl_s: float = 30.0,
        namespace: str = NAMESPACE,
    ) -> None:
        self._redis = redis
        self.limits = limits
        self.ttl_s = ttl_s
        self.namespace = namespace
        self._script = redis.register_script(_ADMIT)

    async def check(self, caller: str) -> None:
        """KeyLimitError if a new session of `caller` would be refused now; takes nothing
        (a refusal before a WebSocket upgrade; `acquire` decides for good)."""
        await self._run(caller, "", "peek")

    async def acquire(self, caller: str, session_id: str) -> None:
        """Count `session_id` against `caller` (and its start against the rate);
        KeyLimitError when the caller is at either limit. Idempotent for a held id."""
        await self._run(caller, session_id, "take")

    async def renew(self, caller: str, session_id: str) -> None:
        """Extend the slot of a live session, re-taking it if it lapsed, even over the
        limit: the session was admitted, and a lapse is the server's fault, not the
        caller's. Also how a resumed session is counted again."""
        await self._run(caller, session_id, "renew")

    async def release(self, caller: str, session_id: str) -> None:
        if self.limits.max_sessions is not None:
            await self._redis.zrem(caller_keys(caller, self.namespace)[0], session_id)

    async def count(self, caller: str) -> int:
        return int(await self._redis.zcard(caller_keys(caller, self.namespace)[0]))

    async def _run(self, caller: str, session_id: str, mode: str) -> None:
        if not self.limits.enabled or (mode == "renew" and self.limits.max_sessions is None):
            return
        per_minute = self.limits.per_minute
        interval = 60.0 / per_minute if per_minute else 0.0
        cap = self.limits.max_sessions or 0
        args = [session_id, cap, self.ttl_s, interval, per_minute, mode]
        verdict, retry_ms = await self._script(
            keys=list(caller_keys(caller, self.namespace)), args=args
        )
        if int(verdict) == -1:
            raise KeyLimitError(
                f"this key already holds {self.limits.max_sessions} sessions, as many as it "
                "may at once; end one, or try again when one has ended"
            )
        if int(verdict) == -2:
            retry_after_s = int(retry_ms) / 1000
            raise KeyLimitError(
                f"this key may start {per_minute} sessions per minute; "
                f"try again in {retry_after_s:.1f} s",
                retry_after_s,
            )
