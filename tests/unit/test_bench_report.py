"""The bench's report code runs at the end of an hour of `make bench`: a slip there loses
the run's tables. These render reports from results shaped like the workloads' own."""
from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench_modules():
    sys.path.insert(0, str(BENCH))
    try:
        import goals
        import report
        yield report, goals
    finally:
        sys.path.remove(str(BENCH))


def _w3(msg_per_s: float) -> dict:
    return {"produce": {"msg_per_s": msg_per_s, "mb_per_s": msg_per_s / 1000, "broker_cpu_us_per_msg": 2.0},
            "round_trip": {"p50_us": 900.0, "p99_us": 4000.0}}


def _w5_case(first_fetch: float) -> dict:
    return {"listening_seconds": 0.2, "offsets_for_times_seconds": 0.3, "first_fetch_seconds": first_fetch,
            "disk_read_ms": {"median": 0.12, "max": 3.5}}


def _peers_report() -> dict:
    def w5_size(clean: float, after_kill: float) -> dict:
        return {"log_bytes": 1 << 30, "peak_rss_mb": 80.0, "clean": _w5_case(clean),
                "after_kill": _w5_case(after_kill), "no_snapshots": _w5_case(3.0)}
    return {
        "timestamp": "2026-11-27T01:00:00", "git": "abc1234",
        "machine": {"cpus": 2, "cpu_model": "test", "kernel": "6", "python": "3.11",
                    "note": "loopback", "loadavg_at_start": [1.0, 1.0, 1.0]},
        "loadavg_at_end": [1.0, 1.0, 1.0], "wall_seconds": 1.0, "client": {"librdkafka": "2"},
        "config": {"records": 1000, "sizes": [1024], "kp_records": 100, "round_trips": 10,
                   "e2e_rate": 100, "e2e_seconds": 1.0, "w3_producers": 2, "w3_records": 100,
                   "w4_partitions": 1000, "w4_producers": 2, "w4_per_producer": 2, "passes": 1},
        "notes": {}, "errors": {},
        "runs": {"canopy": {"W3": _w3(5000.0), "W4": {"create_seconds": 0.019},
                            "W5": {"partitions": 8, "record_bytes": 1024, "drop_caches": True,
                                   "sizes": {"1": w5_size(0.4, 0.5), "5": w5_size(0.5, 0.625)}}},
                 "canopy-always": {"W3": _w3(4000.0)},
                 "tansu": {"W4": {"create_seconds": 0.020}}},
    }


def test_report_renders_w3_beside_w5(bench_modules):
    """W5's rows once named a local `ratio`, which made the module's ratio() unbound in
    the W3 table of the same function: every full run crashed before writing its report."""
    report, _ = bench_modules
    md = report.markdown(_peers_report(), "stamp")
    assert "W3 durability cost" in md and "W5 restart" in md
    assert "| 0.80 |" in md            # W3: flush=always / async msg/s
    assert "1.25 / 1.25 / 1.00" in md  # W5: first fetch vs the smallest log, per case
    assert "| SIGKILL (last roll's snapshot + tail): disk 4 KiB read before start, median / max ms | " \
        "0.12 / 3.5 |" in md


