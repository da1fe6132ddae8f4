"""One consumer group's membership state machine (Kafka's classic group protocol).

Sans-IO: every method takes ``now`` (seconds, from ``trio.current_time()`` in the
coordinator, a plain number in tests) and either answers at once or hands back a
``Waiter`` the caller awaits. Time-driven transitions (session expiry, the end of the
join phase, the sync deadline) happen in ``tick(now)``; ``next_deadline()`` tells the
coordinator's timer task when to call it next. Nothing here touches sockets or disks.

States, as in Kafka's GroupMetadata::

    Empty --join--> PreparingRebalance --all joined / rebalance timeout--> CompletingRebalance
    CompletingRebalance --leader's SyncGroup--> Stable
    Stable / CompletingRebalance --join of new member, leave, expiry, leader rejoin--> PreparingRebalance
    PreparingRebalance --no member left--> Empty

Error codes are Kafka's (protocol.errors.ErrorCode) so handlers pass them straight through.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from protocol.errors import ErrorCode

EMPTY = "Empty"
PREPARING_REBALANCE = "PreparingRebalance"
COMPLETING_REBALANCE = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"
STATES = (EMPTY, PREPARING_REBALANCE, COMPLETING_REBALANCE, STABLE, DEAD)

NONE = ErrorCode.NONE


class Waiter:
    """A one-shot result slot. ``complete`` is idempotent (first result wins), so a
    member that is answered early (e.g. fenced) is never answered twice."""

    __slots__ = ("done", "result", "_event")

    def __init__(self):
        self.done = False
        self.result = None
        self._event = None

    def complete(self, result) -> None:
        if self.done:
            return
        self.done = True
        self.result = result
        if self._event is not None:
            self._event.set()

    async def wait(self):
        if not self.done:
            import trio
            self._event = trio.Event()
            await self._event.wait()
        return self.result


@dataclass
class JoinResult:
    error: int
    member_id: str = ""
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    # Only the leader receives the members (Kafka: followers get an empty list).
    members: list = field(default_factory=list)   # [(member_id, group_instance_id, metadata)]


@dataclass
class SyncResult:
    error: int
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list                      # [(name, metadata bytes)] in the member's preference order
    assignment: bytes = b""
    heartbeat_deadline: float = 0.0
    join_waiter: Waiter | None = None
    sync_waiter: Waiter | None = None

    def protocol_names(self) -> list[str]:
        return [n for n, _ in self.protocols]

    def metadata(self, protocol: str) -> bytes:
        for n, m in self.protocols:
            if n == protocol:
                return m
        return b""

    def matches(self, protocols: list) -> bool:
        return [(n, bytes(m)) for n, m in protocols] == [(n, bytes(m)) for n, m in self.protocols]

    @property
    def awaiting_join(self) -> bool:
        return self.join_waiter is not None and not self.join_waiter.done

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_waiter is not None and not self.sync_waiter.done


def new_member_id(client_id: str) -> str:
    # Kafka: clientId + "-" + UUID; tools such as kafka-consumer-groups show it as is.
    return f"{client_id}-{uuid.uuid4()}"


class Group:
    def __init__(self, group_id: str, *, initial_rebalance_delay_ms: int = 0):
        self.group_id = group_id
        self.state = EMPTY
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}     # group_instance_id -> member_id
        # Member ids handed out with MEMBER_ID_REQUIRED, not yet joined: id -> expiry time.
        self.pending_members: dict[str, float] = {}
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.rebalance_deadline = 0.0
        self.join_not_before = 0.0       # group.initial.rebalance.delay.ms window
        self.sync_deadline = 0.0

    # -- queries -----------------------------------------------------------------
    def is_empty_membership(self) -> bool:
        return not self.members and not self.pending_members

    def supported_protocols(self) -> set[str] | None:
        """Protocols every current member supports (None when there are no members)."""
        out = None
        for m in self.members.values():
            names = set(m.protocol_names())
            out = names if out is None else out & names
        return out

    def _protocols_compatible(self, protocol_type: str, protocols: list) -> bool:
        # Kafka GroupMetadata.isGroupProtocolsCompatible / supportsProtocols.
        if not protocol_type or not protocols:
            return False
        if not self.members:
            return True
        if protocol_type != self.protocol_type:
            return False
        common = self.supported_protocols() or set()
        return bool(common & {n for n, _ in protocols})

    def _max_rebalance_timeout_s(self) -> float:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0) / 1000

    def select_protocol(self) -> str:
        """Kafka's GroupMetadata.selectProtocol: every member votes for its most preferred
        protocol among those all members support; most votes wins. Ties go to the
        leader's preference order (Kafka leaves ties unspecified)."""
        candidates = self.supported_protocols() or set()
        votes: dict[str, int] = {}
        for m in self.members.values():
            for n in m.protocol_names():
                if n in candidates:
                    votes[n] = votes.get(n, 0) + 1
                    break
        leader = self.members.get(self.leader_id) or next(iter(self.members.values()))
        order = [n for n in leader.protocol_names() if n in candidates]
        return max(order, key=lambda n: (votes.get(n, 0), -order.index(n)))

    def next_deadline(self) -> float | None:
        times = []
        for m in self.members.values():
            if not (m.awaiting_join or m.awaiting_sync):
                times.append(m.heartbeat_deadline)
        times.extend(self.pending_members.values())
        if self.state == PREPARING_REBALANCE:
            times.append(self.join_not_before if self._all_joined() else self.rebalance_deadline)
        elif self.state == COMPLETING_REBALANCE:
            times.append(self.sync_deadline)
        return min(times) if times else None

    def _all_joined(self) -> bool:
        # Kafka hasAllMembersJoined: every member awaits a JoinGroup response and no
        # member id handed out with MEMBER_ID_REQUIRED is still outstanding.
        return all(m.awaiting_join for m in self.members.values()) and not self.pending_members

    # -- JoinGroup ---------------------------------------------------------------
    def join(self, now: float, *, member_id: str, group_instance_id: str | None, client_id: str,
             client_host: str, session_timeout_ms: int, rebalance_timeout_ms: int,
             protocol_type: str, protocols: list, require_known_member_id: bool):
        """Returns a JoinResult (answered at once) or a Waiter (held until the join
        phase completes, Kafka's DelayedJoin)."""
        if rebalance_timeout_ms < 0:
            rebalance_timeout_ms = session_timeout_ms   # v0 has none; Kafka uses the session timeout
        protocols = [(n, bytes(m)) for n, m in protocols]
        if self.state == DEAD:
            # The group is being deleted; Kafka answers COORDINATOR_NOT_AVAILABLE so the
            # client looks the coordinator up again and retries.
            return JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id)
        if not self._protocols_compatible(protocol_type, protocols):
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)

        if not member_id:
            if group_instance_id is not None and group_instance_id in self.static_members:
                # Static member restarted (KIP-345): it takes over its slot under a fresh id,
                # the old id is fenced. canopy rebalances instead of replaying the old
                # assignment, which is simpler and still correct.
                old_id = self.static_members[group_instance_id]
                old = self.members.get(old_id)
                new_id = new_member_id(client_id)
                if old is not None:
                    self._fence(old)
                    del self.members[old_id]
                    if self.leader_id == old_id:
                        self.leader_id = new_id
                return self._add_member_and_rebalance(
                    now, new_id, group_instance_id, client_id, client_host, session_timeout_ms,
                    rebalance_timeout_ms, protocol_type, protocols)
            new_id = new_member_id(client_id)
            if require_known_member_id and group_instance_id is None:
                # KIP-394 (JoinGroup v4+): hand out the id first; the client rejoins with it,
                # so a client that times out and retries never leaves ghost members.
                self.pending_members[new_id] = now + session_timeout_ms / 1000
                return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, new_id)
            return self._add_member_and_rebalance(
                now, new_id, group_instance_id, client_id, client_host, session_timeout_ms,
                rebalance_timeout_ms, protocol_type, protocols)

        # A known member id.
        if member_id in self.pending_members:
            del self.pending_members[member_id]
            return self._add_member_and_rebalance(
                now, member_id, group_instance_id, client_id, client_host, session_timeout_ms,
                rebalance_timeout_ms, protocol_type, protocols)
        member = self.members.get(member_id)
        err = self._check_static(member_id, group_instance_id)
        if err:
            return JoinResult(err, member_id)
        if member is None:
            return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)

        member.client_id, member.client_host = client_id, client_host
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        if self.state == PREPARING_REBALANCE:
            return self._update_member_and_wait(now, member, protocols)
        if self.state == COMPLETING_REBALANCE:
            if member.matches(protocols):
                # The member lost our JoinGroup response (e.g. a retry after a timeout):
                # Kafka answers again with the current generation.
                return self._join_result(member)
            return self._update_member_and_rebalance(now, member, protocols)
        if self.state == STABLE:
            if member_id == self.leader_id or not member.matches(protocols):
                # The leader rejoining means it wants a new assignment (e.g. metadata
                # changed); a member with new protocols forces one.
                return self._update_member_and_rebalance(now, member, protocols)
            return self._join_result(member)
        return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)

    def _check_static(self, member_id: str, group_instance_id: str | None) -> int:
        # KIP-345: a known instance id with a different member id is a zombie instance.
        if group_instance_id is not None:
            owner = self.static_members.get(group_instance_id)
            if owner is not None and owner != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
        return NONE

    def _fence(self, member: Member) -> None:
        if member.join_waiter:
            member.join_waiter.complete(JoinResult(ErrorCode.FENCED_INSTANCE_ID, member.member_id))
        if member.sync_waiter:
            member.sync_waiter.complete(SyncResult(ErrorCode.FENCED_INSTANCE_ID))

    def _add_member_and_rebalance(self, now, member_id, group_instance_id, client_id, client_host,
                                  session_timeout_ms, rebalance_timeout_ms, protocol_type, protocols):
        member = Member(member_id, group_instance_id, client_id, client_host, session_timeout_ms,
                        rebalance_timeout_ms, protocol_type, protocols)
        waiter = member.join_waiter = Waiter()
        member.heartbeat_deadline = now + session_timeout_ms / 1000
        if not self.members:
            self.protocol_type = protocol_type
        self.members[member_id] = member
        if group_instance_id is not None:
            self.static_members[group_instance_id] = member_id
        if self.leader_id is None or self.leader_id not in self.members:
            self.leader_id = member_id
        if self.state == PREPARING_REBALANCE:
            # Kafka's InitialDelayedJoin: each new member during the initial delay extends
            # the wait by the delay again, up to the rebalance timeout.
            if self.join_not_before > now:
                self.join_not_before = min(now + self.initial_rebalance_delay_ms / 1000,
                                           self.rebalance_deadline)
            self.rebalance_deadline = max(self.rebalance_deadline, now + rebalance_timeout_ms / 1000)
            self._maybe_complete_join(now)
        else:
            self._prepare_rebalance(now)
        return waiter   # the join may have completed already (member.join_waiter is reset then)

    def _update_member_and_wait(self, now, member: Member, protocols) -> Waiter:
        member.protocols = protocols
        if member.join_waiter and not member.join_waiter.done:
            # A second JoinGroup from the same member replaces the first (Kafka answers the
            # older one with an error; the client only listens to the newer).
            member.join_waiter.complete(JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id))
        waiter = member.join_waiter = Waiter()
        self._maybe_complete_join(now)
        return waiter

    def _update_member_and_rebalance(self, now, member: Member, protocols) -> Waiter:
        member.protocols = protocols
        waiter = member.join_waiter = Waiter()
        self._prepare_rebalance(now)
        return waiter

    def _join_result(self, member: Member) -> JoinResult:
        members = []
        if member.member_id == self.leader_id:
            members = [(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
                       for m in self.members.values()]
        return JoinResult(NONE, member.member_id, self.generation_id, self.protocol_type,
                          self.protocol_name, self.leader_id or "", members)

    def _prepare_rebalance(self, now: float) -> None:
        if self.state == COMPLETING_REBALANCE:
            # Kafka resetAndPropagateAssignmentError: members waiting in SyncGroup learn
            # the generation is void and rejoin.
            for m in self.members.values():
                m.assignment = b""
                if m.sync_waiter:
                    m.sync_waiter.complete(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        was_empty = self.state == EMPTY
        self.state = PREPARING_REBALANCE
        self.rebalance_deadline = now + self._max_rebalance_timeout_s()
        if was_empty and self.initial_rebalance_delay_ms > 0:
            # group.initial.rebalance.delay.ms: let more members of a starting group join
            # before the first assignment.
            self.join_not_before = min(now + self.initial_rebalance_delay_ms / 1000,
                                       self.rebalance_deadline)
        else:
            self.join_not_before = now
        self._maybe_complete_join(now)

    def _maybe_complete_join(self, now: float) -> None:
        if self.state != PREPARING_REBALANCE:
            return
        if now < self.join_not_before:
            return
        if self._all_joined() or now >= self.rebalance_deadline:
            self._complete_join(now)

    def _complete_join(self, now: float) -> None:
        # Members that did not rejoin within the rebalance timeout are dropped (Kafka
        # onCompleteJoin: notYetRejoinedMembers are removed), as are outstanding ids.
        for m in [m for m in self.members.values() if not m.awaiting_join]:
            self._remove(m)
        self.pending_members.clear()
        self.generation_id += 1
        if not self.members:
            self.state = EMPTY
            self.protocol_name = None
            self.leader_id = None
            return
        if self.leader_id not in self.members:
            self.leader_id = next(iter(self.members))
        self.protocol_name = self.select_protocol()
        self.state = COMPLETING_REBALANCE
        # Kafka 3.x (KAFKA-13127, pending sync members): members must send SyncGroup within the
        # rebalance timeout, else they are removed and the group rebalances again.
        self.sync_deadline = now + self._max_rebalance_timeout_s()
        for m in self.members.values():
            m.heartbeat_deadline = now + m.session_timeout_ms / 1000
            waiter, m.join_waiter = m.join_waiter, None
            waiter.complete(self._join_result(m))

    def _remove(self, member: Member) -> None:
        self.members.pop(member.member_id, None)
        if member.group_instance_id is not None and \
                self.static_members.get(member.group_instance_id) == member.member_id:
            del self.static_members[member.group_instance_id]
        if self.leader_id == member.member_id:
            self.leader_id = next(iter(self.members), None)

    def _remove_and_rebalance(self, now: float, member: Member, error: int) -> None:
        if member.join_waiter:
            member.join_waiter.complete(JoinResult(error, member.member_id))
        if member.sync_waiter:
            member.sync_waiter.complete(SyncResult(error))
        self._remove(member)
        if self.state in (STABLE, COMPLETING_REBALANCE):
            self._prepare_rebalance(now)
        elif self.state == PREPARING_REBALANCE:
            self._maybe_complete_join(now)

    # -- SyncGroup ---------------------------------------------------------------
    def sync(self, now: float, *, member_id: str, group_instance_id: str | None,
             generation_id: int, protocol_type: str | None, protocol_name: str | None,
             assignments: dict[str, bytes]):
        if self.state == DEAD:
            return SyncResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        member = self.members.get(member_id)
        err = self._check_static(member_id, group_instance_id)
        if err:
            return SyncResult(err)
        if member is None:
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)
        if generation_id != self.generation_id:
            return SyncResult(ErrorCode.ILLEGAL_GENERATION)
        # SyncGroup v5: the client echoes what JoinGroup told it; a mismatch is an error.
        if (protocol_type is not None and protocol_type != self.protocol_type) or \
                (protocol_name is not None and protocol_name != self.protocol_name):
            return SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if self.state == PREPARING_REBALANCE:
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
        if self.state == STABLE:
            # A repeated SyncGroup (lost response): answer with the member's assignment.
            return self._sync_result(member)
        if self.state != COMPLETING_REBALANCE:
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)
        member.heartbeat_deadline = now + member.session_timeout_ms / 1000
        waiter = member.sync_waiter = Waiter()
        if member_id == self.leader_id:
            # The leader's assignment decides; members it left out get empty bytes
            # (Kafka setAndPropagateAssignment).
            for m in self.members.values():
                m.assignment = bytes(assignments.get(m.member_id, b""))
            self.state = STABLE
            for m in self.members.values():
                m.heartbeat_deadline = now + m.session_timeout_ms / 1000
                if m.sync_waiter:
                    m.sync_waiter.complete(self._sync_result(m))
        return waiter

    def _sync_result(self, member: Member) -> SyncResult:
        return SyncResult(NONE, member.assignment, self.protocol_type, self.protocol_name)

    # -- Heartbeat ---------------------------------------------------------------
    def heartbeat(self, now: float, *, member_id: str, group_instance_id: str | None,
                  generation_id: int) -> int:
        if self.state == DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        err = self._check_static(member_id, group_instance_id)
        if err:
            return err
        member = self.members.get(member_id)
        if member is None or self.state == EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != self.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        member.heartbeat_deadline = now + member.session_timeout_ms / 1000
        if self.state == PREPARING_REBALANCE:
            # How members learn they must rejoin (Kafka returns REBALANCE_IN_PROGRESS).
            return ErrorCode.REBALANCE_IN_PROGRESS
        # Kafka treats heartbeats in CompletingRebalance as normal (members may start
        # heartbeating right after their JoinGroup response).
        return NONE

    # -- LeaveGroup --------------------------------------------------------------
    def leave(self, now: float, member_id: str, group_instance_id: str | None) -> tuple[str, int]:
        """One leaving member (v3+ sends several). Returns (member_id, error)."""
        if self.state == DEAD:
            return member_id, ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not member_id and group_instance_id is not None:
            # Admin removal of a static member by instance id (KIP-345).
            member_id = self.static_members.get(group_instance_id, "")
            if not member_id:
                return "", ErrorCode.UNKNOWN_MEMBER_ID
        err = self._check_static(member_id, group_instance_id)
        if err:
            return member_id, err
        if member_id in self.pending_members:
            del self.pending_members[member_id]
            self._maybe_complete_join(now)
            return member_id, NONE
        member = self.members.get(member_id)
        if member is None:
            return member_id, ErrorCode.UNKNOWN_MEMBER_ID
        self._remove_and_rebalance(now, member, ErrorCode.UNKNOWN_MEMBER_ID)
        return member_id, NONE

    # -- OffsetCommit validation ---------------------------------------------------
    def validate_commit(self, now: float, member_id: str, group_instance_id: str | None,
                        generation_id: int) -> int:
        """Kafka GroupCoordinator.doCommitOffsets' checks for a classic group."""
        if self.state == DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and self.state == EMPTY:
            # Standalone commit: assign() users (kcat, Spark) keep offsets in a group
            # that has no members; Kafka accepts generation -1 with any member id.
            return NONE
        err = self._check_static(member_id, group_instance_id)
        if err:
            return err
        if self.state == COMPLETING_REBALANCE:
            # Offsets must wait for the new assignment; clients retry after syncing.
            return ErrorCode.REBALANCE_IN_PROGRESS
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != self.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        # A commit counts as a sign of life (Kafka completeAndScheduleNextHeartbeatExpiration).
        member.heartbeat_deadline = now + member.session_timeout_ms / 1000
        return NONE

    # -- time ------------------------------------------------------------------
    def tick(self, now: float) -> None:
        for mid, expiry in list(self.pending_members.items()):
            if now >= expiry:
                # A client that got MEMBER_ID_REQUIRED and never came back.
                del self.pending_members[mid]
        for m in list(self.members.values()):
            if m.member_id in self.members and not (m.awaiting_join or m.awaiting_sync) \
                    and now >= m.heartbeat_deadline:
                # Session timeout: the member is gone; the others rebalance.
                self._remove_and_rebalance(now, m, ErrorCode.UNKNOWN_MEMBER_ID)
        if self.state == PREPARING_REBALANCE:
            self._maybe_complete_join(now)
        elif self.state == COMPLETING_REBALANCE and now >= self.sync_deadline:
            laggards = [m for m in self.members.values() if not m.awaiting_sync]
            if laggards:
                for m in laggards:
                    self._remove(m)
                self._prepare_rebalance(now)

    # -- describe ----------------------------------------------------------------
    def describe(self) -> dict:
        """DescribeGroups' view. Like Kafka, member metadata and assignments are only
        shown when the group is Stable; the protocol name too."""
        stable = self.state == STABLE
        return {
            "group_id": self.group_id, "group_state": self.state,
            "protocol_type": self.protocol_type or "",
            "protocol_data": (self.protocol_name or "") if stable else "",
            "members": [{
                "member_id": m.member_id, "group_instance_id": m.group_instance_id,
                "client_id": m.client_id, "client_host": m.client_host,
                "member_metadata": m.metadata(self.protocol_name) if stable else b"",
                "member_assignment": m.assignment if stable else b"",
            } for m in self.members.values()],
        }
