"""DescribeUserScramCredentials (key 50), version 0 (flexible), KIP-554.

Lists each user's SCRAM mechanisms and iteration counts, never salts or keys. A null or
empty user list means every user; an unknown user is RESOURCE_NOT_FOUND and a user asked
twice DUPLICATE_RESOURCE, per user, as Kafka answers.
"""
from protocol.messages import ApiKey

from ..security.scram import describe

API_KEY = ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS
MIN_VERSION, MAX_VERSION = 0, 0


async def handle(ctx, request: dict, version: int) -> dict:
    names = [u["name"] for u in request.get("users") or []]
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None,
            "results": describe(ctx.broker.credentials.users(), names)}