def test_goals_table_from_each_workloads_results(bench_modules):
    _, goals = bench_modules
    hop = {"p50_ms": 0.7, "p99_ms": 4.0}
    tree_run = {"produce": {"leader_egress_per_produced_byte": 2.0, "leader_cpu_ms_per_mb": 6.0},
                "readers": {side: {"leader_egress_per_produced_byte": 2.0, "leader_cpu_ms_per_mb": 80.0}
                            for side in ("leaves", "leader")},
                "latency": {"p50_ms": 6.0, "p99_ms": 40.0}}
    measured = {
        "produce": {"rounds": [{}] * 5, "cpu_us_per_msg": {"min": 0.6, "median": 0.9, "max": 1.5000001},
                    "kernel_cpu_us_per_msg": {"min": 0.3, "median": 0.45, "max": 0.7}},
        "replication": {"ratio_all_vs_1_replicated": 0.93, "ratios_all_vs_1_replicated": [0.8, 0.93, 1.0],
                        "ratios_by_first_phase": {"1": [1.0, 0.8], "all": [0.93]},
                        "latency": {"hops": {"leader -> child": hop, "child -> grandchild": hop}},
                        "acksall": {"follower_cpu_us_per_msg_max": 1.6, "follower_cpu_us_per_msg_mean": 1.2}},
        "tree": {"runs": {"tree": tree_run, "flat": tree_run}},
        "cold": {"gb": 5, "runs": {"head": {"cold_reader_log": {"p99_ratio": 3.1}, "cache_dropped_log": True,
                                            "warm_reader": {"p99_ratio": 2.5}}}},
        "spark": {"error": "failed: no Java"},
    }
    table = goals.goal_rows(measured, _peers_report())
    rows = {" ".join(r[0].split()[:2]): r for r in table}
    verdicts = [r[3] for r in table]
    assert verdicts == ["met", "met", "met", "**not met**", "-", "-", "-", "met", "**not met**", "met",
                        "-"]
    assert "1.50" in rows["4 W1"][2]        # compared as shown: 1.5000001 meets <= 1.5
    assert rows["4 W1"][2].endswith("(kernel: median 0.45 us)")
    assert rows["7 PySpark"][2] == "failed: no Java"
    assert "0.95" in rows["6 W4"][2]
    # each round's ratio by the phase that ran first, in run order
    assert rows["2 acks=all"][2] == "0.93 (rounds 0.80, 0.93, 1.00; acks=1 first 1.00, 0.80, acks=all first 0.93)"


def test_goals_item5_is_judged_with_the_stock_consumer(bench_modules):
    """The minimal Fetch reader's ratios are shown beside the consumer's, never judged:
    the issue's catch-up consumer is a client, and that reader only shows what is left of
    the broker's own cost."""
    _, goals = bench_modules
    run = {"cold_reader_log": {"p99_ratio": 5.35}, "cold_reader_all": {"p99_ratio": 5.92},
           "cache_dropped_log": True, "cache_dropped_all": True, "warm_reader": {"p99_ratio": 2.96},
           "cold_fetch_reader_log": {"p99_ratio": 1.5}, "cold_fetch_reader_all": {"p99_ratio": 1.9},
           "cache_dropped_fetch_log": True, "cache_dropped_fetch_all": True,
           "warm_fetch_reader": {"p99_ratio": 1.2}}
    row = next(r for r in goals.goal_rows({"cold": {"gb": 5, "runs": {"head": run}}}, _peers_report())
               if r[0].startswith("5 "))
    assert row[0].endswith("(warm reader: 2.96; minimal Fetch reader: log 1.5, all 1.9, warm 1.2)")
    assert (row[2], row[3]) == ("log 5.35, all 5.92", "**not met**")
    # The host's steal set both blocks' p99 (4-9 ms with the reader stopped) and the ratio
    # came out near 1: not judged, as a met goal would be the host's doing.
    run["cold_reader_log"] = {"p99_ratio": 0.89, "reading": {"machine": {"steal_pct": 13.4}},
                              "paused": {"machine": {"steal_pct": 21.6}}}
    run["cold_reader_all"] = {"p99_ratio": 1.27, "reading": {"machine": {"steal_pct": 9.0}},
                              "paused": {"machine": {"steal_pct": 2.0}}}
    row = next(r for r in goals.goal_rows({"cold": {"gb": 5, "runs": {"head": run}}}, _peers_report())
               if r[0].startswith("5 "))
    assert (row[2], row[3]) == ("log 0.89, all 1.27", "not judged: the host took up to 21.6 % of the vCPUs' time")
    run["cold_reader_log"]["paused"]["machine"]["steal_pct"] = 10.0   # at the limit: judged
    run["cold_reader_log"]["reading"]["machine"]["steal_pct"] = 1.0
    row = next(r for r in goals.goal_rows({"cold": {"gb": 5, "runs": {"head": run}}}, _peers_report())
               if r[0].startswith("5 "))
    assert row[3] == "met"


