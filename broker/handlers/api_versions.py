"""ApiVersions (key 18), versions 0-3.

v1 adds throttle_time_ms; v3 is flexible and the request carries the client's software
name/version (ignored here). Whatever the version, the response header is v0 (KIP-511),
so a client can read the answer to a version the broker does not support.
"""
import functools

from protocol.errors import ErrorCode
from protocol.framing import frame, response_header
from protocol.messages import ApiKey, api

API_KEY = ApiKey.API_VERSIONS
MIN_VERSION, MAX_VERSION = 0, 3


@functools.cache
def supported_api_keys() -> list[dict]:
    """The dispatch table as ApiVersions lists it; fixed once the handlers are imported,
    so made once (every client connection starts with this request)."""
    from . import HANDLERS
    return [{"api_key": k, "min_version": m.MIN_VERSION, "max_version": m.MAX_VERSION}
            for k, m in sorted(HANDLERS.items()) if getattr(m, "ADVERTISED", True)]


@functools.cache
def _encoded_api_keys(version: int):
    return api(API_KEY).response.encode_array(version, ("api_keys",), supported_api_keys())


async def handle(ctx, request: dict, version: int) -> dict:
    # The list is encoded once per version: 40 structs took more of a new connection's
    # first answer than anything else in the handler.
    return {"error_code": 0, "api_keys": _encoded_api_keys(version), "throttle_time_ms": 0}


def unsupported_version_response(correlation_id: int) -> bytes:
    body = api(API_KEY).response.encode(
        {"error_code": ErrorCode.UNSUPPORTED_VERSION, "api_keys": supported_api_keys()}, 0)
    return frame(response_header(correlation_id, 0), body)
