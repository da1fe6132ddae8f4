"""The coordinator with a real Broker (storage, flusher) under trio's MockClock, the offsets
record format and its replay after a restart, and the handlers' wire dicts."""
import trio
import trio.testing
from hypothesis import given, strategies as st

from broker.broker import Broker
from broker.config import BrokerConfig
from broker.groups.offsets_log import (OFFSETS_TOPIC, OffsetEntry, decode_key, decode_value,
                                       encode_key, encode_value)
from broker.handlers import (describe_groups, heartbeat, join_group, leave_group, list_groups,
                             offset_commit, offset_fetch, sync_group)
from broker.server import RequestContext
from protocol.errors import ErrorCode
from storage.cleaner import Throttler


class Ctx(RequestContext):
    """The handlers' RequestContext with a stand-in connection (no socket)."""
    def __init__(self, broker, client_id="cl"):
        super().__init__(broker, type("H", (), {"client_id": client_id})(),
                         type("C", (), {"peer": "127.0.0.1:5555", "host": "127.0.0.1", "principal": "User:ANONYMOUS"})())


def make_broker(tmp_path, **kw):
    # flush=async: no worker threads, whose real-time waits would let the autojumping
    # MockClock race ahead and expire sessions at random.
    b = Broker(BrokerConfig(data_dir=tmp_path, flush="async", **kw))
    b.topics.create("t", 4)
    return b


def run(fn, clock=True):
    trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0) if clock else None)


@given(st.text(max_size=40), st.text(max_size=40), st.integers(-2**31, 2**31 - 1),
       st.integers(-1, 2**63 - 1), st.integers(-1, 2**31 - 1), st.none() | st.text(max_size=100),
       st.integers(0, 2**62))
def test_record_format_round_trip(group, topic, part, offset, epoch, metadata, ts):
    assert decode_key(encode_key(group, topic, part)) == (group, topic, part)
    e = OffsetEntry(offset, epoch, metadata, ts)
    assert decode_value(encode_value(e)) == e


