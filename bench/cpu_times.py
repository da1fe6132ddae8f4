"""Where the machine's CPU time went while a workload ran, from /proc/stat's first line.

This VM's vCPUs are threads on a host that runs other guests too. ``steal`` is time a vCPU
had work but the hypervisor ran something else: the same code measures slower while it is
high, and nothing in canopy or the bench causes it. The goals report prints it beside
each workload's figures, so a run's misses can be read against what the host took.
"""
from __future__ import annotations

from contextlib import contextmanager

# /proc/stat's cpu line, in clock ticks: user nice system idle iowait irq softirq steal
# (guest time, the two fields after, is already counted in user and nice).
_USER, _NICE, _SYSTEM, _IDLE, _IOWAIT, _IRQ, _SOFTIRQ, _STEAL = range(8)


def read() -> tuple[int, ...] | None:
    """The whole machine's CPU ticks so far; None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    return tuple(int(x) for x in fields[1:9])


def delta(before: tuple[int, ...] | None, after: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The ticks spent between two ``read()``s; None when either reading is missing."""
    if before is None or after is None:
        return None
    return tuple(b - a for a, b in zip(before, after))


def shares(before: tuple[int, ...] | None, after: tuple[int, ...] | None) -> dict:
    """Percent of all vCPUs' time between two ``read()``s (see ``split``)."""
    return split(delta(before, after))


def split(d: tuple[int, ...] | None) -> dict:
    """Percent of the vCPUs' time in ``d`` (a ``delta``, or a sum of them): busy (user,
    system and interrupts), waiting for the disk with nothing else to run (iowait), taken
    by the host (steal), idle. Empty for no ticks."""
    if d is None:
        return {}
    total = sum(d)
    if total <= 0:
        return {}

    def pct(n: int) -> float:
        return round(100 * n / total, 1)

    return {"busy_pct": pct(d[_USER] + d[_NICE] + d[_SYSTEM] + d[_IRQ] + d[_SOFTIRQ]),
            "iowait_pct": pct(d[_IOWAIT]), "steal_pct": pct(d[_STEAL]), "idle_pct": pct(d[_IDLE])}


@contextmanager
def measured(into: dict):
    """Adds ``shares`` over the with-block to ``into`` (also when the block raises)."""
    before = read()
    try:
        yield into
    finally:
        into.update(shares(before, read()))


def describe(s: dict) -> str:
    """``busy 61 %, iowait 2 %, steal 4.5 %``, or '' for no figures (``s`` may hold other
    figures about the machine beside them)."""
    if "busy_pct" not in s:
        return ""
    return f"busy {s['busy_pct']:g} %, iowait {s['iowait_pct']:g} %, steal {s['steal_pct']:g} %"
