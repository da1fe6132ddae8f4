"""Cold catch-up reads versus everybody else's latency (issue 15, item 5).

One canopy holds a log of --gb GiB in topic `cold` (filled through the broker by W5's
idempotent producer), plus a topic `rt`. With the page cache dropped, a producer does
sequential acks=1 round trips of 100 B on `rt` (as W2 does): first alone, then while a
catch-up consumer in its own process reads `cold` from offset 0 to the end; then once more
with the same consumer reading the log again, now from the page cache (what the reader's
CPU alone costs on this 2-vCPU machine). The figure is producer p99 with the cold reader
over p99 alone, measured in one run; goal <= 2.

Two readers take turns (--readers): a confluent-kafka consumer (the stock client; the
goal is judged with it) and a minimal Fetch loop whose own work is little more than
copying the responses out of its socket (what the broker's work alone costs the
producer). Each runs in a cpu cgroup with cpu.idle = 1 where root can make one, else at
the lowest priority its session can have.

The log is filled once; each --code NAME=PATH (default: this checkout) then runs the
phases on its own broker process started with PYTHONPATH=PATH on that same data
directory, so several revisions (git worktrees) compare in one run on one log.

    .venv/bin/python bench/cold_read.py [--gb 5] [--dir /var/tmp] [--readers consumer,fetch]
        [--code main=/work/main --code head=.]

Needs root to drop the page cache (`echo 3 > /proc/sys/vm/drop_caches`) and to make the
idle cgroup; without it the report says so, the "cold" reader is not cold, and each
reader's result names the isolation it had.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

import brokers  # noqa: E402
import cpu_times  # noqa: E402
from kafka_load import _w5_fill, drop_caches, high_watermark, make_topic, pct  # noqa: E402
from progress import Progress  # noqa: E402

RT_PAYLOAD = b"x" * 100


# The readers' socket receive buffer. A kernel built PREEMPT_NONE (this VM's) lets a
# thread inside a system call keep its vCPU until the call returns, whatever its priority;
# a small window leaves librdkafka less to copy at a time, and halved the cold p99
# (bench/README.md, "Who holds the CPU while a reader runs").
READER_RCVBUF = 256 * 1024
# The minimal Fetch reader's bytes per recv_into (an estimate: some µs of copying per
# call), so that a waking producer or event loop soon takes the vCPU back.
FETCH_READER_PIECE = 64 * 1024
FETCH_VERSION = 4   # no fetch sessions, no tagged fields: a plain catch-up Fetch
IDLE_CGROUP_PREFIX = "canopy-bench-reader-"
# The readers, by result key prefix: a stock client, and one whose own work is only the
# Fetch requests and the copying of the responses (the broker's work for a catch-up reader,
# with as little of the reader's as possible on the same two vCPUs).
READERS = {"consumer": "", "fetch": "fetch_"}


def _cpu_cgroup_mounts() -> list[str]:
    """Where the cpu controller's hierarchies are mounted (cgroup v1 `cpu`, or v2 with
    `cpu` enabled for children of its root)."""
    out = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                _dev, where, fstype, opts = line.split()[:4]
                if fstype == "cgroup" and "cpu" in opts.split(","):
                    out.append(where)
                elif fstype == "cgroup2" and "cpu" in Path(where, "cgroup.subtree_control").read_text().split():
                    out.append(where)
    except OSError:
        pass
    return out


def idle_cgroup() -> str | None:
    """A new cpu cgroup with cpu.idle = 1 (Linux 5.15+) for the reader, or None where
    there is none to make (not root, no cpu controller). Linux's autogroups share the CPU
    between sessions before a task's own policy counts, so SCHED_IDLE or nice inside the
    reader's session did not keep it from delaying the producer's wake-ups; an idle group
    is preempted by any other group's waking task, as a SCHED_IDLE task is by its peers."""
    for where in _cpu_cgroup_mounts():
        path = os.path.join(where, f"{IDLE_CGROUP_PREFIX}{os.getpid()}")
        try:
            os.makedirs(path, exist_ok=True)
            Path(path, "cpu.idle").write_text("1")
            return path
        except OSError:
            remove_cgroup(path)
    return None


