"""The replica state machine of one partition, sans-IO (Kafka's Partition state).

Nothing here reads a clock or does I/O: every method that depends on time takes ``now_ms``,
so the rules are tested deterministically (tests/unit/test_replica_state.py).

* **Follower positions.** A leader learns each direct child's log end offset from the
  offset the child fetches at (Kafka's ``updateFollowerFetchState``).
* **Proposed ISR.** The leader proposes the leader plus the direct children that caught
  up with its log end within ``replica.lag.time.max.ms``. A proposal becomes the
  **committed ISR** only when the metadata store accepts it (compare-and-swap on the
  partition's key, Kafka's AlterPartition); until then nothing changes.
* **High watermark over the committed ISR.** The HW is the smallest log end offset among
  the committed ISR, never the proposed one: a leader cut off from the metadata store
  cannot drop a silent follower and go on acknowledging acks=all alone, and a follower
  that the controller elects (always from the committed ISR) holds every record below
  the HW of every leader that ever had it in its ISR.
* **Epochs and truncation points** (``EpochCache``): the first offset of every leader
  epoch in the log, so a returning replica can learn where its log diverged
  (OffsetForLeaderEpoch, KIP-101/279).
* **Election choice** (``choose_leader``): the first live member of the committed ISR in
  tree order; an out-of-sync replica only when unclean election is enabled.
"""
from __future__ import annotations

from dataclasses import dataclass


class FollowerState:
    """What a leader knows about one direct child (Kafka's follower state)."""

    __slots__ = ("log_end_offset", "last_caught_up_ms", "last_fetch_leader_leo", "last_fetch_ms")

    def __init__(self) -> None:
        self.log_end_offset = -1
        self.last_caught_up_ms = -1
        self.last_fetch_leader_leo = -1
        self.last_fetch_ms = -1


class LeaderState:
    """A leader's view of its direct children and of the ISR the metadata store holds."""

    def __init__(self, node_id: int, lag_time_ms: int) -> None:
        self.node_id = node_id
        self.lag_time_ms = lag_time_ms
        self.children: list[int] = []
        self.committed_isr: list[int] = [node_id]
        self.followers: dict[int, FollowerState] = {}
        self.leader_since_ms: int | None = None   # None until the store first makes us leader

    def reset(self, children: list[int], committed_isr: list[int], new_epoch: bool, now_ms: int) -> None:
        """Adopt the store's decision. A new leader epoch forgets what the children
        reported to any earlier leader (they must fetch from this one first) and gives
        the ISR members the lag time to do so (Kafka starts their lastCaughtUpTime at
        the leadership change), so a new leader does not shrink its ISR at once. The
        first reset always starts a leadership, even at an unchanged epoch: a broker
        creates a partition as its own epoch-0 leader before the store's first word
        arrives, and "you lead epoch 0" is then no epoch change."""
        self.children = list(children)
        self.committed_isr = list(committed_isr)
        if new_epoch or self.leader_since_ms is None:
            self.followers.clear()
            self.leader_since_ms = now_ms
        for gone in [c for c in self.followers if c not in self.children]:
            del self.followers[gone]

    def record_fetch(self, child: int, fetch_offset: int, leader_log_end: int, now_ms: int) -> bool:
        """A child fetching at ``fetch_offset`` holds everything below it. It is caught up
        if it reached the leader's log end as of this fetch, or as of its previous fetch
        (Kafka's rule: a follower that keeps fetching at full speed behind a busy leader
        still counts). Returns False for a node that is not a direct child."""
        if child not in self.children:
            return False
        st = self.followers.get(child)
        if st is None:
            st = self.followers[child] = FollowerState()
        if fetch_offset >= leader_log_end:
            st.last_caught_up_ms = now_ms
        elif fetch_offset >= st.last_fetch_leader_leo >= 0:
            st.last_caught_up_ms = max(st.last_caught_up_ms, st.last_fetch_ms)
        st.log_end_offset = fetch_offset
        st.last_fetch_leader_leo = leader_log_end
        st.last_fetch_ms = now_ms
        return True

    def is_caught_up(self, child: int, now_ms: int) -> bool:
        st = self.followers.get(child)
        if st is None or st.last_caught_up_ms < 0:
            return (child in self.committed_isr and self.leader_since_ms is not None
                    and now_ms - self.leader_since_ms <= self.lag_time_ms)
        return now_ms - st.last_caught_up_ms <= self.lag_time_ms

    def proposed_isr(self, now_ms: int) -> list[int]:
        """The ISR this leader would ask the store to record: itself and every direct
        child caught up within the lag time, in tree order."""
        return [self.node_id, *(c for c in self.children if self.is_caught_up(c, now_ms))]

    def high_watermark(self, leader_log_end: int) -> int:
        """The smallest log end offset over the committed ISR. A member that has not
        fetched from this leader yet holds it at -1 (unknown): after an election the HW
        waits until every surviving ISR member has fetched once."""
        hw = leader_log_end
        for member in self.committed_isr:
            if member == self.node_id:
                continue
            st = self.followers.get(member)
            hw = min(hw, st.log_end_offset if st is not None else -1)
        return hw


