"""IncrementalAlterConfigs (key 44), versions 0-1.

v1 flexible. Each config carries an operation: SET (0), DELETE (1, back to the inherited
value), APPEND (2) and SUBTRACT (3) for list configs (cleanup.policy, the throttled
replica lists). Topic (2) and broker (4) resources; validate_only honoured. This is what
confluent-kafka's and the Java AdminClient's incremental_alter_configs send. The rules
are in broker/config_admin.py.
"""
from protocol.messages import ApiKey

from ..config_admin import alter

API_KEY = ApiKey.INCREMENTAL_ALTER_CONFIGS
MIN_VERSION, MAX_VERSION = 0, 1


async def handle(ctx, request: dict, version: int) -> dict:
    return await alter(ctx, request, version, API_KEY, incremental=True)
