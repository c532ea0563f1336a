"""Prometheus instruments of the session core.

Each manager gets its own registry (so several apps in one test process don't collide);
`web` renders it on /metrics.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class SessionMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.active_sessions = Gauge(
            "parley_active_sessions", "Sessions open in this process", registry=r
        )
        self.turns = Counter("parley_turns", "User turns committed", registry=r)
        self.responses = Counter(
            "parley_responses", "Responses finished, by status", ["status"], registry=r
        )
        self.prefetches = Counter(
            "parley_prefetched_answers",
            "Answers begun at a turn's pause, by outcome: kept (the turn ended there), "
            "discarded (the user spoke on) or redone (begun on a quick draft of the words "
            "that the final words overruled)",
            ["outcome"],
            registry=r,
        )
        self.barge_ins = Counter(
            "parley_barge_ins", "Responses cut off by the user speaking", registry=r
        )
        self.overlap_verdicts = Counter(
            "parley_overlap_verdicts",
            "Speech over an answer judged (interruption: adaptive), by verdict: keep (a "
            "backchannel or a noise: the answer resumed), interrupt, or deadline (not judged "
            "in time: interrupted)",
            ["verdict"],
            registry=r,
        )
        self.dropped_frames = Counter(
            "parley_dropped_buffer_frames",
            "Buffered frames dropped: audio past the cap, video evicted or filtered, events",
            ["kind"],
            registry=r,
        )
        self.redis_errors = Counter(
            "parley_redis_errors", "Redis calls that failed or timed out", registry=r
        )
        self.session_limit_rejections = Counter(
            "parley_session_limit_rejections", "Sessions refused at the cap", registry=r
        )
        self.key_limit_rejections = Counter(
            "parley_key_limit_rejections",
            "Sessions refused at their key's limit (sessions held at once, or started per minute)",
            registry=r,
        )
        self.redis_up = Gauge(
            "parley_redis_up",
            "1 while this process reaches its Redis, 0 during an outage",
            registry=r,
        )
        self.redis_up.set(1)
        self.redis_outages = Counter(
            "parley_redis_outages", "Times this process lost its Redis", registry=r
        )
        self.redis_spilled_writes = Counter(
            "parley_redis_spilled_writes",
            "Session writes kept in memory because Redis was unreachable or refused writes "
            "(written back later)",
            registry=r,
        )
        self.redis_spill_dropped = Counter(
            "parley_redis_spill_dropped",
            "Values dropped from a full spill during a Redis outage or write refusal (oldest "
            "first), by buffer",
            ["kind"],
            registry=r,
        )
        self.redis_restored_writes = Counter(
            "parley_redis_restored_writes",
            "Spilled writes written back to Redis after an outage",
            registry=r,
        )
        self.redis_write_refusals = Counter(
            "parley_redis_write_refusals",
            "Session writes Redis refused, by reason (oom: at its maxmemory with noeviction); "
            "each was kept in memory and retried",
            ["reason"],
            registry=r,
        )
        self.redis_accepts_writes = Gauge(
            "parley_redis_accepts_writes",
            "1 while this process's Redis takes writes, 0 while it refuses them (out of memory)",
            registry=r,
        )
        self.redis_accepts_writes.set(1)
