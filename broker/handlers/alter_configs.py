"""AlterConfigs (key 33), versions 0-2.

v1 is the same as v0; v2 flexible. Replaces the whole set of a resource's configs: for a
topic (resource type 2) its overrides, names left out go back to the inherited value;
for a broker (type 4; name = node id, or "" for every broker) its dynamic configs.
validate_only checks without changing anything. Superseded by IncrementalAlterConfigs
(key 44) but still what kafka-python and older tools send. The rules are in
broker/config_admin.py.
"""
from protocol.messages import ApiKey

from ..config_admin import alter

API_KEY = ApiKey.ALTER_CONFIGS
MIN_VERSION, MAX_VERSION = 0, 2


async def handle(ctx, request: dict, version: int) -> dict:
    return await alter(ctx, request, version, API_KEY, incremental=False)
