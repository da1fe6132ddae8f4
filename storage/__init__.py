"""canopy storage: one partition's log (segments, index, recovery, retention).

Imports only protocol.records; no network I/O, no Trio.  See log.py and
segment.py for the on-disk format and its crash guarantees.
"""

from .files import fsync_path, replace_durably
from .lock import DataDirLock, DataDirLocked
from .log import (
    AppendResult, Log, LogConfig, LogOffline, OffsetOutOfRange, ReadResult, StorageError, make_files_ahead,
)
from .segment import Segment, StorageFull

__all__ = [
    "AppendResult", "DataDirLock", "DataDirLocked", "Log", "LogConfig", "LogOffline",
    "OffsetOutOfRange", "ReadResult", "Segment", "StorageError", "StorageFull", "fsync_path", "make_files_ahead",
    "replace_durably",
]
