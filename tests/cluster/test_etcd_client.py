"""controller/etcd.py against a real three-member etcd 3.4 cluster (tests/etcd_cluster.py).

Faults are real: SIGKILL, SIGTERM and SIGSTOP of etcd members. The trio.fail_after bounds
below are hang guards (a call that never returns fails the test), far above the times the
calls take; they are not speed assertions.
"""
from __future__ import annotations

import base64

import pytest
import trio

from controller.etcd import (Compare, EtcdClient, EtcdError, EtcdUnavailable, KeyValue, Op,
                             WatchCompacted)
from tests.e2e.conftest import free_port
from tests.cluster.conftest import wait_for as wait_for_sync
from tests.etcd_cluster import gateway_call

HANG_GUARD = 60


def run(fn, *args):
    trio.run(fn, *args)


async def eventually(cond, what: str, timeout: float = 30.0, interval: float = 0.2):
    with trio.move_on_after(timeout):
        while True:
            value = await cond()
            if value:
                return value
            await trio.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


async def _put_or_none(client, key: str, value: bytes):
    try:
        return await client.put(key, value)
    except EtcdUnavailable:
        return None


def client_for(cluster, order=None, request_timeout=5.0) -> EtcdClient:
    """A client whose endpoints are the members in `order` (default: cluster order)."""
    members = [cluster.members[i] for i in order] if order else cluster.members
    return EtcdClient([(m.host, m.client_port) for m in members], request_timeout=request_timeout)


def test_put_get_delete_and_prefix(etcd_cluster):
    async def main():
        async with EtcdClient(etcd_cluster.endpoints) as etcd:
            rev1 = await etcd.put("/canopy/brokers/1", b'{"host": "a"}')
            rev2 = await etcd.put("/canopy/brokers/2", b"")
            await etcd.put("/canopy/brokers0", b"outside the prefix")
            await etcd.put("/canopy/topics/t", b"\x00\xff binary")
            assert rev2 == rev1 + 1

            kv = await etcd.get("/canopy/brokers/1")
            assert kv == KeyValue("/canopy/brokers/1", b'{"host": "a"}', rev1, rev1, 1, 0)
            assert (await etcd.get("/canopy/brokers/2")).value == b""
            assert (await etcd.get("/canopy/topics/t")).value == b"\x00\xff binary"
            assert await etcd.get("/canopy/brokers/3") is None

            rev3 = await etcd.put("/canopy/brokers/1", b"v2")
            kv = await etcd.get("/canopy/brokers/1")
            assert (kv.create_revision, kv.mod_revision, kv.version) == (rev1, rev3, 2)

            kvs, rev = await etcd.get_prefix("/canopy/brokers/")
            assert [k.key for k in kvs] == ["/canopy/brokers/1", "/canopy/brokers/2"]
            assert rev == rev3
            everything, _ = await etcd.get_prefix("")
            assert {"/canopy/brokers/1", "/canopy/brokers0", "/canopy/topics/t"} <= {k.key for k in everything}

            assert await etcd.delete("/canopy/brokers/9") == 0
            assert await etcd.delete("/canopy/brokers/", prefix=True) == 2
            assert (await etcd.get_prefix("/canopy/brokers/"))[0] == []
            assert (await etcd.get("/canopy/brokers0")).value == b"outside the prefix"
    run(main)


