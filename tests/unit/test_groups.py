"""The classic group state machine (broker/groups/group.py), driven with explicit times."""
from protocol.errors import ErrorCode
from broker.groups.group import (COMPLETING_REBALANCE, EMPTY, PREPARING_REBALANCE, STABLE, Group,
                                 JoinResult, SyncResult, Waiter)

PROTOS = [("range", b"r-meta"), ("roundrobin", b"rr-meta")]


def join(g, now, member_id="", *, protocols=PROTOS, session=10_000, rebalance=30_000,
         instance=None, require=True, client="c", protocol_type="consumer"):
    return g.join(now, member_id=member_id, group_instance_id=instance, client_id=client,
                  client_host="/127.0.0.1", session_timeout_ms=session,
                  rebalance_timeout_ms=rebalance, protocol_type=protocol_type,
                  protocols=protocols, require_known_member_id=require)


def first_join(g, now, **kw):
    """The KIP-394 round trip: empty id -> MEMBER_ID_REQUIRED -> rejoin with the id."""
    r = join(g, now, **kw)
    assert isinstance(r, JoinResult) and r.error == ErrorCode.MEMBER_ID_REQUIRED
    assert r.member_id.startswith(kw.get("client", "c") + "-")
    return r.member_id, join(g, now, r.member_id, **kw)


def sync(g, now, mid, gen, assignments=None):
    return g.sync(now, member_id=mid, group_instance_id=None, generation_id=gen,
                  protocol_type=None, protocol_name=None, assignments=assignments or {})


def stable_pair(g, now=0.0):
    a, wa = first_join(g, now, client="a")
    assert wa.done and wa.result.error == 0      # alone: join completes at once
    assert g.state == COMPLETING_REBALANCE and g.generation_id == 1
    sync(g, now, a, 1, {a: b"A1"})
    assert g.state == STABLE
    b, wb = first_join(g, now, client="b")
    assert not wb.done and g.state == PREPARING_REBALANCE
    assert g.heartbeat(now, member_id=a, group_instance_id=None, generation_id=1) == \
        ErrorCode.REBALANCE_IN_PROGRESS
    wa2 = join(g, now, a)
    assert wa2.done and wb.done
    ra, rb = wa2.result, wb.result
    assert ra.generation_id == rb.generation_id == 2
    assert ra.leader == rb.leader == a
    assert {m[0] for m in ra.members} == {a, b} and rb.members == []
    assert ra.protocol_name == "range"
    sa = sync(g, now, b, 2)
    assert isinstance(sa, Waiter) and not sa.done      # follower waits for the leader
    sl = sync(g, now, a, 2, {a: b"A", b: b"B"})
    assert sa.done and sa.result.assignment == b"B" and sl.result.assignment == b"A"
    assert g.state == STABLE
    return a, b


def test_member_id_required_and_two_member_rebalance():
    g = Group("g")
    a, b = stable_pair(g)
    d = g.describe()
    assert d["group_state"] == "Stable" and d["protocol_data"] == "range"
    assert {m["member_assignment"] for m in d["members"]} == {b"A", b"B"}
    assert {m["member_metadata"] for m in d["members"]} == {b"r-meta"}


def test_old_clients_join_without_member_id_round_trip():
    g = Group("g")
    w = join(g, 0.0, require=False)
    assert isinstance(w, Waiter) and w.done and w.result.error == 0 and w.result.member_id


def test_session_timeout_removes_member_and_rebalances():
    g = Group("g")
    a, b = stable_pair(g, 0.0)
    assert g.heartbeat(9.0, member_id=a, group_instance_id=None, generation_id=2) == 0
    assert g.next_deadline() == 10.0                   # b's session
    g.tick(10.0)
    assert b not in g.members and g.state == PREPARING_REBALANCE
    # a is told by its heartbeat, rejoins alone, and the join completes at once.
    assert g.heartbeat(10.5, member_id=a, group_instance_id=None, generation_id=2) == \
        ErrorCode.REBALANCE_IN_PROGRESS
    w = join(g, 10.5, a)
    assert w.done and w.result.generation_id == 3 and [m[0] for m in w.result.members] == [a]
    assert g.heartbeat(11, member_id=b, group_instance_id=None, generation_id=2) == \
        ErrorCode.UNKNOWN_MEMBER_ID