def test_goals_table_shows_sparks_floor_beside_the_source(bench_modules):
    _, goals = bench_modules
    readers = {name: {"ratio_to_confluent": r} for name, r in
               [("spark batch", 0.24), ("spark stream", 0.18), ("floor batch", 0.83), ("floor stream", 0.30)]}
    row = next(r for r in goals.goal_rows({"spark": {"readers": readers}}, _peers_report())
               if r[0].startswith("7 "))
    assert row[2] == "0.18 (batch 0.24; Spark's floor: stream 0.30, batch 0.83)"
    assert row[3] == "**not met**"
    # Spark with a source that reads no Kafka outran the consumer: the reference stalled
    # (librdkafka's queue-full backoff), and a ratio against that stall is not judged.
    readers["spark stream"]["ratio_to_confluent"], readers["floor stream"]["ratio_to_confluent"] = 0.87, 1.44
    row = next(r for r in goals.goal_rows({"spark": {"readers": readers}}, _peers_report())
               if r[0].startswith("7 "))
    assert row[3] == "not judged: the reference stalled"
    readers["spark stream"]["ratio_to_confluent"] = 0.18
    del readers["floor batch"], readers["floor stream"]   # results written before the floor
    row = next(r for r in goals.goal_rows({"spark": {"readers": readers}}, _peers_report())
               if r[0].startswith("7 "))
    assert row[2] == "0.18 (batch 0.24)"


def test_cpu_times_splits_the_machines_ticks(bench_modules):
    """The goals report prints each workload's share of stolen vCPU time beside its
    figures; a wrong field from /proc/stat would blame the host for the wrong time."""
    import cpu_times
    #         user nice system idle iowait irq softirq steal
    before = (100, 0, 50, 1000, 10, 0, 0, 5)
    after = (160, 5, 70, 1090, 20, 2, 3, 15)   # of 200 ticks: 60+5+20+2+3 busy, 90 idle, 10 iowait, 10 steal
    s = cpu_times.shares(before, after)
    assert s == {"busy_pct": 45.0, "iowait_pct": 5.0, "steal_pct": 5.0, "idle_pct": 45.0}
    assert cpu_times.describe(s) == "busy 45 %, iowait 5 %, steal 5 %"
    assert cpu_times.shares(None, after) == {} and cpu_times.shares(after, after) == {}
    assert cpu_times.describe({}) == ""
    now = cpu_times.read()
    assert now is not None and len(now) == 8


def _bench_script(filename: str):
    """bench/<filename> loaded as module bench_<name>: bench/replication.py, by its own
    name, would shadow the replication package it imports. The scripts put the repository
    and bench/ on sys.path, which is put back after."""
    path = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{Path(filename).stem}", BENCH / filename)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path[:] = path


def test_replication_reports_the_median_of_its_rounds(bench_modules):
    """Item 2 is judged on the median of the rounds' acks=all / acks=1 ratios. Until
    2026-11-28 the script showed the upper of the two middle rounds of four as "the
    median", which met the goal in runs whose median did not (0.90 shown, 0.88 median)."""
    replication = _bench_script("replication.py")

    def rnd(acks1: float, acksall: float) -> tuple[dict, dict, dict]:
        return {"replicated_msg_per_s": acks1}, {"replicated_msg_per_s": acksall}, {}
    four = [rnd(100, 92), rnd(100, 59), rnd(100, 90), rnd(100, 86)]
    shown, median, ratios = replication.median_round(four)
    assert ratios == [0.59, 0.86, 0.9, 0.92]
    assert median == pytest.approx(0.88)
    assert shown is four[3]          # the lower middle round (0.86), never one above the median
    five = four + [rnd(200, 190)]
    shown, median, ratios = replication.median_round(five)
    assert median == 0.9 and shown is four[2]
    shown, median, _ = replication.median_round([four[0]])
    assert median == 0.92 and shown is four[0]


def test_replication_rate_sends_whole_batches_and_reports_medians():
    """bench/replication_rate.py's raw producer: each Produce v7 request carries the one
    pre-encoded batch for partition 0 with the phase's acks; each kind's row is the median
    of its phases."""
    rate = _bench_script("replication_rate.py")
    from protocol.framing import parse_request_header
    from protocol.messages import ApiKey, api
    from protocol.records import build_batch, validate_batches

    batch = build_batch([(None, b"x" * 1024, [], None) for _ in range(rate.RECORDS_PER_REQUEST)])
    frame = rate.produce_request("bench-rate-1", -1, batch, 9)[4:]
    header, at = parse_request_header(frame)
    assert (header.api_key, header.api_version, header.correlation_id) == (ApiKey.PRODUCE, 7, 9)
    body = api(ApiKey.PRODUCE).request.decode(frame[at:], 7)
    assert body["acks"] == -1
    [topic] = body["topic_data"]
    [part] = topic["partition_data"]
    assert (topic["name"], part["index"], bytes(part["records"])) == ("bench-rate-1", 0, batch)
    [h] = validate_batches(bytes(part["records"]))
    assert h.last_offset_delta + 1 == rate.RECORDS_PER_REQUEST

    def phase(msg_per_s: float, us: float, switches: int) -> dict:
        return {"records": 200_000, "msg_per_s": msg_per_s, "replicated_msg_per_s": msg_per_s / 2,
                "cpu_us_per_msg_replicated": {1: us, 2: us}, "kernel_cpu_us_per_msg_replicated": {1: us / 2, 2: 0},
                "context_switches": {1: switches, 2: 0}}
    s = rate.summary([phase(300_000, 1.0, 400), phase(100_000, 3.0, 1000), phase(200_000, 2.0, 600)])
    assert s == {"phases": 3, "replicated_msg_per_s": 100_000, "producer_msg_per_s": 200_000,
                 "brokers_cpu_us_per_msg": 4.0, "brokers_kernel_cpu_us_per_msg": 1.0,
                 "context_switches_per_1000_msg": 3.0}


