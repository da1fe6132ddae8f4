"""Small metadata files (topic.json, producer_ids.json, producer-state snapshots) written durably.

write-to-temp, fsync the file, rename over the old one, fsync the directory: after a
crash or power loss the name holds the old contents or the new, complete, never an empty
or half-written file (a rename without the file's fsync can leave a zero-length file on
ext4/xfs after power loss; without the directory's fsync the rename itself can be lost).
"""
from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: Path) -> None:
    """fsync a file or directory by name (a directory: the entries created in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(path: Path, text: str | bytes) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb" if isinstance(text, bytes) else "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)
