"""The broker's state: topics, the flush policy, producer ids, groups, background duties."""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import trio

from protocol.records import InvalidRecordBatch
from storage import LogOffline, cleaner, replace_durably

from .config import BrokerConfig
from .fetch_sessions import FetchSessionCache
from .stats import BrokerStats
from .topics import TopicRegistry

log = logging.getLogger("canopy.broker")
CLEANER_SWITCH_INTERVAL_S = 0.0005

PRODUCER_ID_BLOCK = 1000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    """For timeouts and lag (replica.lag.time.max.ms): wall-clock jumps must not make a
    follower look dead or alive."""
    return time.monotonic_ns() // 1_000_000


class Pending:
    """A handler's answer whose last step waits: an acks=all Produce waiting for the ISR,
    or a `--flush always` one waiting for the group commit. The connection runs ``finish``
    (returning the response body) in a task of its own and goes on reading the next
    Produce meanwhile; responses are still written in request order (broker/server.py)."""
    __slots__ = ("finish", "done", "response", "error")

    def __init__(self, finish):
        self.finish = finish
        self.done = trio.Event()
        self.response: dict | None = None
        self.error: BaseException | None = None

    async def run(self) -> None:
        try:
            self.response = await self.finish()
        except Exception as e:   # re-raised where the response is written
            self.error = e
        finally:
            self.done.set()


class ProducerIdAllocator:
    """Hands out producer ids that are never reused, even across restarts.

    Ids are reserved in blocks recorded in a file before any id of the block is handed
    out, so a crash can waste ids but never repeat one (a repeated id would make the new
    producer's batches look like duplicates of the old one's)."""

    def __init__(self, path: Path, floor: int = -1):
        self.path = path
        reserved = 0
        try:
            reserved = json.loads(path.read_text())["next_block"]
            if not isinstance(reserved, int) or reserved < 0:
                raise ValueError(f"bad next_block {reserved!r}")
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as e:
            # The ids still present in the logs give the floor; ids whose batches are all
            # gone (retention) could come back, which only matters to a producer that is
            # still running with one of them after this restart.
            reserved = 0
            log.error("%s is damaged (%s: %s); producer ids continue above the highest one in the logs (%d)",
                      path, type(e).__name__, e, floor)
        self.next_id = max(reserved, floor + 1)
        self.block_end = self.next_id

    def allocate(self) -> int:
        if self.next_id >= self.block_end:
            self.block_end = self.next_id + PRODUCER_ID_BLOCK
            # Durable before any id of the block is handed out (see the class doc).
            replace_durably(self.path, json.dumps({"next_block": self.block_end}))
        pid = self.next_id
        self.next_id += 1
        return pid


class Flusher:
    """The flush policy.

    * ``async``: never fsync on the produce path; the kernel writes dirty pages back.
      A process crash loses nothing acknowledged (the page cache survives it).
    * ``interval``: a background task fsyncs dirty logs every ``flush_interval_ms``.
    * ``always``: group commit. A produce is acknowledged only after an fsync that began
      after its append; every request waiting while one fsync runs is covered by the next
      one, so N concurrent producers cost one fsync, not N (this disk does ~400 fsyncs/s).
    """

    def __init__(self, policy: str, interval_ms: int, fsync_latency=None):
        self.policy = policy
        self.fsync_latency = fsync_latency   # stats.Histogram: one observation per group commit
        self.interval_ms = interval_ms
        self._dirty: set = set()
        self._waiters: list[trio.Event] = []
        self._wakeup = trio.Event()

    def mark_dirty(self, log_) -> None:
        if self.policy != "async":
            self._dirty.add(log_)

    async def wait_durable(self) -> None:
        """For `always`: return once everything appended so far is on disk. Raises
        LogOffline when the fsync covering this wait failed: what was appended is not
        durable and must not be acknowledged (Kafka fails such requests with
        KAFKA_STORAGE_ERROR and takes the log directory offline)."""
        if self.policy != "always":
            return
        done = trio.Event()
        waiter = [done, None]
        self._waiters.append(waiter)
        self._wakeup.set()
        await done.wait()
        if waiter[1] is not None:
            raise waiter[1]

    async def run(self) -> None:
        if self.policy == "async":
            return
        while True:
            if self.policy == "interval":
                await trio.sleep(self.interval_ms / 1000)
            else:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
            dirty, self._dirty = self._dirty, set()
            waiters, self._waiters = self._waiters, []
            failure = None
            if dirty:
                started = time.perf_counter()
                failure = await trio.to_thread.run_sync(_flush_all, dirty)
                if self.fsync_latency is not None:
                    self.fsync_latency.observe(time.perf_counter() - started)
            # One group commit covers every waiter; which of them appended to the failed
            # log is not tracked, so all of them are failed (a retry of a durable batch is
            # answered from the idempotent-producer state with its original offsets).
            for w in waiters:
                w[1] = failure
                w[0].set()


def _flush_all(logs) -> LogOffline | None:
    failure = None
    for lg in logs:
        was_online = lg.offline is None
        try:
            lg.flush()
        except LogOffline as e:
            if was_online:
                log.error("%s; the partition is offline until the broker restarts", e)
            failure = e
        except (OSError, ValueError) as e:  # a log closed by DeleteTopics meanwhile
            log.debug("flush skipped: %s", e)
    return failure