def remove_cgroup(path: str | None) -> None:
    if path:
        try:
            os.rmdir(path)
        except OSError:
            pass   # still has a task (or never made); the next run's sweep removes it


def sweep_cgroups() -> None:
    """Remove the idle cgroups an earlier, killed run left behind (only empty ones go)."""
    for where in _cpu_cgroup_mounts():
        for path in Path(where).glob(IDLE_CGROUP_PREFIX + "*"):
            remove_cgroup(str(path))


def _lowest_priority(cgroup: str | None) -> str:
    """Put this process below everything else on the machine: into the idle cgroup when
    there is one, else a session of its own whose autogroup runs at nice 19, with
    SCHED_IDLE for its threads (librdkafka's inherit it). Returns which."""
    if cgroup:
        try:
            Path(cgroup, "cgroup.procs").write_text(str(os.getpid()))
            return "cgroup cpu.idle"
        except OSError:
            pass
    os.setsid()
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write("19")
    except OSError:
        pass   # a kernel without autogroups: SCHED_IDLE alone does it
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    return "own autogroup at nice 19, SCHED_IDLE"


def _reader(bootstrap: str, end: int, q, cgroup: str | None) -> None:
    """Child process: read `cold` partition 0 from offset 0 up to `end` with confluent-kafka;
    report bytes, records and seconds. Its own process at the machine's lowest priority,
    looking at one record per batch of up to 10 000: on 2 vCPUs its own parsing and
    receiving would otherwise take the CPU the producer and the broker need, and what is
    measured is what the broker's work for it costs everyone else."""
    how = _lowest_priority(cgroup)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"cold-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "auto.offset.reset": "error",
                  "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 10485760,
                  "socket.receive.buffer.bytes": READER_RCVBUF})
    c.assign([TopicPartition("cold", 0, 0)])
    t0 = time.perf_counter()
    n = 0
    size = None
    deadline = time.monotonic() + 1800
    try:
        while n < end and time.monotonic() < deadline:
            msgs = c.consume(10000, 1)
            if not msgs:
                continue
            last = msgs[-1]
            if last.error():
                raise RuntimeError(f"cold reader: {last.error()}")
            if last.offset() != n + len(msgs) - 1:
                raise RuntimeError(f"cold reader: offset {last.offset()} after {n} + {len(msgs)} records")
            if size is None:
                size = len(last.value())
                q.put("started")
            n += len(msgs)
    finally:
        c.close()
    q.put({"records": n, "bytes": n * (size or 0), "seconds": round(time.perf_counter() - t0, 2),
           "isolation": how})


def _fetch_reader(bootstrap: str, end: int, q, cgroup: str | None) -> None:
    """Child process: the same catch-up read as _reader, as plain Fetch requests (v4, one
    partition, 10 MiB per response as _reader asks for) encoded with canopy's protocol/
    codec; each response is received in FETCH_READER_PIECE pieces and only its batch
    headers are looked at (contiguous offsets, checked). Bytes are record-batch bytes."""
    how = _lowest_priority(cgroup)
    sys.path.insert(0, str(ROOT))
    from protocol.framing import encode_request, parse_response_header
    from protocol.messages import ApiKey, api
    from protocol.records import BATCH_HEADER_SIZE, BatchHeader
    fetch = api(ApiKey.FETCH)
    host, port = bootstrap.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, READER_RCVBUF)   # before connect: the window
    sock.connect((host, int(port)))
    buf = bytearray(16 << 20)

    def receive(n: int) -> memoryview:
        nonlocal buf
        if n > len(buf):
            buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = sock.recv_into(view[got:min(n, got + FETCH_READER_PIECE)])
            if k == 0:
                raise RuntimeError("fetch reader: broker closed the connection")
            got += k
        return view[:n]

    t0 = time.perf_counter()
    offset = received = correlation = 0
    started = False
    deadline = time.monotonic() + 1800
    try:
        while offset < end and time.monotonic() < deadline:
            correlation += 1
            sock.sendall(encode_request(ApiKey.FETCH, FETCH_VERSION, correlation, "bench-cold-reader", {
                "replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 52428800,
                "isolation_level": 0, "topics": [{"topic": "cold", "partitions": [
                    {"partition": 0, "fetch_offset": offset, "partition_max_bytes": 10485760}]}]}))
            (size,) = struct.unpack(">i", receive(4))
            body = receive(size)
            resp = fetch.response.decode(body[parse_response_header(body, ApiKey.FETCH, FETCH_VERSION)[1]:],
                                         FETCH_VERSION)
            part = resp["responses"][0]["partitions"][0]
            if part["error_code"]:
                raise RuntimeError(f"fetch reader: error code {part['error_code']} at offset {offset}")
            records, pos = part["records"] or b"", 0
            while pos + BATCH_HEADER_SIZE <= len(records):
                h = BatchHeader.parse(records, pos)
                if pos + h.total_size > len(records):
                    break   # a partial batch at the end of the response (Kafka allows it)
                if h.base_offset > offset or h.next_offset <= offset:
                    raise RuntimeError(f"fetch reader: batch {h.base_offset}..{h.next_offset - 1} at offset {offset}")
                received += h.total_size
                offset = h.next_offset
                pos += h.total_size
            if offset and not started:
                started = True
                q.put("started")
    finally:
        sock.close()
    q.put({"records": offset, "bytes": received, "seconds": round(time.perf_counter() - t0, 2),
           "isolation": how})


