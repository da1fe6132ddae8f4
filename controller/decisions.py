"""The controller's decisions, sans-IO: which partitions need a new leader or a smaller
ISR when brokers come and go, and where new partitions' replicas go.

Inputs are the image (controller/image.py) and the set of live brokers (those whose leased
registration key exists); outputs are new partition states for the controller to write
with compare-and-swap. Tested deterministically in tests/unit/test_controller_decisions.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from replication.replica_state import choose_leader
from replication.tree import promote

from .image import ClusterImage, PartitionImage


@dataclass(frozen=True)
class Change:
    topic: str
    index: int
    old: PartitionImage
    new: PartitionImage
    reason: str


def changes_for_liveness(image: ClusterImage, live: set[int],
                         unclean: Callable[[str], bool]) -> tuple[list[Change], list[tuple[str, int]]]:
    """(changes, offline partitions).

    A broker whose registration is newer than a partition's state has restarted since
    that state was written (Kafka's broker epoch, KIP-380): its log may be gone or
    behind, so it counts as failed for that partition, as a dead broker does.

    A partition whose leader is not live (or restarted) gets the first live committed-ISR
    member that did not restart as leader (the tree is re-rooted there, the old leader
    goes last, the leader epoch moves on); only when every live ISR member restarted
    (a whole cluster restarting) may one of them lead again, with a new epoch. A live
    leader keeps its partition but dead or restarted members leave its ISR (Kafka's
    controller does the same on broker failure), so acks=all and the high watermark stop
    waiting for them at once rather than after the lag time; they rejoin once caught up.
    A partition with no candidate stays as it is and is reported offline."""
    changes: list[Change] = []
    offline: list[tuple[str, int]] = []
    for name, t in image.topics.items():
        for i, p in enumerate(t.partitions):
            restarted = {m for m in p.replicas
                         if m in image.brokers and image.brokers[m].registered_revision > p.mod_revision}
            if p.leader not in live or p.leader in restarted:
                stable = [m for m in p.isr if m not in restarted]
                e = choose_leader(p.replicas, stable, live, unclean(name))
                if (e is None or not e.clean) and any(m in restarted for m in p.isr):
                    e = choose_leader(p.replicas, p.isr, live, False) or e
                if e is None:
                    offline.append((name, i))
                    continue
                isr = [e.leader, *(m for m in e.isr[1:] if m not in restarted)]
                new = PartitionImage(promote(p.replicas, e.leader, demoted=p.leader) if e.leader != p.leader
                                     else list(p.replicas), p.leader_epoch + 1, isr, p.mod_revision)
                changes.append(Change(name, i, p, new, "clean election" if e.clean else "UNCLEAN election"))
            elif any(m not in live or m in restarted for m in p.isr):
                new = PartitionImage(list(p.replicas), p.leader_epoch,
                                     [m for m in p.isr if m in live and m not in restarted], p.mod_revision)
                changes.append(Change(name, i, p, new, "dead or restarted replica leaves the ISR"))
    return changes, offline


def reassign(p: PartitionImage, replicas: list[int]) -> PartitionImage:
    """A new tree for a partition (`canopy cluster promote`, AlterPartitionReassignments).
    A new leader must be in the ISR (checked by the caller) and bumps the leader epoch;
    Kafka's election keeps the ISR minus the replaced leader, and the replaced leader
    returns to the ISR once it catches up with the new one."""
    if replicas[0] == p.leader:
        return PartitionImage(list(replicas), p.leader_epoch, list(p.isr), p.mod_revision)
    isr = [replicas[0], *(n for n in p.isr if n not in (p.leader, replicas[0]))]
    return PartitionImage(list(replicas), p.leader_epoch + 1, isr, p.mod_revision)
