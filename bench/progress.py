"""A dependency-free progress bar on stderr, one per workload (redrawn at most 5x/s)."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, total: int, width: int = 30) -> None:
        self.label, self.total, self.width = label, max(1, total), width
        self.done = 0
        self.t0 = self._last = time.monotonic()
        self.tty = sys.stderr.isatty()
        self._draw(force=True)

    def step(self, n: int = 1, what: str = "") -> None:
        self.done = min(self.total, self.done + n)
        self._draw(what=what)

    def _draw(self, force: bool = False, what: str = "") -> None:
        now = time.monotonic()
        if not force and now - self._last < 0.2 and self.done < self.total:
            return
        self._last = now
        frac = self.done / self.total
        bar = "#" * int(frac * self.width)
        line = (f"{self.label:<28} [{bar:<{self.width}}] {100 * frac:5.1f}% "
                f"{now - self.t0:6.1f}s {what}")
        if self.tty:
            sys.stderr.write("\r" + line[:150].ljust(150))
        elif force:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self, what: str = "") -> None:
        self.done = self.total
        self._draw(force=True, what=what)
        if self.tty:
            sys.stderr.write("\n")
        sys.stderr.flush()
