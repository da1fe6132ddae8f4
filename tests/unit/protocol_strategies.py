"""Hypothesis strategies generated from Kafka's JSON message schemas.

The schema JSON is walked exactly the way ``protocol/schema.py`` walks it (same loader,
same version/nullable/tagged rules, same snake_case names), but independently of its
construct codecs: for one (message, version) the strategy yields dicts holding exactly the
fields that exist in that version, every value inside its wire type's range, nullable
fields sometimes None, tagged fields sometimes left at their default (so they are absent
on the wire) and arrays kept small so hundreds of examples stay cheap.

A generated dict is "complete": decoding its encoding must give back the same dict.
"""
from __future__ import annotations

import uuid

from hypothesis import strategies as st

from protocol.messages import api
from protocol.schema import MessageSchema, _default_value, _in, parse_versions, snake_case

# The API keys (and every version canopy's codec knows for each) under test.
API_KEYS = [0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 19, 20, 21, 22, 23, 32, 37, 60]

MAX_ARRAY = 3
MAX_TEXT = 12
MAX_BYTES = 24

_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
}

ZERO_UUID = uuid.UUID(int=0)


def message_cases(kinds=("request", "response")) -> list[tuple[int, int, str]]:
    """Every (api key, version, 'request'|'response') under test."""
    out = []
    for key in API_KEYS:
        a = api(key)
        lo, hi = a.versions
        for v in range(lo, hi + 1):
            for kind in kinds:
                out.append((key, v, kind))
    return out


def schema_for(key: int, kind: str) -> MessageSchema:
    a = api(key)
    return a.request if kind == "request" else a.response


def case_id(case) -> str:
    key, v, kind = case
    return f"{api(key).name}{kind.capitalize()}-v{v}"


def _ints(t):
    lo, hi = _INT_RANGES[t]
    # Edges are where sign and width bugs live; draw them often.
    return st.one_of(st.sampled_from([lo, hi, 0, -1 if lo < 0 else 1]), st.integers(lo, hi))


def _text():
    # Any unicode scalar value (hypothesis excludes surrogates by default), so multi-byte
    # UTF-8 exercises the byte-length prefixes rather than character counts.
    return st.text(max_size=MAX_TEXT)


def _primitive(t: str):
    if t in _INT_RANGES:
        return _ints(t)
    if t == "float64":
        return st.floats(allow_nan=False)
    if t == "bool":
        return st.booleans()
    if t == "uuid":
        return st.one_of(st.just(ZERO_UUID), st.uuids())
    if t == "string":
        return _text()
    if t in ("bytes", "records"):
        return st.binary(max_size=MAX_BYTES)
    raise AssertionError(f"unknown primitive {t}")


def field_value(fj: dict, version: int, flexible: bool):
    """Strategy for one field's value in ``version`` (None allowed when nullable)."""
    t = fj["type"]
    nullable = _in(version, parse_versions(fj.get("nullableVersions")))
    if t.startswith("[]"):
        inner = t[2:]
        el = struct_strategy(fj["fields"], version, flexible) if "fields" in fj else _primitive(inner)
        base = st.lists(el, max_size=MAX_ARRAY)
    elif "fields" in fj:
        base = struct_strategy(fj["fields"], version, flexible)
    else:
        base = _primitive(t)
    # Nullable struct fields are not used by any API under test (nor supported by the
    # codec); arrays, strings and bytes are the nullable kinds that occur.
    if nullable and not ("fields" in fj and not t.startswith("[]")):
        return st.one_of(st.none(), base)
    return base


def struct_strategy(fields_json: list, version: int, flexible: bool):
    required = {}
    for fj in fields_json:
        if not _in(version, parse_versions(fj["versions"])):
            continue
        name = snake_case(fj["name"])
        value = field_value(fj, version, flexible)
        if flexible and _in(version, parse_versions(fj.get("taggedVersions"))):
            # Tagged: often left at the default, which is what most senders do and means
            # the field is absent from the tagged-field section.
            value = st.one_of(st.just(_tagged_default(fj, version, flexible)), value)
        required[name] = value
    return st.fixed_dictionaries(required)


def _tagged_default(fj: dict, version: int, flexible: bool):
    default = _default_value(fj, version)
    if isinstance(default, dict):  # a struct: its own fields' defaults, recursively
        return struct_defaults(fj["fields"], version, flexible)
    return default


def struct_defaults(fields_json: list, version: int, flexible: bool) -> dict:
    out = {}
    for fj in fields_json:
        if _in(version, parse_versions(fj["versions"])):
            out[snake_case(fj["name"])] = _tagged_default(fj, version, flexible)
    return out


def message_strategy(schema: MessageSchema, version: int):
    """Complete message dicts for ``schema`` at ``version``."""
    return struct_strategy(schema.json["fields"], version, schema.is_flexible(version))


# --------------------------------------------------------------------------- schema walk
# Helpers for tests that need per-field type information while walking a value.

def iter_fields(fields_json: list, version: int, flexible: bool):
    """(snake name, field json, is_tagged) for the fields present in ``version``."""
    for fj in fields_json:
        if _in(version, parse_versions(fj["versions"])):
            tagged = flexible and _in(version, parse_versions(fj.get("taggedVersions")))
            yield snake_case(fj["name"]), fj, tagged
