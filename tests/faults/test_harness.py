"""The fault harness cleans up after the faults it injects, like its iptables chain and cgroups."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from .cluster import FAKETIME_OBJECTS, LIBFAKETIME, SHM, drop_faketime_objects, drop_stale_faketime_objects


def _under_faketime(tmp_path) -> subprocess.Popen:
    """A process with libfaketime preloaded as the harness preloads it into brokers."""
    offset = tmp_path / "clock"
    offset.write_text("+0\n")
    env = dict(os.environ, LD_PRELOAD=LIBFAKETIME, FAKETIME_TIMESTAMP_FILE=str(offset),
               FAKETIME_DONT_FAKE_MONOTONIC="1")
    # signal.pause, not time.sleep: CPython's sleep on CLOCK_MONOTONIC fails with EINVAL
    # under libfaketime with the monotonic clock left alone (the broker sleeps in epoll)
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time; print(time.time(), flush=True); "
                             "signal.pause()"], env=env, stdout=subprocess.PIPE)
    assert proc.stdout.readline()   # running, and libfaketime initialised
    return proc


def _objects(pid: int) -> list[str]:
    return [name.format(pid=pid) for name in FAKETIME_OBJECTS if (SHM / name.format(pid=pid)).exists()]


def test_libfaketime_objects_of_killed_brokers_are_removed(tmp_path, fault_tools):
    """A broker under libfaketime killed with SIGKILL leaves a semaphore and a shared-memory
    object in /dev/shm; the harness removes them once it has reaped the process, and a run
    starting removes those of processes that are gone, never a live one's."""
    killed = _under_faketime(tmp_path)
    live = _under_faketime(tmp_path)
    stale = _under_faketime(tmp_path)
    try:
        assert len(_objects(killed.pid)) == 2      # libfaketime made them: the leak is real
        for proc in (killed, stale):
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        assert len(_objects(killed.pid)) == 2      # SIGKILL left them behind
        drop_faketime_objects(killed.pid)
        assert _objects(killed.pid) == []
        drop_stale_faketime_objects()
        assert _objects(stale.pid) == []
        assert len(_objects(live.pid)) == 2
    finally:
        for proc in (killed, live, stale):
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
            proc.stdout.close()
        drop_stale_faketime_objects()
