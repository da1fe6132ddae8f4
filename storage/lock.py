"""The data directory lock: one broker per data directory.

Two brokers appending to the same segment files would interleave batches and
corrupt both logs, so the broker takes an exclusive, non-blocking flock on
``<data_dir>/.lock`` at start and holds it for its lifetime.  flock locks die
with the process (kill -9 included), so a stale lock file never blocks a restart;
the pid inside is informational, for the error message.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class DataDirLocked(Exception):
    """Another process holds the data directory."""


class DataDirLock:
    def __init__(self, data_dir: Path | str):
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.data_dir / ".lock"
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise DataDirLocked(
                f"data directory {self.data_dir} is in use by another broker (pid {pid})") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            # Lock first released, then the pid wiped: the file itself stays
            # (unlinking it would race with a new broker locking the old inode).
            os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass
