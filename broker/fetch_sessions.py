"""KIP-227 incremental fetch sessions: the partitions a fetcher reads, remembered here.

A fetcher that reads 1 000 partitions would otherwise name all of them in every Fetch and
get all of them back, changed or not: ~20 µs of broker work per partition per Fetch. In a
session the broker keeps the partition list with each partition's last request fields
(fetch offset, limits, epochs) and what it last told the fetcher (high watermark, log
start offset); an incremental Fetch names only the partitions whose request changed plus
those to forget, and its answer lists only the partitions with something new.

Sans-IO: every method takes ``now_ms``; the Fetch handler (broker/handlers/fetch.py) does
the reading. Kafka's rules, from its FetchSession/FetchManager, that clients depend on:

* ``session_epoch`` -1 (FINAL) with ``session_id`` 0 is a sessionless full fetch (every
  librdkafka and kafka-python Fetch); -1 with an id closes that session, then full fetch.
* Epoch 0 (INITIAL) is a full fetch that asks for a new session (closing the named one):
  the answer carries the new id, or 0 when the cache has no room (the fetcher then simply
  keeps sending full fetches). The next request of a session must carry epoch 1.
* Epoch n > 0 must name a cached session (else FETCH_SESSION_ID_NOT_FOUND) and equal its
  epoch (else INVALID_FETCH_SESSION_EPOCH); the Java client then starts a new session.
  Epochs wrap from 2**31-1 to 1.
* An incremental answer lists a partition when it has records, an error, a diverging epoch
  or a preferred read replica, or when its high watermark or log start offset differs from
  what this session last sent (an error resets the remembered HW, so the partition is sent
  again once the error clears). canopy also lists every partition the request named (its
  fetch state changed), as a sessionless Fetch would: a fetcher that dropped an answer
  while its own state moved (canopy's followers do, replication/fetcher.py) then still
  learns the high watermark without waiting for it to move again. Kafka's clients accept
  any partition of the session in an answer.
* Partitions that returned records move to the end of the session's order, so under
  ``max_bytes`` the busy ones take turns (Kafka's fairness rule).
* The cache holds ``max_sessions`` (Kafka's max.incremental.fetch.session.cache.slots,
  1 000). When full, a session idle for ``eviction_ms`` (min.incremental.fetch.session.
  eviction.ms, 120 s) makes room; otherwise a replica's session may evict a consumer's, and
  a consumer's session may evict a smaller consumer session, least recently used first.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from protocol.errors import ErrorCode
from protocol.fetch_session import FINAL_EPOCH, INITIAL_EPOCH, INT32_MAX, INVALID_SESSION_ID, next_epoch

# The per-partition request fields a session remembers (the rest are per request).
_PARTITION_FIELDS = ("fetch_offset", "partition_max_bytes", "current_leader_epoch",
                     "last_fetched_epoch", "log_start_offset")


class CachedPartition:
    """One partition of a session: its latest request fields, and what was last sent."""
    __slots__ = ("topic", "request", "high_watermark", "log_start_offset")

    def __init__(self, topic: str, request: dict):
        self.topic = topic
        self.request = request
        self.high_watermark = -1     # -1: never sent (or an error was): send it next time
        self.log_start_offset = -1

    def must_respond(self, high_watermark: int, log_start_offset: int, error: int, has_records: bool,
                     other_news: bool) -> bool:
        """Whether an incremental answer lists this partition; notes what it will send."""
        respond = has_records or other_news
        if high_watermark != self.high_watermark:
            self.high_watermark = high_watermark
            respond = True
        if log_start_offset != self.log_start_offset:
            self.log_start_offset = log_start_offset
            respond = True
        if error:
            self.high_watermark = -1
            respond = True
        return respond


@dataclass
class FetchSession:
    id: int
    epoch: int                       # the epoch the next request must carry
    privileged: bool                 # a replica's (follower's) session
    last_used_ms: int
    partitions: dict[tuple[str, int], CachedPartition] = field(default_factory=dict)

    def update(self, topics: list[dict], forgotten: list[dict]) -> set[tuple[str, int]]:
        """Apply an incremental request; returns the partitions it named."""
        named = set()
        for t in topics:
            for pr in t["partitions"]:
                key = (t["topic"], pr["partition"])
                named.add(key)
                cached = self.partitions.get(key)
                if cached is None:
                    self.partitions[key] = CachedPartition(t["topic"], _remembered(pr))
                else:
                    cached.request = _remembered(pr)
        for t in forgotten:
            for idx in t["partitions"]:
                self.partitions.pop((t["topic"], idx), None)
        return named

    def move_to_end(self, keys) -> None:
        for key in keys:
            cached = self.partitions.pop(key, None)
            if cached is not None:
                self.partitions[key] = cached


def _remembered(pr: dict) -> dict:
    return {"partition": pr["partition"], **{f: pr[f] for f in _PARTITION_FIELDS if f in pr}}


@dataclass
class FetchContext:
    """How to answer one Fetch: over ``partitions`` ((topic, request fields), in order);
    ``incremental`` answers list only what changed and the partitions the request
    ``named``; ``new_session`` means a full fetch that should open a session
    (``FetchSessionCache.create`` after reading)."""
    partitions: list[tuple[str, dict]]
    session: FetchSession | None = None
    named: frozenset = frozenset()
    new_session: bool = False
    error: ErrorCode = ErrorCode.NONE

    @property
    def incremental(self) -> bool:
        return self.session is not None


class FetchSessionCache:
    def __init__(self, max_sessions: int = 1000, eviction_ms: int = 120_000, rng: random.Random | None = None):
        self.max_sessions = max_sessions
        self.eviction_ms = eviction_ms
        self.sessions: dict[int, FetchSession] = {}
        self.evictions = 0
        self._rng = rng or random.Random()

    def context(self, request: dict, now_ms: int) -> FetchContext:
        """Kafka's FetchManager.newContext: what this request reads and how it is answered."""
        session_id = request.get("session_id", INVALID_SESSION_ID)
        epoch = request.get("session_epoch", FINAL_EPOCH)
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != INVALID_SESSION_ID:
                self.sessions.pop(session_id, None)
            return FetchContext([(t["topic"], pr) for t in request["topics"] for pr in t["partitions"]],
                                new_session=epoch == INITIAL_EPOCH)
        session = self.sessions.get(session_id)
        if session is None:
            return FetchContext([], error=ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
        if session.epoch != epoch:
            return FetchContext([], error=ErrorCode.INVALID_FETCH_SESSION_EPOCH)
        named = session.update(request["topics"], request.get("forgotten_topics_data") or [])
        session.last_used_ms = now_ms
        if not session.partitions:
            # Kafka: a session that forgot every partition is closed; answered sessionless.
            del self.sessions[session_id]
            return FetchContext([])
        session.epoch = next_epoch(epoch)
        return FetchContext([(c.topic, c.request) for c in session.partitions.values()], session,
                            named=frozenset(named))

    def create(self, partitions: list[tuple[str, dict]], privileged: bool, now_ms: int) -> FetchSession | None:
        """A new session over these partitions, or None when the cache has no room for it."""
        if not partitions:
            return None
        if len(self.sessions) >= self.max_sessions and not self._evict_one(len(partitions), privileged, now_ms):
            return None
        session_id = self._rng.randint(1, INT32_MAX)
        while session_id in self.sessions:
            session_id = self._rng.randint(1, INT32_MAX)
        session = FetchSession(session_id, next_epoch(INITIAL_EPOCH), privileged, now_ms)
        for topic, pr in partitions:
            session.partitions[(topic, pr["partition"])] = CachedPartition(topic, _remembered(pr))
        self.sessions[session_id] = session
        return session

    def _evict_one(self, size: int, privileged: bool, now_ms: int) -> bool:
        by_age = sorted(self.sessions.values(), key=lambda s: s.last_used_ms)
        victim = next((s for s in by_age if now_ms - s.last_used_ms >= self.eviction_ms), None)
        if victim is None and privileged:
            victim = next((s for s in by_age if not s.privileged), None)
        if victim is None and not privileged:
            victim = next((s for s in by_age if not s.privileged and len(s.partitions) < size), None)
        if victim is None:
            return False
        del self.sessions[victim.id]
        self.evictions += 1
        return True

    def partitions_cached(self) -> int:
        return sum(len(s.partitions) for s in self.sessions.values())
