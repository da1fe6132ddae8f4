"""Replication trees (seed 000: "a slave can have slaves": 8 splits over 4 hops reach
4096 leaves).

A partition's replica list is kept in breadth-first order of its tree: replicas[0] is
the root, which is the leader, and the parent of replicas[i] is replicas[(i - 1) // fanout].
So the list that Metadata reports as "replicas" is also the whole tree, and every broker
that knows the list and the fan-out derives the same parent/children for every replica.
Only the leader's direct children are candidates for the ISR; deeper tiers replicate
asynchronously from their own upstream.
"""
from __future__ import annotations


def parent_of(replicas: list[int], node: int, fanout: int) -> int | None:
    """The upstream a replica fetches from; None for the leader or a non-replica."""
    try:
        i = replicas.index(node)
    except ValueError:
        return None
    return None if i == 0 else replicas[(i - 1) // fanout]


def children_of(replicas: list[int], node: int, fanout: int) -> list[int]:
    try:
        i = replicas.index(node)
    except ValueError:
        return []
    first = i * fanout + 1
    return replicas[first:first + fanout]


def promote(replicas: list[int], new_leader: int, demoted: int | None = None) -> list[int]:
    """The tree after ``new_leader`` takes over: it becomes the root, the others keep their
    breadth-first order (so most replicas keep a nearby upstream), and the replaced leader
    (``demoted``) moves to the end, a leaf: when it returns it rejoins as a follower and
    must first truncate what was never committed."""
    rest = [r for r in replicas if r not in (new_leader, demoted)]
    out = [new_leader, *rest]
    if demoted is not None and demoted in replicas and demoted != new_leader:
        out.append(demoted)
    return out


def assign_replicas(brokers: list[int], partition: int, replication_factor: int) -> list[int]:
    """Spread leaders over brokers by rotating the sorted broker list per partition (any
    broker may lead: the controller is elected and fails over like everything else)."""
    ordered = sorted(brokers)
    n = len(ordered)
    rotated = [ordered[(partition + k) % n] for k in range(n)]
    return rotated[:min(replication_factor, n)]


def preferred_leader(replicas: list[int], partition: int) -> int:
    """Kafka's preferred leader is the first replica of the assignment; canopy reorders
    its trees on every promotion, so it recomputes it the way assign_replicas picks the
    first replica: the partition index rotates through the sorted replica set (for a topic
    spread over every broker this is the leader it was created with)."""
    ordered = sorted(replicas)
    return ordered[partition % len(ordered)]


def render(replicas: list[int], fanout: int) -> list[str]:
    """Indented lines showing the tree, for `canopy cluster describe`."""
    lines: list[str] = []

    def walk(node: int, depth: int) -> None:
        role = "leader" if depth == 0 else f"tier {depth}"
        lines.append(f"{'  ' * depth}{node} ({role})")
        for c in children_of(replicas, node, fanout):
            walk(c, depth + 1)

    if replicas:
        walk(replicas[0], 0)
    return lines
