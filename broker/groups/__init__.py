"""Consumer group coordinator (Kafka's classic group protocol).

group.py is the per-group state machine (sans-IO), offsets_log.py the committed offsets
and their record format in ``__consumer_offsets``, coordinator.py ties them to the broker,
the clock and the storage engine. Handlers in broker/handlers/ only translate wire dicts.
"""
from .coordinator import GroupCoordinator
from .group import Group, JoinResult, SyncResult
from .offsets_log import OFFSETS_TOPIC, OffsetEntry

__all__ = ["GroupCoordinator", "Group", "JoinResult", "SyncResult", "OFFSETS_TOPIC", "OffsetEntry"]