def test_rebalance_timeout_drops_members_that_do_not_rejoin():
    g = Group("g")
    a, b = stable_pair(g, 0.0)
    c, wc = first_join(g, 1.0, client="c", rebalance=5_000)
    # b keeps heartbeating (so its session does not expire) but never rejoins; the join
    # phase lasts the group's largest rebalance timeout (b's 30 s), as in Kafka.
    wa = join(g, 1.0, a, rebalance=5_000)
    for t in (3.0, 9.0, 15.0, 21.0, 27.0):
        assert g.heartbeat(t, member_id=b, group_instance_id=None, generation_id=2) == \
            ErrorCode.REBALANCE_IN_PROGRESS
        g.tick(t)
        assert not wa.done
    assert g.next_deadline() == 31.0
    g.tick(31.0)
    assert wa.done and wc.done
    assert b not in g.members and set(g.members) == {a, c}
    assert g.state == COMPLETING_REBALANCE and g.generation_id == 3


def test_member_id_pending_holds_join_until_rejoin_or_expiry():
    g = Group("g")
    a, b = stable_pair(g)
    r = join(g, 1.0)                                    # a third client gets an id ...
    assert r.error == ErrorCode.MEMBER_ID_REQUIRED
    # A follower with unchanged protocols rejoining in Stable gets the current generation.
    rb = join(g, 1.0, b)
    assert g.state == STABLE and rb.error == 0 and rb.generation_id == 2
    # The leader rejoining starts a rebalance; b rejoins; the phase still waits for the
    # outstanding id until its session timeout (Kafka hasAllMembersJoined).
    wa, wb = join(g, 1.0, a), join(g, 1.0, b)
    assert g.state == PREPARING_REBALANCE and not wa.done
    assert g.next_deadline() == 11.0
    g.tick(11.0)
    assert wa.done and wb.done and wa.result.generation_id == 3
    # The id handed out is gone now: using it is an unknown member.
    assert join(g, 12.0, r.member_id).error == ErrorCode.UNKNOWN_MEMBER_ID


def test_leader_rejoin_triggers_rebalance_and_late_sync_is_rebalance_in_progress():
    g = Group("g")
    a, b = stable_pair(g)
    wa = join(g, 1.0, a)
    assert not wa.done and g.state == PREPARING_REBALANCE
    assert sync(g, 1.0, b, 2).error == ErrorCode.REBALANCE_IN_PROGRESS
    wb = join(g, 1.0, b)
    assert wa.done and wb.done and g.generation_id == 3
    # Leader's SyncGroup never comes; a new member joins meanwhile: the follower waiting
    # in SyncGroup is told to rejoin.
    sb = sync(g, 1.0, b, 3)
    c, wc = first_join(g, 1.0, client="c")
    assert sb.done and sb.result.error == ErrorCode.REBALANCE_IN_PROGRESS


def test_errors():
    g = Group("g")
    a, b = stable_pair(g)
    assert join(g, 1, "nobody").error == ErrorCode.UNKNOWN_MEMBER_ID
    assert join(g, 1, protocols=[("sticky", b"")]).error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert join(g, 1, protocol_type="connect").error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert join(Group("x"), 1, protocols=[]).error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert sync(g, 1, a, 1).error == ErrorCode.ILLEGAL_GENERATION
    assert sync(g, 1, "nobody", 2).error == ErrorCode.UNKNOWN_MEMBER_ID
    assert g.heartbeat(1, member_id=a, group_instance_id=None, generation_id=7) == \
        ErrorCode.ILLEGAL_GENERATION
    assert g.sync(1, member_id=a, group_instance_id=None, generation_id=2, protocol_type="consumer",
                  protocol_name="roundrobin", assignments={}).error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    # A repeated SyncGroup in Stable returns the assignment again.
    assert sync(g, 1, b, 2).assignment == b"B"


