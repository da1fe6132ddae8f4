"""SaslHandshake (key 17), versions 0-1.

v0: the SASL tokens that follow travel as bare length-prefixed frames; v1: inside
SaslAuthenticate requests (KIP-152). On a SASL listener the exchange is run by
broker/security/sasl.py before any request reaches this table; a handshake that gets
here came on a listener without SASL or after authentication, which Kafka answers
ILLEGAL_SASL_STATE.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

API_KEY = ApiKey.SASL_HANDSHAKE
MIN_VERSION, MAX_VERSION = 0, 1


async def handle(ctx, request: dict, version: int) -> dict:
    return {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "mechanisms": []}
