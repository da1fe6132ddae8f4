"""AlterUserScramCredentials (key 51), version 0 (flexible), KIP-554.

Upsertions carry the salt, iteration count and *salted* password (the client runs PBKDF2,
so the password never crosses the wire); the broker stores StoredKey/ServerKey derived
from it (broker/security/scram.py). Per user: UNSUPPORTED_SASL_MECHANISM for an unknown
mechanism id, UNACCEPTABLE_CREDENTIAL for an empty name or iterations outside
4096..16384, RESOURCE_NOT_FOUND when deleting a credential that does not exist,
DUPLICATE_RESOURCE for a user named twice in one request.
"""
from protocol.messages import ApiKey

from ..topics import TopicError

API_KEY = ApiKey.ALTER_USER_SCRAM_CREDENTIALS
MIN_VERSION, MAX_VERSION = 0, 0


async def handle(ctx, request: dict, version: int) -> dict:
    deletions, upsertions = request["deletions"] or [], request["upsertions"] or []
    try:
        results = await ctx.broker.credentials.alter(deletions, upsertions)
    except TopicError as e:   # the metadata store did not answer (cluster.controller_call)
        names = dict.fromkeys(op["name"] for op in list(deletions) + list(upsertions))
        results = {n: (e.code, str(e)) for n in names}
    return {"throttle_time_ms": 0,
            "results": [{"user": u, "error_code": code, "error_message": msg} for u, (code, msg) in results.items()]}