class RoundTrips:
    def __init__(self, bootstrap: str) -> None:
        self.p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": 1,
                           "enable.idempotence": False, "socket.nagle.disable": True})
        self.p.list_topics("rt", timeout=10)
        self.errors: list = []

    def _on_delivery(self, err, _msg) -> None:
        if err is not None:
            self.errors.append(err)

    def one(self) -> int:
        t0 = time.perf_counter_ns()
        self.p.produce("rt", RT_PAYLOAD, partition=0, on_delivery=self._on_delivery)
        if self.p.flush(30):
            raise RuntimeError("round trip: produce not acknowledged within 30 s")
        return time.perf_counter_ns() - t0

    def run(self, n: int) -> list[int]:
        out = [self.one() for _ in range(n)]
        if self.errors:
            raise RuntimeError(f"round trips: {self.errors[:3]}")
        return out


def summary(samples: list[int]) -> dict:
    s = sorted(samples)
    return {"samples": len(s), "p50_us": pct(s, .5), "p99_us": pct(s, .99), "p999_us": pct(s, .999),
            "max_us": round(s[-1] / 1000, 1)}


BLOCK = 200   # round trips per block when the reader's turns alternate with pauses
SETTLE_S = 0.25   # after SIGSTOP: the broker finishes the chunk in hand and fills the reader's socket buffers


def _loop_sampler(pid: int, stop, q) -> None:
    """Child process: every ~2 ms, the state of the broker's event-loop thread; for each
    sample in D (uninterruptible: waiting for the disk), its kernel stack. Its own process,
    so the sampling costs the producer's process nothing."""
    states: dict = {}
    stacks: dict = {}
    while not stop.is_set():
        state = brokers.thread_state(pid)
        if state is not None:
            states[state] = states.get(state, 0) + 1
            if state == "D":
                key = brokers.kernel_stack(pid)
                if key is not None:
                    stacks[key] = stacks.get(key, 0) + 1
        time.sleep(0.002)
    q.put({"states": states, "d_stacks": sorted(stacks.items(), key=lambda kv: -kv[1])[:5]})