def test_txn_compare_success_and_failure(etcd_cluster):
    async def main():
        async with EtcdClient(etcd_cluster.endpoints) as etcd:
            key = "/canopy/controller"
            # Create only if absent (create_revision 0 = no such key): Kafka's controller
            # election writes its ephemeral znode the same way.
            r = await etcd.txn([Compare.create_revision(key, "=", 0)],
                               [Op.put(key, b"broker-1"), Op.get(key)], [Op.get(key)])
            assert r.succeeded
            mine = r.responses[1][0]
            assert mine.value == b"broker-1" and mine.create_revision == r.revision
            assert "header" in r.responses[0]

            r = await etcd.txn([Compare.create_revision(key, "=", 0)], [Op.put(key, b"broker-2")],
                               [Op.get(key)])
            assert not r.succeeded
            assert [kv.value for kv in r.responses[0]] == [b"broker-1"]

            # broker-1 loses the key and broker-2 takes it; broker-1's write guarded by
            # its old create_revision (a stale controller, KAFKA-6082) must be refused.
            assert await etcd.delete(key) == 1
            r2 = await etcd.txn([Compare.create_revision(key, "=", 0)], [Op.put(key, b"broker-2")])
            assert r2.succeeded
            stale = await etcd.txn([Compare.create_revision(key, "=", mine.create_revision)],
                                   [Op.put("/canopy/partitions/t/0", b"stale write")])
            assert not stale.succeeded and stale.responses == []
            assert await etcd.get("/canopy/partitions/t/0") is None

            # Other targets: version, mod_revision, value.
            kv = await etcd.get(key)
            r = await etcd.txn([Compare.version(key, "=", 1), Compare.mod_revision(key, "=", kv.mod_revision),
                                Compare.value(key, "=", b"broker-2")],
                               [Op.put(key, b"broker-2b"), Op.delete("/nothing", prefix=True)])
            assert r.succeeded and r.responses[1] == {"header": {"revision": str(r.revision)}}
            r = await etcd.txn([Compare.value(key, "!=", b"broker-2b")], [Op.delete(key)])
            assert not r.succeeded and (await etcd.get(key)).value == b"broker-2b"
    run(main)


def test_etcd_error_is_not_failover(etcd_cluster):
    async def main():
        async with EtcdClient(etcd_cluster.endpoints) as etcd:
            before = etcd.current_endpoint
            with pytest.raises(EtcdError) as e:
                await etcd.put("/k", b"v", lease=123456789)
            assert not isinstance(e.value, EtcdUnavailable)
            assert e.value.code == 5 and "requested lease not found" in str(e.value)
            assert before in str(e.value) and "\n" not in str(e.value)
            assert etcd.current_endpoint == before
    run(main)


def test_lease_keepalive_then_expiry_deletes_keys(etcd_cluster):
    async def main():
        async with EtcdClient(etcd_cluster.endpoints) as etcd:
            lease = await etcd.lease_grant(2)
            assert lease > 0
            await etcd.put("/canopy/brokers/1", b"alive", lease=lease)
            assert (await etcd.get("/canopy/brokers/1")).lease == lease
            # Kept alive past its TTL, the key stays.
            for _ in range(6):
                assert await etcd.lease_keepalive(lease) == 2
                await trio.sleep(0.5)
            assert 0 < await etcd.lease_ttl(lease) <= 2
            assert await etcd.get("/canopy/brokers/1") is not None

            # No more keepalives: the lease expires and its key goes with it.
            async def gone():
                return await etcd.get("/canopy/brokers/1") is None
            await eventually(gone, "the leased key to disappear")
            assert await etcd.lease_ttl(lease) == -1
            assert await etcd.lease_keepalive(lease) == 0
    run(main)


def test_lease_revoke(etcd_cluster):
    async def main():
        async with EtcdClient(etcd_cluster.endpoints) as etcd:
            lease = await etcd.lease_grant(60)
            await etcd.put("/canopy/brokers/1", b"x", lease=lease)
            await etcd.put("/canopy/brokers/2", b"y", lease=lease)
            await etcd.lease_revoke(lease)
            assert (await etcd.get_prefix("/canopy/brokers/"))[0] == []
            assert await etcd.lease_ttl(lease) == -1
            assert await etcd.lease_keepalive(lease) == 0
            await etcd.lease_revoke(lease)      # already gone: not an error
            with pytest.raises(EtcdError):
                await etcd.put("/canopy/brokers/3", b"z", lease=lease)
    run(main)


