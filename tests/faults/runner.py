"""One nemesis, N rounds, on a fresh cluster under a steady client load; then the checker.

A round: pick the victims (whoever leads partition 0 now, its children, the controller),
break, wait ``duration_s``, heal, then time how long until every partition takes an
acks=all write again (``recover_s``; over ``RECOVERY_LIMIT_S`` fails the run), and let
the load run a little on the healed cluster before the next round.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from pathlib import Path

from tests.e2e.rawclient import RawClient, make_batch

from .cluster import FaultCluster, wait_for
from .history import ConsumerWorkload, ProducerWorkload, Verdict, check, read_partition
from .nemesis import Firewall, Nemesis, mount_tmpfs, umount

FULL = os.environ.get("CANOPY_FAULTS") == "full"
RECOVERY_LIMIT_S = 30.0
TOPIC = "faults"
PARTITIONS = 2
RESULTS = Path(os.environ.get("CANOPY_FAULTS_RESULTS", Path(__file__).resolve().parents[2] / ".cache" /
                              "faults-results.jsonl"))
LOGS = RESULTS.parent / "faults-logs"   # broker logs of failed runs


def rounds_for(quick: int = 2, full: int = 20) -> int:
    """CANOPY_FAULTS_ROUNDS overrides both (for trying a nemesis out)."""
    if os.environ.get("CANOPY_FAULTS_ROUNDS"):
        return int(os.environ["CANOPY_FAULTS_ROUNDS"])
    return full if FULL else quick


def probe(cluster: FaultCluster, topic: str, partition: int) -> bool:
    """One acks=all write to the partition's current leader succeeds."""
    leader = cluster.metadata(topic)[partition][0]
    node = cluster.nodes.get(leader)
    if node is None or not node.alive or node.paused:
        return False
    c = RawClient(node.bootstrap)
    c.sock.settimeout(10)
    try:
        r = c.request(0, 9, {"acks": -1, "timeout_ms": 5000, "transactional_id": None, "topic_data": [
            {"name": topic, "partition_data": [{"index": partition, "records": bytes(make_batch([b"probe"]))}]}]})
    finally:
        c.close()
    return r["responses"][0]["partition_responses"][0]["error_code"] == 0


def wait_recovered(cluster: FaultCluster, topic: str, partitions: int) -> float:
    t0 = time.monotonic()
    for p in range(partitions):
        remaining = RECOVERY_LIMIT_S - (time.monotonic() - t0)
        wait_for(lambda: probe(cluster, topic, p), f"partition {p} taking acks=all writes again",
                 timeout=max(remaining, 0.1), interval=0.2)
    return time.monotonic() - t0


def wait_converged(cluster: FaultCluster, topic: str, partitions: int, timeout: float = 60) -> list:
    """Every replica of every partition reports the leader's high watermark."""
    problems = []
    for p in range(partitions):
        def same_hw():
            leader, _, replicas, _ = cluster.metadata(topic)[p]
            hws = {r: read_partition_hw(cluster, r, topic, p) for r in replicas}
            return len(set(hws.values())) == 1
        try:
            wait_for(same_hw, f"replicas of {topic}-{p} converging", timeout=timeout, interval=0.5)
        except AssertionError as e:
            problems.append((p, str(e)))
    return problems


def read_partition_hw(cluster, node_id: int, topic: str, partition: int) -> int:
    c = RawClient(cluster.nodes[node_id].bootstrap)
    c.sock.settimeout(5)
    try:
        r = c.request(1, 12, {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1,
                              "session_id": 0, "session_epoch": -1, "topics": [{"topic": topic, "partitions": [
                                  {"partition": partition, "fetch_offset": 0, "partition_max_bytes": 1}]}]})
    finally:
        c.close()
    p = r["responses"][0]["partitions"][0]
    assert p["error_code"] == 0, p
    return p["high_watermark"]


