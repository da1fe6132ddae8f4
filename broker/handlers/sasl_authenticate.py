"""SaslAuthenticate (key 36), versions 0-2.

v1 adds session_lifetime_ms (KIP-368; canopy answers 0: no re-authentication needed);
v2 is flexible. The exchange itself is run by broker/security/sasl.py on SASL listeners
before authentication; a SaslAuthenticate that reaches this table came on a listener
without SASL or after authentication: ILLEGAL_SASL_STATE, as Kafka answers.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

API_KEY = ApiKey.SASL_AUTHENTICATE
MIN_VERSION, MAX_VERSION = 0, 2


async def handle(ctx, request: dict, version: int) -> dict:
    return {"error_code": ErrorCode.ILLEGAL_SASL_STATE,
            "error_message": "SaslAuthenticate is only accepted during SASL authentication",
            "auth_bytes": b"", "session_lifetime_ms": 0}