class EpochCache:
    """(leader epoch, start offset) of every epoch seen in a log, oldest first
    (Kafka's LeaderEpochFileCache)."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, int]] = []

    def clear(self) -> None:
        self.entries = []

    def note(self, epoch: int, start_offset: int) -> None:
        if epoch >= 0 and (not self.entries or epoch > self.entries[-1][0]):
            self.entries.append((epoch, start_offset))

    def latest(self) -> int:
        return self.entries[-1][0] if self.entries else -1

    def end_offset_for(self, epoch: int, log_end_offset: int, current_epoch: int = -1) -> tuple[int, int]:
        """Kafka's endOffsetFor: (epoch, end offset) of the largest epoch <= the one asked,
        ending where the next epoch starts (or at the log end). ``current_epoch`` is a
        leader's own epoch, which may have no batch in the log yet."""
        if epoch < 0:
            return -1, -1
        latest = max(self.latest(), current_epoch)
        if epoch >= latest:
            return latest, log_end_offset
        floor = [e for e, _ in self.entries if e <= epoch]
        next_start = next((s for e, s in self.entries if e > epoch), None)
        if next_start is None:
            # Only the leader's current epoch is newer, and it has no batch yet: the
            # epoch asked for (or the floor of it) runs to the log end.
            next_start = log_end_offset
        return (floor[-1] if floor else epoch), next_start


def truncation_point(own: EpochCache, own_log_end: int, upstream_epoch: int, upstream_end_offset: int) -> int:
    """Where a returning replica must cut its log, given the upstream's answer to
    OffsetForLeaderEpoch for the replica's latest epoch: at the upstream's end offset for
    that epoch, and, when the upstream's largest common epoch is older than ours, also at
    the end of that common epoch in our own log (our later epochs are divergent)."""
    if upstream_end_offset < 0:
        return own_log_end
    target = upstream_end_offset
    if 0 <= upstream_epoch < own.latest():
        target = min(target, own.end_offset_for(upstream_epoch, own_log_end)[1])
    return min(target, own_log_end)


@dataclass(frozen=True)
class Election:
    leader: int
    isr: list[int]
    clean: bool


def choose_leader(replicas: list[int], isr: list[int], live: set[int], unclean: bool) -> Election | None:
    """Kafka's offline-partition election: the first live replica, in tree order, that is
    in the committed ISR (it holds every acknowledged record). With
    ``unclean.leader.election.enable`` the first live replica of any kind, which may have
    lost acknowledged records. None when nobody can lead: the partition stays offline
    until a candidate returns."""
    for r in replicas:
        if r in isr and r in live:
            return Election(r, [r, *(m for m in isr if m != r and m in live and m != replicas[0])], True)
    if unclean:
        for r in replicas:
            if r in live:
                return Election(r, [r], False)
    return None