def test_two_members_commit_restart(tmp_path):
    async def main():
        b = make_broker(tmp_path)
        async with trio.open_nursery() as n:
            await n.start(b.run_background)
            ctx_a, ctx_b = Ctx(b, "a"), Ctx(b, "b")
            protos = [{"name": "range", "metadata": b"m"}]

            async def join(ctx, mid=""):
                return await join_group.handle(ctx, {
                    "group_id": "g", "session_timeout_ms": 10000, "rebalance_timeout_ms": 20000,
                    "member_id": mid, "group_instance_id": None, "protocol_type": "consumer",
                    "protocols": protos}, 7)

            r = await join(ctx_a)
            assert r["error_code"] == ErrorCode.MEMBER_ID_REQUIRED
            a = r["member_id"]
            r = await join(ctx_a, a)
            assert r["error_code"] == 0 and r["leader"] == a and r["protocol_type"] == "consumer"
            s = await sync_group.handle(ctx_a, {"group_id": "g", "generation_id": 1, "member_id": a,
                                                "assignments": [{"member_id": a, "assignment": b"all"}]}, 5)
            assert s["assignment"] == b"all"

            results = {}

            async def member_b():
                r = await join(ctx_b)
                results["b"] = await join(ctx_b, r["member_id"])

            n.start_soon(member_b)
            await trio.sleep(3)   # a's heartbeat finds the rebalance
            hb = await heartbeat.handle(ctx_a, {"group_id": "g", "generation_id": 1, "member_id": a}, 4)
            assert hb["error_code"] == ErrorCode.REBALANCE_IN_PROGRESS
            # Commit during PreparingRebalance with the old generation (on revoke) is fine.
            c = await offset_commit.handle(ctx_a, {
                "group_id": "g", "generation_id_or_member_epoch": 1, "member_id": a,
                "topics": [{"name": "t", "partitions": [
                    {"partition_index": 0, "committed_offset": 42, "committed_leader_epoch": 0,
                     "committed_metadata": "hello ✓"},
                    {"partition_index": 9, "committed_offset": 1, "committed_metadata": None}]}]}, 8)
            assert [p["error_code"] for p in c["topics"][0]["partitions"]] == \
                [0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
            ra = await join(ctx_a, a)
            while "b" not in results:     # b's task was woken; let it run
                await trio.sleep(0)
            rb = results["b"]
            assert ra["generation_id"] == rb["generation_id"] == 2, (ra, rb)
            assert len(ra["members"]) == 2 and rb["members"] == []
            d = await describe_groups.handle(ctx_a, {"groups": ["g", "nope"]}, 5)
            assert d["groups"][0]["group_state"] == "CompletingRebalance"
            assert d["groups"][1]["group_state"] == "Dead"
            lg = await list_groups.handle(ctx_a, {"states_filter": ["completingrebalance"]}, 4)
            assert [g["group_id"] for g in lg["groups"]] == ["g"]

            # b never syncs nor heartbeats; a keeps heartbeating: b's session ends.
            for _ in range(6):
                await trio.sleep(3)
                await heartbeat.handle(ctx_a, {"group_id": "g", "generation_id": 2, "member_id": a}, 4)
            assert set(b.groups.groups["g"].members) == {a}

            lv = await leave_group.handle(ctx_a, {"group_id": "g", "members": [
                {"member_id": a, "group_instance_id": None}, {"member_id": "x", "group_instance_id": None}]}, 5)
            assert [m["error_code"] for m in lv["members"]] == [0, ErrorCode.UNKNOWN_MEMBER_ID]
            assert b.groups.groups["g"].state == "Empty"

            # Standalone commit (kcat / assign() users).
            c = await offset_commit.handle(ctx_a, {
                "group_id": "solo", "generation_id_or_member_epoch": -1, "member_id": "",
                "topics": [{"name": "t", "partitions": [
                    {"partition_index": 3, "committed_offset": 7, "committed_metadata": ""}]}]}, 2)
            assert c["topics"][0]["partitions"][0]["error_code"] == 0
            bad = await offset_commit.handle(ctx_a, {
                "group_id": "nogroup", "generation_id_or_member_epoch": 5, "member_id": "m",
                "topics": [{"name": "t", "partitions": [
                    {"partition_index": 3, "committed_offset": 7, "committed_metadata": ""}]}]}, 2)
            assert bad["topics"][0]["partitions"][0]["error_code"] == ErrorCode.ILLEGAL_GENERATION
            n.cancel_scope.cancel()
        b.close()

    run(main)

    async def after_restart():
        b = Broker(BrokerConfig(data_dir=tmp_path))
        async with trio.open_nursery() as n:
            await n.start(b.run_background)
            ctx = Ctx(b)
            f = await offset_fetch.handle(ctx, {"group_id": "g", "topics": None}, 7)
            assert f["topics"] == [{"name": "t", "partitions": [
                {"partition_index": 0, "committed_offset": 42, "committed_leader_epoch": 0,
                 "metadata": "hello ✓", "error_code": 0}]}]
            f = await offset_fetch.handle(ctx, {"groups": [
                {"group_id": "solo", "topics": [{"name": "t", "partition_indexes": [3, 1]}]},
                {"group_id": "none", "topics": None}]}, 8)
            parts = f["groups"][0]["topics"][0]["partitions"]
            assert [(p["partition_index"], p["committed_offset"], p["metadata"]) for p in parts] == \
                [(3, 7, ""), (1, -1, "")]
            assert f["groups"][1]["topics"] == []
            lg = await list_groups.handle(ctx, {}, 3)
            assert {g["group_id"] for g in lg["groups"]} == {"g", "solo"}
            assert b.topics.get(OFFSETS_TOPIC).is_internal
            n.cancel_scope.cancel()
        b.close()

    run(after_restart)


def test_session_timeout_bounds_and_invalid_group(tmp_path):
    async def main():
        b = make_broker(tmp_path)
        async with trio.open_nursery() as n:
            await n.start(b.run_background)
            req = {"group_id": "g", "session_timeout_ms": 5999, "member_id": "",
                   "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b""}]}
            r = await join_group.handle(Ctx(b), req, 0)
            assert r["error_code"] == ErrorCode.INVALID_SESSION_TIMEOUT
            r = await join_group.handle(Ctx(b), {**req, "session_timeout_ms": 6000, "group_id": ""}, 0)
            assert r["error_code"] == ErrorCode.INVALID_GROUP_ID
            r = await join_group.handle(Ctx(b), {**req, "session_timeout_ms": 6000}, 0)
            assert r["error_code"] == 0 and r["protocol_name"] == "range"   # v0: no round trip
            n.cancel_scope.cancel()
        b.close()

    run(main)


def test_compaction_and_topic_forgetting_survive_restart(tmp_path):
    """__consumer_offsets is a compacted topic: the log cleaner keeps the newest record per
    key, and a replay of the cleaned log gives the same table."""
    async def main():
        b = make_broker(tmp_path, offsets_topic_segment_bytes=2048, log_cleaner_enable=False)
        async with trio.open_nursery() as n:
            await n.start(b.run_background)
            ctx = Ctx(b)
            b.topics.create("gone", 1)
            for i in range(60):
                await offset_commit.handle(ctx, {
                    "group_id": "s", "generation_id_or_member_epoch": -1, "member_id": "",
                    "topics": [{"name": "t", "partitions": [
                        {"partition_index": i % 4, "committed_offset": i, "committed_metadata": f"m{i}"}]},
                        {"name": "gone", "partitions": [
                            {"partition_index": 0, "committed_offset": i, "committed_metadata": None}]}]}, 8)
            log_ = b.topics.partition(OFFSETS_TOPIC, 0).log
            assert log_.config.compact
            log_.roll()
            before = _record_count(log_)
            assert await b.clean_dirtiest(Throttler(float("inf")))
            # 5 keys (4 partitions of t, 1 of gone): at most one record each is left
            assert before == 120 and _record_count(log_) == 5
            assert await b.groups.forget_topic("gone") == 1
            n.cancel_scope.cancel()
        b.close()

    trio.run(main)   # real clock: compaction flushes in a worker thread

    async def again():
        b = Broker(BrokerConfig(data_dir=tmp_path))
        async with trio.open_nursery() as n:
            await n.start(b.run_background)
            f = await offset_fetch.handle(Ctx(b), {"group_id": "s", "topics": None}, 5)
            assert [t["name"] for t in f["topics"]] == ["t"]
            assert [(p["partition_index"], p["committed_offset"], p["metadata"])
                    for p in f["topics"][0]["partitions"]] == \
                [(0, 56, "m56"), (1, 57, "m57"), (2, 58, "m58"), (3, 59, "m59")]
            n.cancel_scope.cancel()
        b.close()

    trio.run(again)


def _record_count(log_) -> int:
    from protocol.records import iter_records
    n = 0
    for seg in log_.segments:
        for i in range(seg.entries):
            _, _, _, pos, size = seg.entry(i)
            n += sum(1 for _ in iter_records(seg.read_at(pos, size)))
    return n


def test_empty_groups_without_offsets_are_dropped(tmp_path):
    async def main():
        b = make_broker(tmp_path)
        async with trio.open_nursery() as n:
            await n.start(b.run_background)
            req = {"group_id": "ghost", "session_timeout_ms": 6000, "rebalance_timeout_ms": 6000,
                   "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
                   "protocols": [{"name": "range", "metadata": b""}]}
            r = await join_group.handle(Ctx(b), req, 5)
            assert r["error_code"] == ErrorCode.MEMBER_ID_REQUIRED and "ghost" in b.groups.groups
            await trio.sleep(7)          # the handed-out id expires, the group goes
            assert "ghost" not in b.groups.groups
            n.cancel_scope.cancel()
        b.close()

    run(main)