def test_watch_sees_puts_and_deletes_in_order_from_a_revision(etcd_cluster):
    async def main():
        async with EtcdClient(etcd_cluster.endpoints) as etcd:
            before = await etcd.put("/canopy/topics/a", b"1")
            await etcd.put("/canopy/other", b"not watched")
            await etcd.put("/canopy/topics/b", b"2")
            await etcd.delete("/canopy/topics/a")
            await etcd.txn([], [Op.put("/canopy/topics/c", b"3"), Op.put("/canopy/topics/d", b"4")])
            # Starting AT `before` includes the put made at `before`.
            seen = []
            with trio.fail_after(HANG_GUARD):
                async with etcd.watch("/canopy/topics/", before) as w:
                    async for events in w:
                        seen += events
                        if len(seen) >= 5:
                            break
            assert [(e.type, e.kv.key, e.kv.value) for e in seen] == [
                ("PUT", "/canopy/topics/a", b"1"), ("PUT", "/canopy/topics/b", b"2"),
                ("DELETE", "/canopy/topics/a", b""), ("PUT", "/canopy/topics/c", b"3"),
                ("PUT", "/canopy/topics/d", b"4")]
            revs = [e.kv.mod_revision for e in seen]
            assert revs == sorted(revs) and revs[0] == before
            assert revs[3] == revs[4]        # one txn, one revision

            # Live events, one list per etcd watch response.
            with trio.fail_after(HANG_GUARD):
                async with etcd.watch("/canopy/topics/", revs[-1] + 1) as w:
                    rev = await etcd.put("/canopy/topics/e", b"5")
                    events = await w.__anext__()
                    assert [(e.type, e.kv.key, e.kv.mod_revision) for e in events] == [
                        ("PUT", "/canopy/topics/e", rev)]
                    with pytest.raises(RuntimeError):
                        async for _ in etcd.watch("/x/", 1):
                            pass
    run(main)


def test_watch_of_a_compacted_revision(etcd_cluster):
    async def main():
        async with EtcdClient(etcd_cluster.endpoints) as etcd:
            first = await etcd.put("/canopy/topics/a", b"1")
            last = await etcd.put("/canopy/topics/a", b"2")
            m = etcd_cluster.members[0]
            code, answer = await trio.to_thread.run_sync(
                gateway_call, m.host, m.client_port, "/v3/kv/compaction", {"revision": str(last)})
            assert code == 200, answer
            with pytest.raises(WatchCompacted) as e:
                with trio.fail_after(HANG_GUARD):
                    async with etcd.watch("/canopy/topics/", first) as w:
                        async for _ in w:
                            pass
            assert e.value.compact_revision == last
            async with etcd.watch("/canopy/topics/", last) as w:
                events = await w.__anext__()
            assert [(e.kv.value, e.kv.mod_revision) for e in events] == [(b"2", last)]
    run(main)


def test_watch_resumes_on_another_member_after_its_member_is_killed(etcd_cluster):
    async def main():
        async with client_for(etcd_cluster, request_timeout=2.0) as etcd, \
                client_for(etcd_cluster, order=[1, 2], request_timeout=2.0) as writer:
            watched = etcd_cluster.members[0]
            start = await writer.put("/canopy/p/0", b"0")
            seen = []
            with trio.fail_after(HANG_GUARD):
                with pytest.raises(EtcdUnavailable) as e:
                    async with etcd.watch("/canopy/p/", start) as w:
                        assert w.endpoint == watched.endpoint
                        async for events in w:
                            seen += events
                            if len(seen) == 1:
                                for i in range(1, 4):
                                    await writer.put(f"/canopy/p/{i}", str(i).encode())
                            if len(seen) == 4:
                                await trio.to_thread.run_sync(watched.kill9)
                                # (The killed member may have been etcd's leader: the
                                # writes then wait out an election, "no leader" meanwhile.)
                                for i in range(4, 10):
                                    await eventually(
                                        lambda i=i: _put_or_none(
                                            writer, f"/canopy/p/{i}", str(i).encode()),
                                        "a write to the two live members")
            assert watched.endpoint in str(e.value) and "\n" not in str(e.value)
            # Re-watch from the next revision: the client has moved to another member and
            # sees every later put exactly once, in order.
            with trio.fail_after(HANG_GUARD):
                assert w.next_revision == seen[-1].kv.mod_revision + 1
                async with etcd.watch("/canopy/p/", w.next_revision) as w:
                    assert w.endpoint != watched.endpoint
                    async for events in w:
                        seen += events
                        if len(seen) >= 10:
                            break
            assert [e.kv.key for e in seen] == [f"/canopy/p/{i}" for i in range(10)]
            revs = [e.kv.mod_revision for e in seen]
            assert revs == list(range(start, start + 10))
    run(main)