def test_page_reporting_is_held_and_put_back(bench_modules, tmp_path):
    """The bench raises the VM's free page reporting delay while it warms memory, and a
    machine left with it raised would keep the host from its memory: it is put back when
    the block ends, left alone inside an outer run's hold, and put back by the next run
    when the holder was killed."""
    import subprocess

    import brokers
    param, state = tmp_path / "min_free_ms", tmp_path / "state"
    param.write_text("0\n")
    with brokers.page_reporting_held(param, state) as held:
        assert held == "held (min_free_ms 0 -> 300000)"
        assert param.read_text() == "300000" and state.read_text().split()[0] == str(os.getpid())
        with brokers.page_reporting_held(param, state) as inner:
            assert inner == "held by an outer run"
        assert param.read_text() == "300000"
    assert param.read_text() == "0" and not state.exists()

    dead = subprocess.Popen(["true"])
    dead.wait()
    param.write_text("300000")
    state.write_text(f"{dead.pid} 7\n")          # a run killed while it held the delay
    assert not brokers.restore_page_reporting(param, state)
    assert param.read_text() == "7" and not state.exists()

    with brokers.page_reporting_held(tmp_path / "absent", state) as held:
        assert held == "not held (no min_free_ms parameter)"
    assert not state.exists()
    with brokers.held_while_warming(0) as held:
        assert held is None


def test_goals_notes_give_the_machines_speed_and_page_reporting(bench_modules):
    """Absolute CPU figures (items 2 and 4) moved 1.7x between runs on one guest with the
    host's speed; the report says how fast the machine ran and whether the VM kept its
    freed memory, beside the vCPU shares."""
    import machine_speed
    _, goals = bench_modules
    speed = machine_speed.measure()
    assert speed["python_loop_ms"] > 0 and speed["copy_gib_s"] > 0
    measured = {"produce": {"machine": {"speed": {"python_loop_ms": 290, "copy_gib_s": 5.1},
                                        "page_reporting": "held (min_free_ms 0 -> 300000)",
                                        "busy_pct": 50.0, "iowait_pct": 14.0, "steal_pct": 0.5, "idle_pct": 35.5}},
                "tree": {"error": "failed: x", "machine": {"speed": {"python_loop_ms": 300, "copy_gib_s": 4.5}}}}
    text = "\n".join(goals.machine_notes(measured))
    assert "produce busy 50 %, iowait 14 %, steal 0.5 %." in text
    assert "produce Python loop 290 ms, copy 5.1 GiB/s; tree Python loop 300 ms, copy 4.5 GiB/s." in text
    assert "`page_reporting_held`): produce held (min_free_ms 0 -> 300000)." in text
    assert "tree busy" not in text