class Broker:
    def __init__(self, config: BrokerConfig):
        from .cluster import Cluster
        from .groups import GroupCoordinator

        self.config = config
        self.node_id = config.node_id
        self.stats = BrokerStats()
        self.topics = TopicRegistry(config.data_dir, config)
        self.dynamic_broker_configs: dict[str, dict[str, str]] = {}   # single broker: "default"/id -> configs
        from .config_admin import load_dynamic_broker_configs
        load_dynamic_broker_configs(self)   # before the logs open: they take limits from it
        self.topics.load()
        floor = max((p.producers.highest_producer_id() for p in self.topics.all_partitions()), default=-1)
        self.producer_ids = ProducerIdAllocator(Path(config.data_dir) / "producer_ids.json", floor)
        self.fetch_sessions = FetchSessionCache(config.max_incremental_fetch_session_cache_slots)   # KIP-227
        self.flusher = Flusher(config.flush, config.flush_interval_ms, self.stats.fsync)
        self.cluster = Cluster(self)
        from .security.scram import CredentialStore
        self.credentials = CredentialStore(self)   # SCRAM users: etcd's or the data dir's
        self.groups = GroupCoordinator(self)
        from .security.acl_store import AclStore
        self.acls = AclStore(self)

    @property
    def advertised(self) -> tuple[str, int]:
        return self.config.advertised_addr

    def brokers(self, listener: str | None = None) -> list[dict]:
        """The brokers Metadata/DescribeCluster report (the live ones of a cluster), with
        their endpoints on ``listener`` (None: the inter-broker listener)."""
        return self.cluster.brokers(listener)

    def racks(self) -> dict[int, str | None]:
        return self.cluster.racks()

    def is_alive(self, node: int) -> bool:
        return self.cluster.is_alive(node)

    @property
    def controller_id(self) -> int:
        return self.cluster.controller_id

    async def run_background(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.flusher.run)
            nursery.start_soon(self._retention_loop)
            if self.config.log_cleaner_enable:
                nursery.start_soon(self._cleaner_loop)
            await nursery.start(self.cluster.run)
            await nursery.start(self.groups.run)
            task_status.started()

    async def _retention_loop(self) -> None:
        while True:
            await trio.sleep(self.config.retention_check_interval_ms / 1000)
            ts = now_ms()
            for p in list(self.topics.all_partitions()):
                try:
                    deleted = p.log.enforce_retention(ts)
                except (OSError, ValueError) as e:
                    log.warning("retention on %s-%d failed: %s", p.topic.name, p.index, e)
                    continue
                if deleted:
                    log.info("retention deleted %d segment(s) of %s-%d; log start offset now %d",
                             deleted, p.topic.name, p.index, p.log.log_start_offset)

    # -- the log cleaner (compacted topics; storage/cleaner.py) ------------------------------
    async def _cleaner_loop(self) -> None:
        """Kafka's cleaner thread: clean the dirtiest compacted partition, repeat; sleep
        log.cleaner.backoff.ms when none needs it. The reading, writing and fsyncing run
        in a worker thread; only the swap (renames) runs here, between requests."""
        rate = self.config.log_cleaner_io_max_bytes_per_second
        throttler = cleaner.Throttler(rate if rate > 0 else float("inf"))
        while True:
            try:
                busy = await self.clean_dirtiest(throttler)
            except Exception:
                log.exception("log cleaner round failed (retried after the backoff)")
                busy = False
            if not busy:
                await trio.sleep(self.config.log_cleaner_backoff_ms / 1000)

    async def clean_dirtiest(self, throttler) -> bool:
        """One cleaning of the partition with the highest dirty ratio; False if none is due."""
        now = now_ms()
        best = best_part = None
        for p in list(self.topics.all_partitions()):
            if not p.log.config.compact:
                continue
            plan = cleaner.plan(p.log, now)
            if plan is None:
                continue
            if best is None or plan.dirty_ratio > best.dirty_ratio:
                if best is not None:
                    best.release()
                best, best_part = plan, p
            else:
                plan.release()
        if best is None:
            return False
        plan, p = best, best_part
        # Idempotent producers' newest batches (a producer's last batch is kept, emptied).
        plan.producer_last_offsets = {pid: e.batches[-1].last_offset
                                      for pid, e in p.producers.entries.items() if e.batches}
        name = f"{p.topic.name}-{p.index}"
        # The cleaning thread is CPU-bound Python: with the default 5 ms GIL switch interval
        # the event loop waits up to 5 ms for the GIL after every socket call it makes. A
        # 0.5 ms interval while a cleaning runs gives it back ten times sooner.
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, CLEANER_SWITCH_INTERVAL_S))
        try:
            await self._cleaner_step(plan, cleaner.build_offset_map, plan, throttler)
            i = 0
            while i < len(plan.segments):
                cg = await self._cleaner_step(plan, cleaner.clean_group, plan, i, throttler)
                if not cleaner.swap_in(plan, cg):
                    log.info("cleaning of %s abandoned: the log changed meanwhile", name)
                    return True
                i += len(cg.old)
            await self._cleaner_step(plan, cleaner.finish, plan)
            log.info("cleaned %s up to offset %d: %s", name, plan.end_offset, plan.summary())
        except (cleaner.CleaningAborted, FileNotFoundError) as e:
            log.info("cleaning of %s stopped: %s", name, e)
        except (OSError, InvalidRecordBatch) as e:
            log.warning("cleaning of %s failed: %s", name, e)
        finally:
            sys.setswitchinterval(switch)
            plan.release()
        return True

    @staticmethod
    async def _cleaner_step(plan, fn, *args):
        """Run ``fn`` in a worker thread; if this task is cancelled (shutdown), tell the
        thread to stop (it checks between 1 MiB chunks) and wait for it, so the log is
        not closed under it."""
        finished = False

        async def watch():
            try:
                await trio.sleep_forever()
            finally:
                if not finished:
                    plan.stop.set()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            result = await trio.to_thread.run_sync(fn, *args)
            finished = True
            nursery.cancel_scope.cancel()
        return result

    def close(self) -> None:
        self.groups.close()
        self.topics.close()
