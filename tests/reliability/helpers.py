"""Shared pieces of the reliability suite: reading a partition back batch by batch with
every CRC checked, committing/fetching group offsets, and the broker's memory."""
from __future__ import annotations

import os
import time

from protocol.messages import ApiKey
from protocol.records import iter_records, validate_batches
from tests.e2e.rawclient import RawClient


def wait_for_listener(bootstrap: str, timeout: float = 20.0) -> RawClient:
    deadline = time.monotonic() + timeout
    while True:
        try:
            c = RawClient(bootstrap)
            c.request(ApiKey.API_VERSIONS, 3, {"client_software_name": "rel", "client_software_version": "1"})
            return c
        except (OSError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def fetch_once(client: RawClient, topic: str, partition: int, offset: int,
               max_wait_ms: int = 0, max_bytes: int = 8 << 20) -> dict:
    r = client.request(ApiKey.FETCH, 11, {
        "replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": 1, "max_bytes": max_bytes,
        "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": topic, "partitions": [{
            "partition": partition, "fetch_offset": offset, "partition_max_bytes": max_bytes,
            "log_start_offset": -1, "current_leader_epoch": -1}]}],
        "forgotten_topics_data": [], "rack_id": ""})
    return r["responses"][0]["partitions"][0]


class Readback:
    """Everything in one partition from its log start to the high watermark."""

    def __init__(self):
        self.records: list[tuple[int, bytes]] = []  # (offset, value)
        self.batches = 0
        self.high_watermark = -1


def read_partition(client: RawClient, topic: str, partition: int = 0) -> Readback:
    """Fetch the whole partition; every batch's CRC32C and header are checked
    (validate_batches), and batch offsets must be contiguous."""
    out = Readback()
    offset = 0
    expected_next = 0
    while True:
        p = fetch_once(client, topic, partition, offset)
        assert p["error_code"] == 0, p
        out.high_watermark = p["high_watermark"]
        data = bytes(p["records"] or b"")
        if not data:
            break
        headers = validate_batches(data, strict=True, check_crc=True)
        for h in headers:
            assert h.base_offset == expected_next, \
                f"offset gap: batch at {h.base_offset}, expected {expected_next}"
            batch = data[h.position:h.position + h.total_size]
            n = 0
            for rec in iter_records(batch):
                assert rec.offset == h.base_offset + n, (rec.offset, h.base_offset, n)
                out.records.append((rec.offset, bytes(rec.value) if rec.value is not None else None))
                n += 1
            assert h.base_offset + n - 1 == h.last_offset, "record count disagrees with lastOffsetDelta"
            expected_next = h.last_offset + 1
            out.batches += 1
        offset = expected_next
        if offset >= out.high_watermark:
            break
    assert offset == out.high_watermark, (offset, out.high_watermark)
    return out


def commit_offset(client: RawClient, group: str, topic: str, partition: int, offset: int) -> int:
    r = client.request(ApiKey.OFFSET_COMMIT, 8, {
        "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
        "group_instance_id": None, "topics": [{"name": topic, "partitions": [{
            "partition_index": partition, "committed_offset": offset,
            "committed_leader_epoch": -1, "committed_metadata": f"m{offset}"}]}]})
    return r["topics"][0]["partitions"][0]["error_code"]


def fetch_committed(client: RawClient, group: str, topic: str, partition: int) -> tuple[int, str]:
    r = client.request(ApiKey.OFFSET_FETCH, 8, {"groups": [{
        "group_id": group, "topics": [{"name": topic, "partition_indexes": [partition]}]}],
        "require_stable": False})
    p = r["groups"][0]["topics"][0]["partitions"][0]
    assert p["error_code"] == 0, p
    return p["committed_offset"], p["metadata"]


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """Resident memory; field "RssAnon" leaves out file pages (the mmap'd active
    segments are resident as they are written, which is page cache, not a leak)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def record_figures(test: str, **figures) -> None:
    """Append the figures a run measured to .cache/reliability-figures.jsonl (the numbers
    docs/reliability.md quotes come from there)."""
    import json
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / ".cache" / "reliability-figures.jsonl"
    path.parent.mkdir(exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps({"test": test, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                            "full": os.environ.get("CANOPY_RELIABILITY") == "full", **figures}) + "\n")
