"""broker/cold_reads.read_regions: the copy path for small Fetch responses. (Regions not
in the page cache, read by a worker thread, are tested end to end with a log evicted for
real in tests/faults/test_cold_reads.py.)"""
from __future__ import annotations

import os

import trio

from broker import cold_reads


def read(regions, size):
    """The bytes read_regions put into a buffer of ``size``, or None when it said False."""
    buf = bytearray(size)
    return bytes(buf) if trio.run(cold_reads.read_regions, regions, memoryview(buf)) else None


def _open(path, data: bytes) -> int:
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY)


def test_regions_of_several_files_are_read_in_order(tmp_path):
    a = _open(tmp_path / "a.log", b"0123456789")
    b = _open(tmp_path / "b.log", b"abcdefghij")
    try:
        regions = [(a, 3, 5), (b, 0, 4), (a, 0, 1)]
        assert read(regions, 10) == b"34567" + b"abcd" + b"0"
    finally:
        os.close(a)
        os.close(b)


def test_a_region_past_the_end_of_its_file_is_not_read(tmp_path):
    """A segment shorter than its index promised: None, so the zero-copy path meets the
    short file and drops the connection, as it always did."""
    a = _open(tmp_path / "a.log", b"0123456789")
    try:
        assert read([(a, 6, 8)], 8) is None
        assert read([(a, 10, 1)], 1) is None
    finally:
        os.close(a)


def test_no_regions_read_as_nothing():
    assert read([], 0) == b""