def test_a_starts_time_is_split_and_its_slowest_named(bench_modules):
    """Item 1 missed by one start that took twice as long to listen as the others; W5
    records where each start's time went, and the goals report names the slowest."""
    import subprocess

    import brokers
    report, goals = bench_modules
    # a real process: ~0.2 s on a CPU, then asleep
    proc = subprocess.Popen([sys.executable, "-c", "import time; sum(range(10_000_000)); time.sleep(30)"])
    try:
        watch = brokers.StartWatch(proc.pid)
        deadline = time.monotonic() + 10
        # until it sleeps, past its loop (a start may sleep briefly before)
        while not (brokers.thread_state(proc.pid) == "S" and brokers.schedstat(proc.pid)[0] >= 0.05) \
                and time.monotonic() < deadline:
            watch.sample()
            time.sleep(0.002)
        time.sleep(0.05)
        watch.sample()
        profile = watch.result()
    finally:
        proc.kill()
        proc.wait()
    assert profile["on_cpu_s"] > 0.01 and profile["other_s"] > 0.0
    assert profile["states"].get("S", 0) >= 1
    assert profile["on_cpu_s"] + profile["waiting_for_cpu_s"] + profile["other_s"] <= profile["wall_s"] + 0.01
    assert brokers.describe_start(profile).startswith(f"{profile['on_cpu_s']:.2f} s on a CPU, ")
    assert brokers.thread_state(proc.pid) is None and brokers.schedstat(proc.pid) is None

    slow = {"wall_s": 1.05, "states": {"R": 30, "D": 20}, "on_cpu_s": 0.5, "waiting_for_cpu_s": 0.05,
            "other_s": 0.5, "d_stacks": [["folio_wait_bit_common <- filemap_fault", 18]],
            "major_faults": 40, "disk_read_mb": 30.5, "machine": {"steal_pct": 0.5},
            "machine_speed": {"python_loop_ms": 290, "copy_gib_s": 5.0}}
    peers = _peers_report()
    peers["runs"]["canopy"]["W5"]["sizes"]["5"]["after_kill"].update(
        listening_seconds=1.06, first_fetch_seconds=1.3, start=slow,
        to_first_answer={**slow, "on_cpu_s": 0.7, "other_s": 0.55, "machine_speed": None},
        disk_read_ms={"median": 0.05, "max": 0.2, "waited_s": 7.5, "quiet": True, "stalls": 2,
                      "worst_stall_ms": 61.0})
    note = "\n".join(goals.slowest_start_note(peers))
    assert note == (
        "\nItem 1's slowest restart: 5 GiB, after kill, first answer at 1.30 s, listening at 1.06 s. "
        "To listening: 0.50 s on a CPU, 0.05 waiting for one, 0.50 other (disk wait in 20 of 50 samples: "
        "18× folio_wait_bit_common <- filemap_fault); 30.5 MB read, 40 major faults; steal 0.5 %; "
        "Python loop 290 ms just before. To the first answer: 0.70 s on a CPU, 0.05 waiting for one, "
        "0.55 other (disk wait in 20 of 50 samples: 18× folio_wait_bit_common <- filemap_fault); "
        "30.5 MB read, 40 major faults; steal 0.5 %. Before it, the disk answered 4 KiB reads in 0.05 ms "
        "(median) after 7.5 s with 2 stalls over 5 ms (worst 61.0 ms).")
    md = report.markdown(peers, "stamp")
    assert "| SIGKILL (last roll's snapshot + tail): to listening, on a CPU / waiting for one / other s; " \
        "MB the broker read from the disk | - | 0.5 / 0.05 / 0.5; 30.5 |" in md
    assert "| SIGKILL (last roll's snapshot + tail): disk 4 KiB read before start, median / max ms | " \
        "0.12 / 3.5 | 0.05 / 0.2 (after 7.5 s, 2 stalls) |" in md
    assert goals.slowest_start_note(None) == []


def test_restarts_wait_for_a_quiet_disk(bench_modules, tmp_path):
    """W5 waits, before each timed restart, until 4 KiB O_DIRECT reads have gone a while
    without a stall; a hole (nothing written) is not read at all."""
    import kafka_load
    f = tmp_path / "segment"
    f.write_bytes(os.urandom(256 << 10))
    try:
        os.close(os.open(f, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        pytest.fail(f"{tmp_path} refuses O_DIRECT: the bench's W5 could not time its disk here")
    t = time.monotonic()
    disk = kafka_load.wait_for_quiet_disk(f, quiet_s=0.3, timeout_s=2.0, every_s=0.01)
    assert time.monotonic() - t < 5
    assert set(disk) == {"median", "max", "waited_s", "quiet", "stalls", "worst_stall_ms"}
    assert 0 < disk["median"] <= disk["max"] <= 5.0
    assert disk["quiet"] or disk["stalls"] > 0      # only stalls keep it waiting
    assert (disk["worst_stall_ms"] is None) == (disk["stalls"] == 0)
    hole = tmp_path / "reserved"
    with open(hole, "wb") as h:
        h.truncate(1 << 20)
    assert kafka_load.wait_for_quiet_disk(hole) is None