def test_protocol_selection_votes_for_common_protocol():
    g = Group("g")
    a, wa = first_join(g, 0, client="a", protocols=[("roundrobin", b"1"), ("range", b"2")])
    sync(g, 0, a, 1, {})
    b, wb = first_join(g, 0, client="b", protocols=[("range", b"3"), ("sticky", b"4")])
    wa = join(g, 0, a, protocols=[("roundrobin", b"1"), ("range", b"2")])
    assert wa.result.protocol_name == "range"           # the only one both support
    assert dict((m[0], m[2]) for m in wa.result.members) == {a: b"2", b: b"3"}


def test_leave_rebalances_and_last_leave_empties_group():
    g = Group("g")
    a, b = stable_pair(g)
    assert g.leave(1, b, None) == (b, 0)
    assert g.state == PREPARING_REBALANCE
    wa = join(g, 1, a)
    assert wa.done and wa.result.generation_id == 3
    assert g.leave(1, a, None) == (a, 0)
    assert g.state == EMPTY and not g.members and g.generation_id == 4
    assert g.leave(1, a, None) == (a, ErrorCode.UNKNOWN_MEMBER_ID)


def test_static_member_rejoin_fences_old_id():
    g = Group("g")
    w = join(g, 0, instance="i1")                       # static members skip KIP-394
    old = w.result.member_id
    sync(g, 0, old, 1, {old: b"x"})
    w2 = join(g, 1, instance="i1")
    assert w2.done and w2.result.member_id != old
    assert g.heartbeat(1, member_id=old, group_instance_id="i1", generation_id=2) == \
        ErrorCode.FENCED_INSTANCE_ID
    assert g.leave(1, "", "i1") == (w2.result.member_id, 0)


def test_commit_validation():
    g = Group("g")
    assert g.validate_commit(0, "", None, -1) == 0       # standalone (assign()) commit
    a, b = stable_pair(g)
    assert g.validate_commit(0, a, None, 2) == 0
    assert g.validate_commit(0, a, None, 1) == ErrorCode.ILLEGAL_GENERATION
    assert g.validate_commit(0, "zz", None, 2) == ErrorCode.UNKNOWN_MEMBER_ID
    assert g.validate_commit(0, "", None, -1) == ErrorCode.UNKNOWN_MEMBER_ID
    join(g, 1, a)                                         # PreparingRebalance: still allowed
    assert g.validate_commit(1, b, None, 2) == 0          # (consumers commit on revoke)
    join(g, 1, b)
    assert g.state == COMPLETING_REBALANCE
    assert g.validate_commit(1, b, None, 3) == ErrorCode.REBALANCE_IN_PROGRESS


def test_initial_rebalance_delay():
    g = Group("g", initial_rebalance_delay_ms=3000)
    a, wa = first_join(g, 0, client="a")
    assert not wa.done and g.next_deadline() == 3.0
    b, wb = first_join(g, 2.0, client="b")                # extends by the delay
    g.tick(3.0)
    assert not wa.done
    g.tick(5.0)
    assert wa.done and wb.done and len(wa.result.members) == 2 or len(wb.result.members) == 2


def test_sync_deadline_removes_members_that_never_sync():
    g = Group("g")
    a, b = stable_pair(g)
    wa, wb = join(g, 1, a, rebalance=4000), join(g, 1, b, rebalance=4000)
    assert wb.done and g.state == COMPLETING_REBALANCE
    sync(g, 1, b, 3)                                    # b syncs, leader a never does
    g.heartbeat(3, member_id=a, group_instance_id=None, generation_id=3)
    g.tick(5.0)
    assert a not in g.members and g.state in (PREPARING_REBALANCE, COMPLETING_REBALANCE)
