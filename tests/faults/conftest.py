"""The fault suite needs root (iptables, cgroups, mount) and Debian's iptables, faketime
and fiu-utils, which `make test-deps` installs; a missing tool fails in CI, never skips."""
from __future__ import annotations

import pytest

from tests.e2e.conftest import require_tool


@pytest.fixture
def fault_tools():
    for tool, pkg in (("iptables", "iptables"), ("fiu-run", "fiu-utils"), ("fiu-ctrl", "fiu-utils"),
                      ("faketime", "faketime")):
        require_tool(tool, f"Debian package {pkg}")


def pytest_terminal_summary(terminalreporter):
    from .runner import SESSION, table
    if SESSION:
        terminalreporter.write_sep("=", "fault runs (issue 10): per nemesis")
        terminalreporter.write_line(table(SESSION))
