"""broker/cluster.py's fetcher manager: one UpstreamFetcher per upstream a local follower
replica fetches from, started when metadata names a new upstream. No etcd, no sockets:
the manager runs on a stand-in for the Cluster with scripted partitions."""
from types import SimpleNamespace

import trio
import trio.testing

from broker.cluster import Cluster


def follower_of(upstream: int) -> SimpleNamespace:
    return SimpleNamespace(is_replica=True, is_leader=False, upstream=upstream)


class Stand:
    """The attributes _manage_fetchers uses; _run_fetcher records which upstreams got a
    fetcher and, for upstream 1, lets a second topic's metadata arrive (a change
    signalled) while that fetcher is starting, as when two topics are created back to
    back (bench/tree_fanout.py: a leaf then never fetched from its upstream)."""

    _manage_fetchers = Cluster._manage_fetchers

    def __init__(self) -> None:
        self.partitions = [follower_of(1)]
        self._changed = trio.Event()
        self._fetchers = {}
        self.broker = SimpleNamespace(topics=SimpleNamespace(all_partitions=lambda: list(self.partitions)))
        self.started: list[int] = []

    def _address(self, node: int) -> tuple[str, int]:
        return ("127.0.0.1", 9000 + node)

    def _signal(self) -> None:   # as Cluster._signal
        self._changed.set()
        self._changed = trio.Event()

    async def _run_fetcher(self, node, addr, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            self.started.append(node)
            if node == 1:
                self.partitions.append(follower_of(2))
                self._signal()
            await trio.lowlevel.checkpoint()
            task_status.started(scope)
            await trio.sleep_forever()


def test_a_change_signalled_while_a_fetcher_starts_is_not_lost():
    stand = Stand()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stand._manage_fetchers)
            # virtual time (autojump): an hour passes at once if the manager sleeps forever
            with trio.move_on_after(3600):
                while 2 not in stand.started:
                    await trio.sleep(1)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert stand.started == [1, 2]
