"""Jepsen-style fault runs (issue 10): one fresh 4-broker cluster per nemesis, an
idempotent acks=all producer and a committing group consumer running throughout, N rounds
of the fault, then the checker (tests/faults/history.py). `make test` runs the nemeses in
QUICK with a few rounds; `make faults` (CANOPY_FAULTS=full) runs every nemesis 20 times.

QUICK lists the nemeses that pass on today's code; the others expose defects that the
etcd-controller work is to fix (issue 9; see docs/reliability.md) and join QUICK then.
"""
from __future__ import annotations

import pytest

from . import nemesis as nem
from .runner import FULL, rounds_for, run_nemesis, table

# The nemeses that passed all 20 rounds of the full run (docs/reliability.md, "Faults").
# kill9-leader passes at this size but not at 20 rounds; pause-*, partition-*-controller,
# partition-controller-to-leader and clock-forward-controller lose acknowledged records
# today (issue 10's defects 2, 4, 5, 8: the controller work of issue 9).
QUICK = ["kill9-follower", "partition-leader-children", "partition-leader-clients", "clock-backward-leader",
         "disk-fsync-leader", "disk-full-follower"]
NEMESES = [n.name for n in nem.ALL] if FULL else QUICK

pytestmark = pytest.mark.timeout(1800)


@pytest.mark.parametrize("name", NEMESES)
def test_nemesis(name, tmp_path, fault_tools):
    stats = run_nemesis(nem.BY_NAME[name], tmp_path, rounds_for(quick=2, full=20))
    report = table([stats])
    assert "error" not in stats, report + "\n" + "\n".join(
        f"--- broker {i}\n{t}" for i, t in stats["logs"].items())
    assert stats["ok"], report + "\n" + repr(stats.get("examples")) + repr(stats.get("diverged"))
    assert not stats["crashes"], report + "\n" + "\n".join(stats["crashes"])
    assert stats["acked"] > 0, report