def test_watch_gives_up_on_a_frozen_member(etcd_cluster):
    # SIGSTOP keeps the TCP connection open and silent: only the liveness check notices.
    async def main():
        async with client_for(etcd_cluster, request_timeout=1.0) as etcd, \
                client_for(etcd_cluster, order=[1, 2], request_timeout=2.0) as writer:
            frozen = etcd_cluster.members[0]
            start = await writer.put("/canopy/p/0", b"0")
            with trio.fail_after(HANG_GUARD):
                with pytest.raises(EtcdUnavailable) as e:
                    async with etcd.watch("/canopy/p/", start, liveness_interval=0.5) as w:
                        async for events in w:
                            frozen.pause()
                            # (The frozen member may be etcd's leader: the write then waits
                            # out an election on the other two, "no leader" meanwhile.)
                            await eventually(lambda: _put_or_none(writer, "/canopy/p/1", b"1"),
                                             "a write to the two live members")
                assert frozen.endpoint in str(e.value)
                async with etcd.watch("/canopy/p/", start + 1) as w:
                    assert w.endpoint != frozen.endpoint
                    events = await w.__anext__()
            assert [e.kv.key for e in events] == ["/canopy/p/1"]
            frozen.resume()
    run(main)


def test_requests_fail_over_when_a_member_is_killed_or_frozen(etcd_cluster):
    async def main():
        # The request timeout must outlast an etcd leader election (~1-2 s here): a write
        # sent to a follower while the cluster elects is held until there is a leader.
        async with client_for(etcd_cluster, request_timeout=4.0) as etcd:
            first = etcd_cluster.members[0]
            assert etcd.current_endpoint == first.endpoint
            await etcd.put("/k", b"1")
            await trio.to_thread.run_sync(first.kill9)
            with trio.fail_after(HANG_GUARD):
                await etcd.put("/k", b"2")
                # The next member, or the one after it if the next answered that the
                # leader changed under the write.
                assert etcd.current_endpoint != first.endpoint
                assert (await etcd.get("/k")).value == b"2"
            # The killed member comes back with its data directory and catches up.
            first.start()   # Popen only: quick, and from the main thread (PDEATHSIG)
            await trio.to_thread.run_sync(etcd_cluster.wait_ready)
            async with client_for(etcd_cluster, order=[0]) as only_first:
                assert (await only_first.get("/k")).value == b"2"
            # A frozen member accepts connections (the kernel does) but never answers:
            # the request times out and moves on.
            frozen = next(m for m in etcd_cluster.members if m.endpoint == etcd.current_endpoint)
            frozen.pause()
            try:
                with trio.fail_after(HANG_GUARD):
                    lease = await etcd.lease_grant(5)
                    assert etcd.current_endpoint != frozen.endpoint
                    assert await etcd.lease_keepalive(lease) == 5
            finally:
                frozen.resume()
    run(main)


def test_majority_down_raises_unavailable_instead_of_hanging(etcd_cluster):
    async def main():
        async with client_for(etcd_cluster, order=[2, 0, 1], request_timeout=2.0) as etcd:
            lease = await etcd.lease_grant(30)
            rev = await etcd.put("/k", b"1")
            for m in etcd_cluster.members[:2]:
                await trio.to_thread.run_sync(m.stop)
            survivor = etcd_cluster.members[2]

            # Once the survivor's election timeout has passed it knows it has no leader
            # (before that, requests wait on it and time out).
            async def survivor_knows():
                s = await trio.to_thread.run_sync(survivor.status)
                return s is not None and "etcdserver: no leader" in (s.get("errors") or [])
            await eventually(survivor_knows, "the survivor to notice it has no leader")
            calls = [lambda: etcd.get("/k"), lambda: etcd.get_prefix("/"),
                     lambda: etcd.put("/k", b"2"), lambda: etcd.delete("/k"),
                     lambda: etcd.txn([], [Op.put("/k", b"3")]), lambda: etcd.lease_grant(5),
                     lambda: etcd.lease_keepalive(lease), lambda: etcd.lease_ttl(lease),
                     lambda: etcd.lease_revoke(lease)]
            for call in calls:
                with trio.fail_after(HANG_GUARD):
                    with pytest.raises(EtcdUnavailable) as e:
                        await call()
                msg = str(e.value)
                assert "\n" not in msg and "Traceback" not in msg
                # The stopped members refuse connections; the survivor answers at once
                # that it has no leader (hasleader is set on every request).
                assert f"{survivor.endpoint}: etcdserver: no leader" in msg, msg
                for m in etcd_cluster.members[:2]:
                    assert m.endpoint in msg
            with trio.fail_after(HANG_GUARD):
                with pytest.raises(EtcdUnavailable):
                    async with etcd.watch("/", rev):
                        pass
                health = await etcd.health()
            assert [h["endpoint"] for h in health] == [m.endpoint for m in
                                                       (survivor, *etcd_cluster.members[:2])]
            assert not any(h["healthy"] or h["leader"] for h in health)
            assert all(h["error"] for h in health)

            # A quorum again: the same client works without being recreated.
            etcd_cluster.members[0].start()

            async def writable():
                try:
                    await etcd.put("/k", b"4")
                    return True
                except EtcdUnavailable:
                    return False
            await eventually(writable, "a quorum after restarting one member")
            assert (await etcd.get("/k")).value == b"4"
    run(main)


