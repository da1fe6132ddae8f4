"""acks=all answers wait for the high watermark: each wakes once, when the HW covers its
batch (or when leadership moves), never on appends or on HW moves short of it. Before, a
producer's 16 pipelined answers each woke and parked again on every append and every
child's fetch (broker/topics.py, Partition._hw_waiters)."""
from __future__ import annotations

import uuid

import trio
import trio.testing

from broker.topics import Partition, Topic
from protocol.records import build_batch
from storage import Log, LogConfig


def _leader(tmp_path) -> Partition:
    d = tmp_path / "t"
    d.mkdir(parents=True, exist_ok=True)
    topic = Topic("t", uuid.uuid4(), {}, d)
    p = Partition(topic, 0, Log(d / "0", LogConfig()), node_id=0)
    topic.partitions.append(p)
    # leader 0 with two direct children, both in the committed ISR
    p.set_assignment([0, 1, 2], 2, 1, isr=[0, 1, 2])
    return p


def _append(p: Partition, n: int = 2) -> int:
    """Append a batch of n records as the Produce handler does; returns the log end."""
    r = p.log.append(build_batch([(None, b"x" * 100, [], None)] * n), leader_epoch=p.leader_epoch)
    p.on_leader_append(r.base_offset)
    return p.log.log_end_offset


def _fetch(p: Partition, offset: int) -> None:
    for child in (1, 2):
        p.record_replica_fetch(child, offset, 1_000)


class _Steps(trio.abc.Instrument):
    """How often each task named ``waiter-*`` was run."""

    def __init__(self):
        self.steps: dict[str, int] = {}

    def before_task_step(self, task):
        if task.name.startswith("waiter-"):
            self.steps[task.name] = self.steps.get(task.name, 0) + 1


def test_a_waiter_wakes_once_when_the_high_watermark_covers_it(tmp_path):
    p = _leader(tmp_path)
    ends = [_append(p) for _ in range(3)]
    results: dict[int, bool] = {}

    async def waiter(i: int) -> None:
        results[i] = await p.wait_for_high_watermark(ends[i], 10)

    async def main():
        steps = _Steps()
        trio.lowlevel.add_instrument(steps)
        async with trio.open_nursery() as n:
            for i in range(3):
                n.start_soon(waiter, i, name=f"waiter-{i}")
            await trio.testing.wait_all_tasks_blocked()
            parked = dict(steps.steps)
            assert parked == {f"waiter-{i}": 1 for i in range(3)}
            for _ in range(20):   # appends and HW moves short of every waiter: nobody runs
                _append(p)
                await trio.testing.wait_all_tasks_blocked()
            _fetch(p, ends[0] - 1)
            await trio.testing.wait_all_tasks_blocked()
            assert steps.steps == parked and not results
            _fetch(p, ends[1])   # covers waiters 0 and 1, not 2
            await trio.testing.wait_all_tasks_blocked()
            assert results == {0: True, 1: True}
            assert steps.steps["waiter-2"] == 1
            _fetch(p, p.log.log_end_offset)
        assert results == {0: True, 1: True, 2: True}
        assert all(v == 2 for v in steps.steps.values())   # parked once, woken once

    trio.run(main)


def test_a_leadership_change_wakes_every_waiter(tmp_path):
    p = _leader(tmp_path)
    end = _append(p)
    results = []

    async def waiter():
        results.append(await p.wait_for_high_watermark(end, 10))

    async def main():
        with trio.fail_after(5):
            async with trio.open_nursery() as n:
                n.start_soon(waiter)
                n.start_soon(waiter)
                await trio.testing.wait_all_tasks_blocked()
                p.set_assignment([1, 0, 2], 2, 2, isr=[1, 0, 2])   # node 1 leads epoch 2 now

    trio.run(main)
    assert results == [False, False]


def test_a_waiter_times_out(tmp_path):
    p = _leader(tmp_path)
    end = _append(p)

    async def main():
        return await p.wait_for_high_watermark(end, 0.05)

    assert trio.run(main) is False
    _fetch(p, end)   # a late HW move finds the timed-out waiter's event: harmless
    assert p.high_watermark == end
