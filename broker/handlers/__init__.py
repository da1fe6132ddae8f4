"""The dispatch table: API key -> handler module. It is data, and it is also exactly what
ApiVersions advertises, so nothing is offered that has no handler.

Each module declares API_KEY, MIN_VERSION, MAX_VERSION and ``async handle(ctx, request,
version)`` returning the response dict (or None when Kafka sends no response).
"""
from __future__ import annotations

from types import ModuleType

from . import (alter_configs, alter_partition_reassignments, alter_user_scram_credentials, api_versions,
               create_acls, create_partitions, create_topics, delete_acls, delete_records, delete_topics,
               describe_acls, describe_cluster, describe_configs, describe_log_dirs, describe_producers,
               describe_user_scram_credentials, elect_leaders, fetch, find_coordinator,
               incremental_alter_configs, init_producer_id, list_offsets, metadata, offset_for_leader_epoch,
               produce, sasl_authenticate, sasl_handshake)

_MODULES: list[ModuleType] = [
    produce, fetch, list_offsets, metadata, find_coordinator, api_versions, create_topics,
    delete_topics, delete_records, init_producer_id, offset_for_leader_epoch, describe_configs,
    create_partitions, alter_partition_reassignments, describe_cluster, sasl_handshake, sasl_authenticate,
    describe_user_scram_credentials, alter_user_scram_credentials, describe_acls, create_acls, delete_acls,
    alter_configs, incremental_alter_configs, describe_log_dirs, describe_producers, elect_leaders,
]

try:  # the group coordinator's APIs live beside it
    from . import (delete_groups, describe_groups, heartbeat, join_group, leave_group, list_groups,
                   offset_commit, offset_delete, offset_fetch, sync_group)
    _MODULES += [offset_commit, offset_fetch, join_group, heartbeat, leave_group, sync_group,
                 describe_groups, list_groups, delete_groups, offset_delete]
except ImportError:  # pragma: no cover - during bring-up only
    pass

HANDLERS: dict[int, ModuleType] = {m.API_KEY: m for m in _MODULES}


def build_codecs() -> None:
    """Build the request and response codec of every version served. A codec is
    otherwise built by the first request that needs it: a fresh broker answered its first
    ApiVersions, Metadata and CreateTopics 1-3 ms later than the next ones (librdkafka's
    AdminClient sends those three first). All 178 versions take ~55 ms, paid once at
    start, before the startup heap is frozen (broker/server.py), so the collector never
    walks them either. Built in the background instead, between requests, they delayed a
    fresh broker's first answers by a codec's build at every await."""
    from protocol.messages import api

    for key, m in HANDLERS.items():
        a = api(key)
        for v in range(m.MIN_VERSION, m.MAX_VERSION + 1):
            a.request.codec(v)
            a.response.codec(v)