def test_majority_frozen_raises_unavailable(etcd_cluster):
    # Frozen members hold connections open; the survivor needs an election timeout to
    # notice it lost the leader. Each call is bounded by endpoints x request_timeout.
    async def main():
        async with client_for(etcd_cluster, request_timeout=1.0) as etcd:
            await etcd.put("/k", b"1")
            for m in etcd_cluster.members[:2]:
                m.pause()
            try:
                for _ in range(3):
                    with trio.fail_after(HANG_GUARD):
                        with pytest.raises(EtcdUnavailable) as e:
                            await etcd.put("/k", b"2")
                    assert "timed out after 1s" in str(e.value)
            finally:
                for m in etcd_cluster.members[:2]:
                    m.resume()
            async def readable():
                try:
                    return await etcd.get("/k")
                except EtcdUnavailable:
                    return None
            kv = await eventually(readable, "reads after the members resume")
            # A put that timed out here is not necessarily lost: its request sat in the
            # frozen member's socket buffer and may be applied once the member resumes.
            # Callers that care guard such writes with a txn compare.
            assert kv.value in (b"1", b"2")
    run(main)


def test_health_reports_every_member_and_the_leader(etcd_cluster):
    async def main():
        async with EtcdClient(etcd_cluster.endpoints) as etcd:
            health = await etcd.health()
            assert [h["endpoint"] for h in health] == [m.endpoint for m in etcd_cluster.members]
            assert all(h["healthy"] and h["error"] is None for h in health), health
            leaders = [h["endpoint"] for h in health if h["leader"]]
            assert leaders == [etcd_cluster.leader().endpoint]
    run(main)


def test_no_etcd_listening_is_unavailable(tmp_path):
    async def main():
        port = free_port("127.0.0.21")
        async with EtcdClient(f"etcd://127.0.0.21:{port}", request_timeout=2.0) as etcd:
            with trio.fail_after(HANG_GUARD):
                with pytest.raises(EtcdUnavailable) as e:
                    await etcd.get("/k")
            assert f"127.0.0.21:{port}" in str(e.value) and "\n" not in str(e.value)
            health = await etcd.health()
            assert health[0]["healthy"] is False and health[0]["error"]
    run(main)


def test_cluster_fixture_endpoints_and_leader(etcd_cluster):
    assert etcd_cluster.endpoints == "etcd://" + ",".join(
        f"{m.host}:{m.client_port}" for m in etcd_cluster.members)
    assert [m.host for m in etcd_cluster.members] == ["127.0.0.21", "127.0.0.22", "127.0.0.23"]
    old = etcd_cluster.leader()
    assert old is not None
    old.kill9()
    new = wait_for_sync(etcd_cluster.leader, "a new etcd leader")
    assert new is not old and new.alive
    key = base64.b64encode(b"/after-election").decode()
    code, answer = gateway_call(new.host, new.client_port, "/v3/kv/put", {"key": key, "value": ""})
    assert code == 200, answer
