"""broker/fetch_sessions.py: KIP-227's session rules, deterministic (the clock is passed in)."""
from __future__ import annotations

import random

from broker.fetch_sessions import FetchSessionCache
from protocol.fetch_session import next_epoch
from protocol.errors import ErrorCode


def part(idx: int, offset: int = 0) -> dict:
    return {"partition": idx, "fetch_offset": offset, "partition_max_bytes": 1 << 20,
            "current_leader_epoch": -1, "log_start_offset": -1}


def fetch(session_id: int, epoch: int, parts=(), topic: str = "t", forgotten=()) -> dict:
    return {"session_id": session_id, "session_epoch": epoch,
            "topics": [{"topic": topic, "partitions": list(parts)}] if parts else [],
            "forgotten_topics_data": [{"topic": topic, "partitions": list(forgotten)}] if forgotten else []}


def open_session(cache, n: int = 3, now: int = 0, privileged: bool = False):
    ctx = cache.context(fetch(0, 0, [part(i) for i in range(n)]), now)
    assert ctx.new_session and not ctx.incremental
    return cache.create(ctx.partitions, privileged, now)


def test_sessionless_full_fetch_opens_nothing():
    cache = FetchSessionCache()
    ctx = cache.context(fetch(0, -1, [part(0), part(1)]), 0)
    assert not ctx.new_session and not ctx.incremental and ctx.session is None
    assert [pr["partition"] for _, pr in ctx.partitions] == [0, 1]
    assert cache.sessions == {}


def test_incremental_fetch_reads_every_session_partition_with_updated_offsets():
    cache = FetchSessionCache(rng=random.Random(1))
    s = open_session(cache)
    assert s.id > 0 and s.epoch == 1
    ctx = cache.context(fetch(s.id, 1, [part(1, offset=42)]), 10)
    assert ctx.incremental and ctx.session is s and s.epoch == 2
    assert [(pr["partition"], pr["fetch_offset"]) for _, pr in ctx.partitions] == [(0, 0), (1, 42), (2, 0)]
    # A new partition joins at the end; a forgotten one leaves.
    ctx = cache.context(fetch(s.id, 2, [part(5, offset=7)], forgotten=[0]), 20)
    assert [(pr["partition"], pr["fetch_offset"]) for _, pr in ctx.partitions] == [(1, 42), (2, 0), (5, 7)]


def test_wrong_epoch_and_unknown_session_are_errors_and_change_nothing():
    cache = FetchSessionCache()
    s = open_session(cache)
    assert cache.context(fetch(s.id, 5), 0).error == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    assert cache.context(fetch(s.id + 1, 1), 0).error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    assert s.epoch == 1 and cache.context(fetch(s.id, 1), 0).incremental


def test_final_epoch_closes_the_session_and_initial_replaces_it():
    cache = FetchSessionCache()
    s = open_session(cache)
    ctx = cache.context(fetch(s.id, -1, [part(0)]), 0)
    assert not ctx.new_session and s.id not in cache.sessions
    s2 = open_session(cache)
    ctx = cache.context(fetch(s2.id, 0, [part(0)]), 0)   # epoch 0 with an id: close, then open anew
    assert ctx.new_session and s2.id not in cache.sessions


def test_forgetting_every_partition_closes_the_session():
    cache = FetchSessionCache()
    s = open_session(cache, n=2)
    ctx = cache.context(fetch(s.id, 1, forgotten=[0, 1]), 0)
    assert ctx.partitions == [] and not ctx.incremental and s.id not in cache.sessions


def test_epochs_wrap_to_one():
    assert next_epoch(2**31 - 1) == 1 and next_epoch(0) == 1 and next_epoch(7) == 8


def test_must_respond_on_news_only_and_resends_after_an_error():
    cache = FetchSessionCache()
    c = open_session(cache, n=1).partitions[("t", 0)]
    assert c.must_respond(10, 0, 0, False, False)          # first time: everything is news
    assert not c.must_respond(10, 0, 0, False, False)
    assert c.must_respond(10, 0, 0, True, False)           # records
    assert c.must_respond(11, 0, 0, False, False)          # high watermark moved
    assert c.must_respond(11, 3, 0, False, False)          # log start offset moved
    assert c.must_respond(11, 3, 0, False, True)           # diverging epoch / preferred replica
    assert c.must_respond(-1, -1, 6, False, False)         # an error, always
    assert c.must_respond(11, 3, 0, False, False)          # ... and the partition once it clears


def test_busy_partitions_move_to_the_end():
    cache = FetchSessionCache()
    s = open_session(cache, n=4)
    s.move_to_end([("t", 0), ("t", 2)])
    assert [k[1] for k in s.partitions] == [1, 3, 0, 2]


def test_full_cache_evicts_idle_sessions_first_then_by_privilege_and_size():
    cache = FetchSessionCache(max_sessions=2, eviction_ms=1000)
    small = open_session(cache, n=1, now=0)
    follower = open_session(cache, n=5, now=500, privileged=True)
    # Not idle long enough, and a consumer session of 1 partition is not bigger than `small`.
    ctx = cache.context(fetch(0, 0, [part(0)]), 600)
    assert cache.create(ctx.partitions, False, 600) is None
    # A bigger consumer session evicts the smaller consumer one, never the follower's.
    ctx = cache.context(fetch(0, 0, [part(i) for i in range(3)]), 700)
    big = cache.create(ctx.partitions, False, 700)
    assert big is not None and set(cache.sessions) == {follower.id, big.id}
    # A follower's session evicts a consumer's.
    ctx = cache.context(fetch(0, 0, [part(0)]), 800)
    f2 = cache.create(ctx.partitions, True, 800)
    assert set(cache.sessions) == {follower.id, f2.id}
    # Once a session has been idle for eviction_ms, anyone may take its place.
    ctx = cache.context(fetch(0, 0, [part(0)]), 1600)
    c2 = cache.create(ctx.partitions, False, 1600)
    assert c2 is not None and follower.id not in cache.sessions and small.id not in cache.sessions


def test_no_slots_means_no_sessions():
    # max.incremental.fetch.session.cache.slots=0: every full Fetch is answered session-less.
    cache = FetchSessionCache(max_sessions=0)
    ctx = cache.context(fetch(0, 0, [part(0)]), 0)
    assert ctx.new_session and cache.create(ctx.partitions, True, 0) is None and cache.sessions == {}
