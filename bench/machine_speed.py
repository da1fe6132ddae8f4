"""How fast this machine ran when a workload started: a reference beside absolute CPU figures.

Items 2 and 4 of issue 15 set absolute goals (CPU-µs per message), and this VM's vCPUs are
threads of a host whose speed moves: the same guest, booted once, ran ``sum(range(10**7))``
in 186 ms one night and in 284-321 ms two hours later, with no steal to show for it
(bench/README.md, "The VM's memory"). The goals report prints these two figures before
each workload, so a figure that moved between runs can be read against the machine:

- ``python_loop_ms``: the pure-Python loop above, best of three (lower is faster): the
  interpreter's share of a broker's CPU;
- ``copy_gib_s``: a 64 MiB ``bytearray`` copy, best of three: memory bandwidth, which the
  kernel's copies into sockets and page-cache pages depend on.

About a second in all.
"""
from __future__ import annotations

import time

COPY_BYTES = 64 << 20


def _best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def measure() -> dict:
    """The two reference figures, measured now in this process."""
    loop = _best(lambda: sum(range(10 ** 7)))
    src, dst = bytearray(COPY_BYTES), bytearray(COPY_BYTES)

    def copy() -> None:
        dst[:] = src
    copy()   # first touch of both buffers: page faults, not bandwidth
    return {"python_loop_ms": round(loop * 1e3), "copy_gib_s": round(COPY_BYTES / (1 << 30) / _best(copy), 1)}


def describe(s: dict) -> str:
    """``Python loop 290 ms, copy 5.1 GiB/s``, or '' for no figures."""
    if not s:
        return ""
    return f"Python loop {s['python_loop_ms']} ms, copy {s['copy_gib_s']:g} GiB/s"