def run_nemesis(nemesis_cls: type[Nemesis], root: Path, rounds: int) -> dict:
    options = dict(nemesis_cls.cluster_options)
    cluster = FaultCluster(root, **options)
    firewall = Firewall(cluster)
    mounted = []
    producer = consumer = None
    t_start = time.monotonic()
    stats = {"nemesis": nemesis_cls.name, "rounds": 0, "recover_s": [], "notes": [], "crashes": []}
    try:
        firewall.open()
        if nemesis_cls.name == "disk-full-follower":
            for n in cluster.nodes.values():
                mount_tmpfs(n.data_dir, 96)
                mounted.append(n.data_dir)
        cluster.start()
        cluster.create_topic(TOPIC, PARTITIONS, {"min.insync.replicas": "2"})
        wait_recovered(cluster, TOPIC, PARTITIONS)
        producer = ProducerWorkload(cluster.bootstrap(), TOPIC, PARTITIONS)
        consumer = ConsumerWorkload(cluster.bootstrap(), TOPIC, "faults-group")
        producer.start()
        consumer.start()
        time.sleep(1)
        stats["setup_s"] = round(time.monotonic() - t_start, 1)
        nemesis = nemesis_cls(cluster, firewall, TOPIC)
        for i in range(rounds):
            v = nemesis.victims()
            stats["notes"].append(nemesis.describe(v))
            nemesis.start(v)
            time.sleep(nemesis.duration_s)
            nemesis.heal(v)
            # A broker that died on its own (not by the nemesis's hand) is a finding; it is
            # restarted, as a supervisor would, so the run goes on.
            for n in cluster.nodes.values():
                if not n.alive:
                    stats["crashes"].append(f"round {i + 1}: broker {n.node_id} exited with "
                                            f"{n.proc.returncode}: {last_line(n.log_tail())}")
                    n.start()
                    n.wait_listening()
            stats["recover_s"].append(wait_recovered(cluster, TOPIC, PARTITIONS))
            stats["rounds"] += 1
            time.sleep(0.5)   # the healed cluster under load before the next round
        stats["rounds_s"] = round(time.monotonic() - t_start - stats["setup_s"], 1)
        producer.finish()
        consumer.finish()
        not_converged = wait_converged(cluster, TOPIC, PARTITIONS)
        verdict = check(cluster, TOPIC, PARTITIONS, producer, consumer)
        verdict.diverged.extend(("not converged",) + p for p in not_converged)
    except Exception as e:
        stats["error"] = f"{type(e).__name__}: {e}"
        verdict = None
    finally:
        for w in (producer, consumer):
            if w is not None and w.is_alive():
                w.finish()
        firewall.close()
        logs = {n.node_id: n.log_tail(3000) for n in cluster.nodes.values()}
        cluster.stop()
        if verdict is None or not verdict.ok or stats["crashes"]:
            # Kept for diagnosis (pytest's tmp_path is recycled): the brokers' whole logs,
            # and each replica's copy of the test topic (batch headers tell which producer
            # epoch and sequence wrote a duplicate, and in which leader epoch).
            keep = LOGS / f"{nemesis_cls.name}-{time.strftime('%Y%m%dT%H%M%S')}"
            keep.mkdir(parents=True, exist_ok=True)
            for n in cluster.nodes.values():
                if n.log_path.exists():
                    shutil.copy(n.log_path, keep / n.log_path.name)
                topic_dir = n.data_dir / "topics" / TOPIC
                if topic_dir.is_dir():
                    shutil.copytree(topic_dir, keep / f"n{n.node_id}-{TOPIC}", dirs_exist_ok=True)
            stats["kept_logs"] = str(keep)
        for m in mounted:
            umount(m)
    stats["total_s"] = round(time.monotonic() - t_start, 1)
    stats.update(summarise(verdict, producer, consumer))
    stats["logs"] = logs
    record(stats)
    return stats


def last_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


def summarise(v: Verdict | None, producer, consumer) -> dict:
    out = {"acked": len(producer.acked) if producer else 0,
           "failed": len(producer.failed) if producer else 0,
           "producer_errors": dict(producer.errors) if producer else {},
           "producers_replaced": producer.fatal if producer else 0,
           "consumed": consumer.consumed if consumer else 0,
           "consumer_errors": dict(consumer.errors) if consumer else {}}
    if v is None:
        out["ok"] = False
        return out
    out["ok"] = v.ok
    out.update(lost=len(v.lost), duplicated=len(v.duplicated), moved=len(v.moved), diverged=v.diverged,
               backwards=len(v.backwards), skips=len(v.skips), regressions=len(v.regressions), ok=v.ok,
               examples={k: [repr(x) for x in getattr(v, k)[:5]]
                         for k in ("lost", "duplicated", "moved", "backwards", "skips", "regressions")})
    return out


SESSION: list[dict] = []   # every run of this pytest session, for the closing table


def record(stats: dict) -> None:
    SESSION.append(stats)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a") as f:
        f.write(json.dumps({k: v for k, v in stats.items() if k != "logs"}, default=str) + "\n")
    print("\n" + table([stats]))


HEADER = ("nemesis", "rounds", "acked", "lost", "duplicated", "moved", "consumer back/skip",
          "commit regress", "replicas differ", "broker crashes", "recover s (median/max)")


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for s in rows:
        rec = s.get("recover_s") or []
        lines.append("| " + " | ".join(str(x) for x in (
            s["nemesis"], s["rounds"], s.get("acked", 0), s.get("lost", "?"), s.get("duplicated", "?"),
            s.get("moved", "?"), f"{s.get('backwards', '?')}/{s.get('skips', '?')}", s.get("regressions", "?"),
            len(s.get("diverged", [])) if isinstance(s.get("diverged"), list) else "?",
            len(s.get("crashes", [])),
            f"{statistics.median(rec):.1f}/{max(rec):.1f}" if rec else "-")) + " |")
        if s.get("error"):
            lines.append(f"|  ↳ {s['nemesis']} stopped: {s['error'][:300]} |")
    return "\n".join(lines)
