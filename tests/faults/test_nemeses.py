"""Jepsen-style fault runs (issue 10): one fresh 4-broker cluster per nemesis, an
idempotent acks=all producer and a committing group consumer running throughout, N rounds
of the fault, then the checker (tests/faults/history.py). `make test` runs every nemesis
with 2 rounds; `make faults` (CANOPY_FAULTS=full) runs every nemesis 20 times.
"""
from __future__ import annotations

import pytest

from . import nemesis as nem
from .runner import FULL, rounds_for, run_nemesis, table

NEMESES = [n.name for n in nem.ALL]

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
