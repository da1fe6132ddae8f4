"""Fixtures for the reliability suite (issue 6).

Every test here runs twice as large in `make reliability` (CANOPY_RELIABILITY=full) as
in `make test`: `scale(quick, full)` picks the count. The broker under test is always a
real `canopy serve` child process (tests/e2e/conftest.py's BrokerProcess).
"""
from __future__ import annotations

import os

import pytest

from tests.e2e.conftest import BrokerProcess, IN_CI, free_port, require_tool  # noqa: F401

FULL = os.environ.get("CANOPY_RELIABILITY") == "full"


def scale(quick: int, full: int) -> int:
    return full if FULL else quick


@pytest.fixture
def broker_factory(tmp_path):
    started: list[BrokerProcess] = []

    def make(name: str = "data", start: bool = True, **kw) -> BrokerProcess:
        b = BrokerProcess(tmp_path / name, **kw)
        started.append(b)
        return b.start() if start else b

    yield make
    for b in started:
        try:
            b.stop()
        except Exception:
            pass