class LoopThread:
    """The broker's event loop is its main thread: /proc/<pid>/task/<pid>/schedstat says
    how long it ran on a CPU and how long it waited, runnable, for one (run delay). A loop
    that the disk stalls shows neither; one starved of CPU by the machine's load shows
    the run delay. Beside it, the whole machine's split of CPU time over the same blocks
    (bench/cpu_times.py), which shows how much of it the host took (steal)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.acc: dict = {}
        self.machine: dict = {}   # what -> the whole machine's CPU ticks over its blocks (cpu_times)

    def _read(self) -> tuple[float, float]:
        times = brokers.schedstat(self.pid)
        if times is None:
            raise RuntimeError(f"broker {self.pid} exited during the pass")
        return times

    @contextmanager
    def measure(self, what: str):
        c0, w0 = self._read()
        m0 = cpu_times.read()
        t0 = time.perf_counter()
        yield
        c1, w1 = self._read()
        m1 = cpu_times.read()
        a = self.acc.setdefault(what, [0.0, 0.0, 0.0])
        a[0] += time.perf_counter() - t0
        a[1] += c1 - c0
        a[2] += w1 - w0
        ticks = cpu_times.delta(m0, m1)
        if ticks is not None:
            self.machine[what] = tuple(map(sum, zip(self.machine.get(what, (0,) * len(ticks)), ticks)))

    def report(self, what: str) -> dict:
        wall, on_cpu, waiting = self.acc.get(what, (0.0, 0.0, 0.0))
        return {"loop_on_cpu_pct": round(100 * on_cpu / max(wall, 1e-9), 1),
                "loop_waiting_for_cpu_pct": round(100 * waiting / max(wall, 1e-9), 1),
                "machine": cpu_times.split(self.machine.get(what))}


def with_reader(b: brokers.Broker, rt: RoundTrips, end: int, min_samples: int, bar: Progress,
                label: str, kind: str = "consumer") -> dict:
    """Round trips for as long as the reader (`kind`: see READERS) reads, in blocks of
    BLOCK: one block while the reader runs, the next with the reader stopped (SIGSTOP; its
    log stays as cold as it was), and so on. Both sets of samples see the same background
    load (other sessions' test suites share this machine and move absolute figures
    several-fold between runs)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    cgroup = idle_cgroup()
    child = ctx.Process(target=_fetch_reader if kind == "fetch" else _reader,
                        args=(b.bootstrap, end, q, cgroup), daemon=True)
    cpu0 = b.cpu()
    child.start()
    busy: list[int] = []
    paused: list[int] = []
    loop = LoopThread(b.pid)
    stop = ctx.Event()
    sq = ctx.Queue()
    sampler = ctx.Process(target=_loop_sampler, args=(b.pid, stop, sq), daemon=True)
    sampler.start()
    try:
        first = q.get(timeout=300)
        if first != "started":
            raise RuntimeError(f"cold reader: {first}")
        while child.is_alive() and q.empty():
            with loop.measure("reading"):
                busy.extend(rt.one() for _ in range(BLOCK))
            os.kill(child.pid, signal.SIGSTOP)
            time.sleep(SETTLE_S)
            with loop.measure("paused"):
                paused.extend(rt.one() for _ in range(BLOCK))
            os.kill(child.pid, signal.SIGCONT)
            bar.step(0, f"{label}: {len(busy)} round trips")
        done = q.get(timeout=1800)
        child.join(60)
        stop.set()
        samples = sq.get(timeout=60)
        sampler.join(10)
    finally:
        stop.set()
        if sampler.is_alive():
            sampler.kill()
            sampler.join()
        if child.is_alive():
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
            child.join()
        remove_cgroup(cgroup)
    if rt.errors:
        raise RuntimeError(f"round trips: {rt.errors[:3]}")
    if not isinstance(done, dict) or done["records"] != end:
        raise RuntimeError(f"{label}: reader read {done}, expected {end} records")
    out = {"reading": {**summary(busy), **loop.report("reading")},
           "paused": {**summary(paused), **loop.report("paused")}}
    out["p99_ratio"] = round(out["reading"]["p99_us"] / out["paused"]["p99_us"], 2)
    n = sum(samples["states"].values()) or 1
    out["loop_thread_states_pct"] = {k: round(100 * v / n, 2) for k, v in sorted(samples["states"].items())}
    out["loop_disk_wait_stacks"] = samples["d_stacks"]
    out["reader"] = {**done, "mb_per_s": round(done["bytes"] / done["seconds"] / 1e6, 1)}
    out["broker_cpu_s"] = round(b.cpu() - cpu0, 2)
    if len(busy) < min_samples:
        out["note"] = f"reader finished after {len(busy)} round trips (< {min_samples})"
    return out


