"""Torn and corrupt tails: damage the end of the active segment, its index, or the
index's committed-length header at random points, restart the broker, and check it.

Each trial copies a template data directory (a topic with segment.bytes=16 KiB, so the
active segment follows sealed ones; half the templates stopped cleanly, half killed with
SIGKILL so the active .log is still preallocated) and applies one random fault:

- log-truncate / log-overwrite: cut the active .log, or overwrite 1-64 bytes within its
  last 4 KiB of data;
- index-truncate / index-overwrite / index-delete: cut, scribble on or remove the .index;
- committed-overwrite / header-overwrite: scribble on the committed-length field or
  anywhere in the 64-byte index header.

The oracle is computed from the bytes: a batch survives iff it and every batch before it
in the segment is byte-for-byte intact (its partitionLeaderEpoch, outside the CRC, aside)
and inside the file. After the restart the broker must serve exactly those records with
contiguous offsets and valid CRCs, say in its log what it truncated, and append the next
batch at the right offset.

`make test`: 24 trials; `make reliability`: 200.
"""
from __future__ import annotations

import os
import random
import shutil
import struct

import pytest

from protocol.records import InvalidRecordBatch, check_batch
from tests.e2e.rawclient import create_topic, make_batch, produce

from .conftest import BrokerProcess, scale
from .helpers import read_partition, record_figures, wait_for_listener

TRIALS = scale(24, 200)
TOPIC = "torn"
KINDS = ["log-truncate", "log-overwrite", "index-truncate", "index-overwrite", "index-delete",
         "committed-overwrite", "header-overwrite"]
pytestmark = pytest.mark.timeout(120 + TRIALS * 10)


def _make_template(root, name: str, kill: bool, rng: random.Random) -> dict[int, bytes]:
    b = BrokerProcess(root / name).start()
    values: dict[int, bytes] = {}
    try:
        c = wait_for_listener(b.bootstrap)
        create_topic(c, TOPIC, {"segment.bytes": "16384"})
        for _ in range(70):
            batch_values = [rng.randbytes(rng.randint(5, 120)).hex().encode()
                            for _ in range(rng.randint(1, 25))]
            r = produce(c, TOPIC, make_batch(batch_values), acks=1)
            assert r["error_code"] == 0, r
            for i, v in enumerate(batch_values):
                values[r["base_offset"] + i] = v
        c.close()
    finally:
        if kill:
            b.kill9()
        b.stop()
    return values


def _batches(data: bytes, base_offset: int) -> list[tuple[int, int, int, int]]:
    """(position, size, base offset, last offset) of the valid batches from the start."""
    out, pos, expect = [], 0, base_offset
    while pos < len(data):
        try:
            h = check_batch(data, pos, len(data), strict=False, check_crc=True)
        except InvalidRecordBatch:
            break
        if h.base_offset != expect:
            break
        out.append((pos, h.total_size, h.base_offset, h.last_offset))
        expect = h.last_offset + 1
        pos += h.total_size
    return out


def _intact(before: bytes, after: bytes, pos: int, size: int) -> bool:
    if pos + size > len(after):
        return False
    a, b = before[pos:pos + size], after[pos:pos + size]
    return a[:12] == b[:12] and a[16:] == b[16:]  # bytes 12..16: partitionLeaderEpoch


def _damage(part_dir, rng: random.Random) -> tuple[str, int]:
    """Apply one fault to the active segment; returns (kind, expected log end offset)."""
    logs = sorted(p for p in os.listdir(part_dir) if p.endswith(".log"))
    active = part_dir / logs[-1]
    index = active.with_suffix(".index")
    base = int(active.name[:-4])
    before = active.read_bytes()
    batches = _batches(before, base)
    data_end = batches[-1][0] + batches[-1][1] if batches else 0
    kind = rng.choice(KINDS)
    if kind == "log-truncate":
        with open(active, "r+b") as f:
            f.truncate(rng.randint(0, max(0, data_end - 1)))
    elif kind == "log-overwrite":
        at = rng.randint(max(0, data_end - 4096), max(0, data_end - 1))
        n = rng.randint(1, 64)
        with open(active, "r+b") as f:
            f.seek(at)
            f.write(rng.randbytes(n))
    elif kind == "index-truncate":
        with open(index, "r+b") as f:
            f.truncate(rng.randint(0, os.path.getsize(index)))
    elif kind == "index-overwrite":
        size = os.path.getsize(index)
        at = rng.randint(max(64, size - 256), max(64, size - 1))
        with open(index, "r+b") as f:
            f.seek(at)
            f.write(rng.randbytes(rng.randint(1, 32)))
    elif kind == "index-delete":
        index.unlink()
    elif kind == "committed-overwrite":
        with open(index, "r+b") as f:
            at = rng.randint(8, 15)
            f.seek(at)
            f.write(rng.randbytes(rng.randint(1, 16 - at)))
    else:  # header-overwrite
        with open(index, "r+b") as f:
            at = rng.randint(0, 63)
            f.seek(at)
            f.write(rng.randbytes(rng.randint(1, 64 - at)))
    after = active.read_bytes()
    end = base
    for pos, size, _, last in batches:
        if not _intact(before, after, pos, size):
            break
        end = last + 1
    return kind, end


def test_torn_and_corrupt_tails_are_truncated_and_the_rest_kept(tmp_path):
    rng = random.Random(int(os.environ.get("TORN_SEED", "20240601")))
    templates = {}
    for kill in (False, True):
        name = "template-killed" if kill else "template-clean"
        templates[name] = _make_template(tmp_path, name, kill, rng)
    faults: dict[str, int] = {}
    records_checked = truncated_trials = 0
    for trial in range(TRIALS):
        name = rng.choice(sorted(templates))
        values = templates[name]
        d = tmp_path / f"trial{trial}"
        shutil.copytree(tmp_path / name, d)
        (d / ".lock").unlink(missing_ok=True)
        kind, expected_end = _damage(d / "topics" / TOPIC / "0", rng)
        faults[kind] = faults.get(kind, 0) + 1
        print(f"trial {trial}: {name} {kind} expected end {expected_end}", flush=True)
        original_end = max(values) + 1
        b = BrokerProcess(d)
        try:
            b.start()
            c = wait_for_listener(b.bootstrap)
            rb = read_partition(c, TOPIC)  # contiguous offsets + CRCs checked inside
            context = f"trial {trial} ({name}, {kind}): "
            assert rb.high_watermark == expected_end, \
                context + f"log end {rb.high_watermark}, expected {expected_end}\n{b.log_text()}"
            assert rb.records == [(o, values[o]) for o in range(expected_end)], context + "records differ"
            records_checked += len(rb.records)
            if expected_end < original_end:
                truncated_trials += 1
                assert "truncated" in b.log_text(), context + "recovery did not log the truncation"
            r = produce(c, TOPIC, make_batch([b"after-%d" % trial]), acks=1)
            assert r["error_code"] == 0 and r["base_offset"] == expected_end, context + repr(r)
            rb2 = read_partition(c, TOPIC)
            assert rb2.records[-1] == (expected_end, b"after-%d" % trial)
            c.close()
        finally:
            b.stop()
        shutil.rmtree(d)
    record_figures("torn_tail", trials=TRIALS, faults=faults, trials_truncating=truncated_trials,
                   records_checked=records_checked, records_lost_beyond_damage=0)
