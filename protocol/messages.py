"""The Kafka APIs canopy's codec knows: API keys, schemas, header versions.

What the *broker* offers is decided by broker/handlers (one module per API); this module
only knows how to read and write every version Kafka's schemas define, plus the extra old
versions listed in ``_WIDENED`` below.
"""
from __future__ import annotations

from enum import IntEnum

from .schema import MessageSchema


class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    ALTER_PARTITION_REASSIGNMENTS = 45
    INCREMENTAL_ALTER_CONFIGS = 44
    OFFSET_DELETE = 47
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61


_NAMES = {
    ApiKey.PRODUCE: "Produce", ApiKey.FETCH: "Fetch", ApiKey.LIST_OFFSETS: "ListOffsets",
    ApiKey.METADATA: "Metadata", ApiKey.OFFSET_COMMIT: "OffsetCommit",
    ApiKey.OFFSET_FETCH: "OffsetFetch", ApiKey.FIND_COORDINATOR: "FindCoordinator",
    ApiKey.JOIN_GROUP: "JoinGroup", ApiKey.HEARTBEAT: "Heartbeat",
    ApiKey.LEAVE_GROUP: "LeaveGroup", ApiKey.SYNC_GROUP: "SyncGroup",
    ApiKey.DESCRIBE_GROUPS: "DescribeGroups", ApiKey.LIST_GROUPS: "ListGroups",
    ApiKey.SASL_HANDSHAKE: "SaslHandshake", ApiKey.API_VERSIONS: "ApiVersions",
    ApiKey.CREATE_TOPICS: "CreateTopics", ApiKey.DELETE_TOPICS: "DeleteTopics",
    ApiKey.DELETE_RECORDS: "DeleteRecords", ApiKey.INIT_PRODUCER_ID: "InitProducerId",
    ApiKey.OFFSET_FOR_LEADER_EPOCH: "OffsetForLeaderEpoch",
    ApiKey.ADD_PARTITIONS_TO_TXN: "AddPartitionsToTxn", ApiKey.ADD_OFFSETS_TO_TXN: "AddOffsetsToTxn",
    ApiKey.END_TXN: "EndTxn", ApiKey.TXN_OFFSET_COMMIT: "TxnOffsetCommit",
    ApiKey.DESCRIBE_ACLS: "DescribeAcls", ApiKey.CREATE_ACLS: "CreateAcls", ApiKey.DELETE_ACLS: "DeleteAcls",
    ApiKey.DESCRIBE_CONFIGS: "DescribeConfigs", ApiKey.ALTER_CONFIGS: "AlterConfigs",
    ApiKey.DESCRIBE_LOG_DIRS: "DescribeLogDirs", ApiKey.ELECT_LEADERS: "ElectLeaders",
    ApiKey.CREATE_PARTITIONS: "CreatePartitions", ApiKey.DELETE_GROUPS: "DeleteGroups",
    ApiKey.INCREMENTAL_ALTER_CONFIGS: "IncrementalAlterConfigs",
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: "AlterPartitionReassignments",
    ApiKey.OFFSET_DELETE: "OffsetDelete", ApiKey.DESCRIBE_CLUSTER: "DescribeCluster",
    ApiKey.DESCRIBE_PRODUCERS: "DescribeProducers", ApiKey.SASL_AUTHENTICATE: "SaslAuthenticate",
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: "DescribeUserScramCredentials",
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: "AlterUserScramCredentials",
}

# Versions Kafka 4 removed from its schemas but that clients still need to see advertised.
# Produce: librdkafka <= 2.3 (Debian's kcat links 2.0.2) only compresses when the broker's
# Produce range starts at 0; those versions differ from v3 only by fields absent below v3
# (TransactionalId 3+, ThrottleTimeMs 1+, LogAppendTimeMs 2+), so the v3 schema covers them.
# OffsetCommit v0-1 / OffsetFetch v0: Kafka 3.x serves them, 4.0 dropped them (KIP-896);
# sarama (Debian's 1.22, Version >= 0.8.2) commits with OffsetCommit v1 and fetches with
# OffsetFetch v1. Kafka 4's schemas still describe the fields of those versions
# (GenerationId/MemberId 1+, CommitTimestamp 1 only), so the same codec reads them.
# CreateTopics v0-1 (Kafka 3.x serves them, 4.0 dropped them): segmentio/kafka-go 0.2
# (Debian's) creates topics with v0; the fields are those of v2 minus validateOnly (1+).
_WIDENED = {ApiKey.PRODUCE: 0, ApiKey.OFFSET_COMMIT: 0, ApiKey.OFFSET_FETCH: 0,
            ApiKey.CREATE_TOPICS: 0}


class Api:
    __slots__ = ("key", "name", "request", "response")

    def __init__(self, key: ApiKey):
        self.key = key
        self.name = _NAMES[key]
        self.request = MessageSchema(self.name + "Request")
        self.response = MessageSchema(self.name + "Response")
        if key in _WIDENED:
            lo = _WIDENED[key]
            self.request.valid_versions = (lo, self.request.valid_versions[1])
            self.response.valid_versions = (lo, self.response.valid_versions[1])

    @property
    def versions(self) -> tuple[int, int]:
        return self.request.valid_versions

    def request_header_version(self, version: int) -> int:
        return 2 if self.request.is_flexible(version) else 1

    def response_header_version(self, version: int) -> int:
        # ApiVersions responses always use header v0 so a client that sent a version the
        # broker does not know can still parse the error and the supported ranges (KIP-511).
        if self.key == ApiKey.API_VERSIONS:
            return 0
        return 1 if self.response.is_flexible(version) else 0


_APIS: dict[int, Api] = {}


def api(key: int) -> Api | None:
    """The codec for an API key, or None when the key is unknown to canopy."""
    a = _APIS.get(key)
    if a is None and key in ApiKey._value2member_map_:
        a = _APIS[key] = Api(ApiKey(key))
    return a


def all_apis() -> list[Api]:
    return [api(k) for k in ApiKey]