def start_canopy(data_dir: str, log: Path, code: str) -> brokers.Broker:
    # The console script, not `python -m broker`: -m puts the working directory (this
    # checkout) ahead of PYTHONPATH on sys.path, and every --code would run this code.
    exe = brokers.VENV / "bin" / "canopy"
    if not exe.exists():
        raise RuntimeError(f"{exe} missing (pip install -e .)")
    argv = lambda port: [str(exe), "serve", "--data-dir", data_dir,  # noqa: E731
                         "--listen", f"127.0.0.1:{port}", "--node-id", "0", "--log-level", "warning"]
    return brokers.Broker("canopy", argv, log, env={"PYTHONPATH": code})


def git_rev(path: str) -> str:
    try:
        return subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() + (
            "+dirty" if subprocess.run(["git", "-C", path, "status", "--porcelain", "--untracked-files=no"],
                                       capture_output=True, text=True, timeout=10).stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def evict_log(data: str, tries: int = 5) -> bool:
    """Only the cold topic's pages out of the page cache (fsync, then
    POSIX_FADV_DONTNEED): the rest of the machine (the filesystem's own metadata, the
    `rt` partition) stays as warm as it was. True when the first segment reads cold.
    DONTNEED skips a page the kernel still holds a reference to at that moment, so it
    is tried again after a pause (tests/faults/pagecache.py measured how often a first
    try leaves one; the twenty-ninth goals run's `log` pass ran warm on a single try)."""
    segs = sorted(Path(data, "topics", "cold", "0").glob("*.log"))
    for attempt in range(tries):
        if attempt:
            time.sleep(0.2)
        for f in segs + sorted(Path(data, "topics", "cold", "0").glob("*.index")):
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        fd = os.open(segs[0], os.O_RDONLY)
        try:
            os.preadv(fd, [bytearray(1)], 1 << 20, os.RWF_NOWAIT)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
    return False


# How the log is made cold before each cold read: "log" evicts only its own pages;
# "all" drops the whole page cache (echo 3 > drop_caches; root), which also drops the
# filesystem's block bitmaps that the produce path's block allocation then reads back
# from the busy disk (bench/README.md, cold reads).
MODES = ("log", "all")


def run_code(name: str, code: str, data: str, logdir: Path, end: int, n: int, modes, readers) -> dict:
    bar = Progress(f"cold read [{name}]", 1)
    b = start_canopy(data, logdir / f"canopy-{name}.log", code)
    try:
        rt = RoundTrips(b.bootstrap)
        rt.run(200)
        out = {"code": code, "rev": git_rev(code), "loadavg_start": os.getloadavg()[0]}
        for kind in readers:
            k = READERS[kind]
            for mode in modes:
                out[f"cache_dropped_{k}{mode}"] = drop_caches() if mode == "all" else evict_log(data)
                rt.run(200)   # the round-trip path warm again (broker code, `rt`'s pages)
                bar.step(0, f"alone ({mode})")
                out[f"alone_{k}{mode}"] = summary(rt.run(n))
                out[f"cold_{k}reader_{mode}"] = with_reader(b, rt, end, n, bar, f"cold {kind} reader ({mode})", kind)
            out[f"warm_{k}reader"] = with_reader(b, rt, end, n, bar, f"warm {kind} reader", kind)
        out["loadavg_end"] = os.getloadavg()[0]
        if not b.alive():
            raise RuntimeError("canopy died")
    finally:
        b.stop()
        bar.close(name)
    return out


def hot_path_cost(tmp: str) -> dict:
    """What the cold-read check adds to a fetch whose pages are cached: µs per
    in_page_cache() call for regions of several sizes (one preadv2 probe per 256 KiB), and
    per trio checkpoint (one per 512 KiB sendfile slice). In process, this checkout's code."""
    sys.path.insert(0, str(ROOT))
    import trio

    from broker import cold_reads
    path = os.path.join(tmp, "probe")
    with open(path, "wb") as f:
        f.write(os.urandom(8 << 20))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, 8 << 20, 0)   # cached
        out = {}
        for size in (1 << 10, 64 << 10, 1 << 20, 4 << 20):
            n = 20000 if size < (1 << 20) else 2000
            t0 = time.perf_counter()
            for _ in range(n):
                assert cold_reads.in_page_cache(fd, 100, size)
            out[f"probe_us_{size >> 10}k"] = round((time.perf_counter() - t0) / n * 1e6, 2)
    finally:
        os.close(fd)
        os.unlink(path)

    async def checkpoints(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            await trio.lowlevel.checkpoint()
        return (time.perf_counter() - t0) / n * 1e6
    out["checkpoint_us"] = round(trio.run(checkpoints, 100000), 2)
    return out


def print_pass(r: dict, k: str, cold: str) -> None:
    c = r[k]
    print(f"    {k:<22} {c['reading']['p99_us']:>8} / {c['paused']['p99_us']:>8} ({c['p99_ratio']:>5})"
          f"  reader {c['reader']['mb_per_s']} MB/s ({c['reader'].get('isolation', '?')}){cold}; "
          f"loop waiting for a CPU "
          f"{c['reading']['loop_waiting_for_cpu_pct']} / {c['paused']['loop_waiting_for_cpu_pct']} %, "
          f"waiting for the disk (D) {c['loop_thread_states_pct'].get('D', 0)} % of samples; "
          f"vCPU time stolen by the host {c['reading']['machine'].get('steal_pct', '?')} / "
          f"{c['paused']['machine'].get('steal_pct', '?')} %")
    for stack, count in c["loop_disk_wait_stacks"][:2]:
        print(f"      D x{count}: {stack}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=5.0, help="size of the cold log (GiB)")
    ap.add_argument("--dir", default=None, help="where the data directory goes (a disk, not tmpfs)")
    ap.add_argument("--samples", type=int, default=3000, help="round trips alone (and at least with the reader)")
    ap.add_argument("--code", action="append", default=[],
                    help="NAME=PATH: run the phases on canopy imported from PATH (repeatable)")
    ap.add_argument("--modes", default=",".join(MODES), help="how to make the log cold: log, all (see MODES)")
    ap.add_argument("--readers", default=",".join(READERS),
                    help="which catch-up readers, in turn: consumer (confluent-kafka), fetch (minimal Fetch loop)")
    ap.add_argument("--out", default=None, help="write the JSON result here too")
    args = ap.parse_args(argv)
    readers = args.readers.split(",")
    if not set(readers) <= set(READERS):
        ap.error(f"--readers: choose from {', '.join(READERS)}")
    sweep_cgroups()
    codes = [c.split("=", 1) for c in args.code] or [["head", str(ROOT)]]
    tmp = tempfile.mkdtemp(prefix="canopy-cold-", dir=args.dir)
    data = os.path.join(tmp, "data")
    logdir = Path(tmp)
    end = 0
    result: dict = {"gb": args.gb, "loadavg_start": os.getloadavg(), "runs": {}}
    try:
        result["hot_path_cost"] = hot_path_cost(tmp)
        print("hot path cost:", result["hot_path_cost"], flush=True)
        bar = Progress("cold read fill", 1)
        b = start_canopy(data, logdir / "canopy-fill.log", codes[0][1])
        try:
            make_topic(b, "cold", 1)
            make_topic(b, "rt", 1)
            t0 = time.perf_counter()
            _w5_fill(b, "cold", 1, int(args.gb * (1 << 30)), int(time.time() * 1000) - 3600_000, bar)
            end = high_watermark(b, "cold")
            result["fill_seconds"] = round(time.perf_counter() - t0, 1)
            result["records"] = end
        finally:
            b.stop()
            bar.close(f"{end} records")
        for name, code in codes:
            result["runs"][name] = run_code(name, os.path.abspath(code), data, logdir, end, args.samples,
                                            args.modes.split(","), readers)
            print(json.dumps({name: result["runs"][name]}, indent=1), flush=True)
        result["loadavg_end"] = os.getloadavg()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("\nproducer round trip p99 (µs): reader running / paused (ratio), interleaved in blocks of", BLOCK)
    for name, r in result["runs"].items():
        print(f"  {name} ({r['rev']}), load {r['loadavg_start']:.2f}-{r['loadavg_end']:.2f}")
        for kind in readers:
            p = READERS[kind]
            for mode in args.modes.split(","):
                print_pass(r, f"cold_{p}reader_{mode}", f", cold: {r[f'cache_dropped_{p}{mode}']}, "
                                                        f"alone before {r[f'alone_{p}{mode}']['p99_us']}")
            print_pass(r, f"warm_{p}reader", "")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
