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


def changes_for_liveness(image: ClusterImage, live: set[int], unclean: Callable[[str], bool]) -> tuple[list[Change], list[tuple[str, int]]]:
    """(changes, offline partitions). A partition whose leader is not live gets the first
    live committed-ISR member as leader (the tree is re-rooted there, the old leader goes
    last, the leader epoch moves on); a live leader keeps its partition but dead members
    leave its ISR (Kafka's controller does the same on broker failure), so acks=all and
    the high watermark stop waiting for them at once rather than after the lag time.
    A partition with no candidate stays as it is and is reported offline."""
    changes: list[Change] = []
    offline: list[tuple[str, int]] = []
    for name, t in image.topics.items():
        for i, p in enumerate(t.partitions):
            if p.leader not in live:
                e = choose_leader(p.replicas, p.isr, live, unclean(name))
                if e is None:
                    offline.append((name, i))
                    continue
                new = PartitionImage(promote(p.replicas, e.leader, demoted=p.leader), p.leader_epoch + 1,
                                     e.isr, p.mod_revision)
                changes.append(Change(name, i, p, new, "clean election" if e.clean else "UNCLEAN election"))
            elif any(m not in live for m in p.isr):
                new = PartitionImage(list(p.replicas), p.leader_epoch, [m for m in p.isr if m in live],
                                     p.mod_revision)
                changes.append(Change(name, i, p, new, "dead replica leaves the ISR"))
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
