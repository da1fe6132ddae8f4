"""protocol.schema cross-checked against kafka-python 3.0.12's own message classes.

For every (API, version, request/response) under test, with dicts generated from the JSON
schema (protocol_strategies):

* canopy encodes -> kafka-python decodes -> the same values;
* kafka-python encodes an object built from the same dict -> canopy decodes -> the same
  dict, and the two encoders' bytes are identical.

kafka-python is an independent implementation of the same JSON (its own field walker and
a code-generating encoder/decoder), so agreement here means canopy speaks what stock
clients speak. Representational differences are normalised per field, each one explained
in ``_Theirs`` below; nothing is normalised by comparing loosely.

kafka-python quirks found and worked around (none of them change bytes on the wire):

1. UUIDs: kafka-python decodes the all-zero UUID as None (and encodes None as zero);
   canopy keeps uuid.UUID(int=0). Normalised both ways: their None <-> UUID(int=0).
   This matters on the wire for tagged uuids (Fetch v17+ ``replica_directory_id``):
   kafka-python's tagged default is None, so handed UUID(int=0) it would write the tag
   (a needless 18 bytes, still decodable); as None it omits it like canopy and Kafka.
2. ``authorized_operations`` bitfields: kafka-python patches the int32
   Metadata/DescribeCluster ``cluster_authorized_operations`` /
   ``topic_authorized_operations`` (renamed there to ``authorized_operations``) and
   DescribeGroups ``authorized_operations`` into a set of bit numbers, with {31} (i.e.
   INT32_MIN, Kafka's "not requested" default) shown as None. canopy keeps the int32.
   Normalised by converting sets <-> signed int32 and None <-> -2**31. Fields are paired
   by schema position, so the rename needs no table.
3. Tagged struct fields (e.g. Fetch ``current_leader``, ``snapshot_id``,
   ``diverging_epoch``; Produce ``current_leader``; Fetch request ``replica_state``):
   kafka-python's default is None, canopy's is the struct with its own field defaults.
   Both leave the field off the wire when it equals the default. Normalised: a tagged
   struct equal to canopy's default is handed to kafka-python as None, and their None is
   read back as canopy's default.
4. ApiVersionsResponse: kafka-python decodes the body as v0 whenever error_code != 0
   (a broker answering an unsupported version replies with a v0 body, KIP-511). A
   non-v0 body with an error is therefore unreadable by kafka-python by design; canopy's
   codec decodes the version it is told. The canopy->kafka-python direction pins
   error_code to 0 for v1+ (the error case is covered by a dedicated test).
5. Produce v0-v2: Kafka 4's schemas (and so the JSON) start Produce at v3; kafka-python
   ignores every schema's minimum version (ApiMessageData forces it to 0), so it encodes
   and decodes v0-v2 with the v3 field layout minus the fields whose ``versions`` start
   later -- the same widening canopy's messages._WIDENED does. Cross-checked below like
   any other version and byte-identical; because both sides widen the same way, every
   non-flexible version kafka-python still has a hand-written (pre-JSON) layout for --
   Produce v0-v8 included, 174 (API, version, direction) triples -- is also checked
   against kafka.protocol.old, a third independent oracle; they agree byte for byte.
6. MetadataRequest v0: kafka-python rewrites topics=None to [] before encoding v0; v0
   topics are not nullable, so the generated dicts never hold None there.
7. Defaults (test_defaults_match_kafka_python): kafka-python defaults ``records`` fields
   to b"" where Kafka's generator (and canopy) use null, and patches ListOffsetsRequest
   ReplicaId's default to -1 where Kafka's JSON gives 0. See DEFAULT_OVERRIDES.
"""
from __future__ import annotations

import inspect
from io import BytesIO
import os
import uuid

import pytest
from hypothesis import HealthCheck, given, settings

import kafka.protocol.admin as k_admin
import kafka.protocol.consumer as k_consumer
import kafka.protocol.metadata as k_metadata
import kafka.protocol.producer as k_producer
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.schemas.fields.codecs import BitField

from protocol.messages import api

from .protocol_strategies import (
    case_id, iter_fields, message_cases, message_strategy, schema_for, struct_defaults)

CASES = message_cases()
SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None)
EXAMPLES = int(os.environ.get("CANOPY_PROTOCOL_EXAMPLES", "10"))
ZERO_UUID = uuid.UUID(int=0)
INT32_MIN = -(2**31)


def _kafka_python_classes() -> dict[str, type]:
    out = {}
    for mod in (k_admin, k_consumer, k_metadata, k_producer):
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and issubclass(obj, ApiMessage) and obj is not ApiMessage:
                out[obj.name] = obj
    return out


THEIR_CLASSES = _kafka_python_classes()


def their_class(key: int, kind: str):
    return THEIR_CLASSES[schema_for(key, kind).name]


class _Theirs:
    """Converts between canopy's dicts and kafka-python's objects for one version.

    Walks canopy's schema JSON and kafka-python's parsed fields side by side, by position:
    both come from the same JSON file, and kafka-python's json_patch only renames/retypes
    fields, never reorders them."""

    def __init__(self, version: int, flexible: bool):
        self.version = version
        self.flexible = flexible

    def _pairs(self, fields_json, their_fields):
        their_fields = list(their_fields)
        assert len(their_fields) == len(fields_json)
        present = {id(fj): (name, tagged) for name, fj, tagged in
                   iter_fields(fields_json, self.version, self.flexible)}
        for fj, tf in zip(fields_json, their_fields):
            if id(fj) in present:
                assert tf.for_version_q(self.version)
                name, tagged = present[id(fj)]
                yield name, fj, tf, tagged

    # canopy dict -> kafka-python constructor kwargs
    def kwargs(self, fields_json, their_fields, value: dict) -> dict:
        out = {}
        for name, fj, tf, tagged in self._pairs(fields_json, their_fields):
            out[tf.name] = self._to(fj, tf, tagged, value[name])
        return out

    def _to(self, fj, tf, tagged, v):
        if v is None:
            return None
        if tf.is_struct():
            if tagged and v == struct_defaults(fj["fields"], self.version, self.flexible):
                return None  # quirk 3
            return tf.data_class(version=self.version, **self.kwargs(fj["fields"], tf._fields, v))
        if tf.is_struct_array():
            inner = tf.array_of
            return [inner.data_class(version=self.version, **self.kwargs(fj["fields"], inner._fields, e))
                    for e in v]
        if tf.type_str == "bitfield":  # quirk 2
            bits = BitField.from_32_bit_field(v & 0xFFFFFFFF)
            return None if bits == {31} else bits
        if tf.type_str == "uuid" and v == ZERO_UUID:  # quirk 1
            return None
        return v

    # kafka-python object -> canopy dict
    def dict(self, fields_json, their_fields, obj) -> dict:
        out = {}
        for name, fj, tf, tagged in self._pairs(fields_json, their_fields):
            out[name] = self._from(fj, tf, tagged, getattr(obj, tf.name))
        return out

    def _from(self, fj, tf, tagged, v):
        if tf.is_struct():
            if v is None and tagged:  # quirk 3
                return struct_defaults(fj["fields"], self.version, self.flexible)
            return self.dict(fj["fields"], tf._fields, v)
        if tf.is_struct_array():
            if v is None:
                return None
            return [self.dict(fj["fields"], tf.array_of._fields, e) for e in v]
        if tf.type_str == "bitfield":  # quirk 2
            raw = BitField.to_32_bit_field({31} if v is None else v)
            return raw - 2**32 if raw >= 2**31 else raw
        if tf.type_str == "uuid" and v is None:  # quirk 1
            return ZERO_UUID
        if isinstance(v, memoryview):
            return v.tobytes()
        return v


def _prepare(key, version, kind, msg):
    """Generated dict -> (canopy's schema, kafka-python class, converter, msg)."""
    schema = schema_for(key, kind)
    cls = their_class(key, kind)
    conv = _Theirs(version, schema.is_flexible(version))
    return schema, cls, conv, msg


def theirs_from_dict(cls, conv, schema, msg, version):
    return cls(version=version, **conv.kwargs(schema.json["fields"], cls._struct._fields, msg))


def dict_from_theirs(cls, conv, schema, obj):
    return conv.dict(schema.json["fields"], cls._struct._fields, obj)


def test_kafka_python_has_every_message():
    for key, _, kind in CASES:
        assert schema_for(key, kind).name in THEIR_CLASSES


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_crosscheck(case):
    key, version, kind = case
    schema = schema_for(key, kind)
    cls = their_class(key, kind)
    conv = _Theirs(version, schema.is_flexible(version))

    @settings(max_examples=EXAMPLES, **SETTINGS)
    @given(message_strategy(schema, version))
    def check(msg):
        if cls.name == "ApiVersionsResponse" and version > 0:
            msg = {**msg, "error_code": 0}  # quirk 4
        ours = schema.encode(msg, version)

        # canopy -> kafka-python
        decoded = cls.decode(ours, version=version)
        assert dict_from_theirs(cls, conv, schema, decoded) == msg

        # kafka-python -> canopy, byte for byte
        obj = theirs_from_dict(cls, conv, schema, msg, version)
        theirs = obj.encode(version=version)
        assert schema.decode(theirs, version) == msg
        assert theirs == ours

    check()


def test_api_versions_error_body_is_v0_for_kafka_python():
    """Quirk 4 from the broker's side: an UNSUPPORTED_VERSION (35) answer to any
    ApiVersions version is a v0 body, which kafka-python reads whatever it asked for."""
    schema = api(18).response
    body = schema.encode({"error_code": 35, "api_keys": [
        {"api_key": 18, "min_version": 0, "max_version": 4}]}, 0)
    cls = THEIR_CLASSES["ApiVersionsResponse"]
    for version in range(0, 5):
        got = cls.decode(body, version=version)
        assert got.error_code == 35
        assert [(k.api_key, k.min_version, k.max_version) for k in got.api_keys] == [(18, 0, 4)]


# --------------------------------------------------------------------------- defaults

def _skeletons(conv: _Theirs, fields_json, their_fields):
    """(canopy dict, kafka-python kwargs) that set only the structure -- every struct array
    holds one element, every untagged struct is present -- and leave every scalar out, so
    each side's own default fills it (except the documented differences below)."""
    ours, theirs = {}, {}
    for name, fj, tf, tagged in conv._pairs(fields_json, their_fields):
        if tf.is_struct_array():
            o, t = _skeletons(conv, fj["fields"], tf.array_of._fields)
            ours[name] = [o]
            theirs[tf.name] = [tf.array_of.data_class(version=conv.version, **t)]
        elif tf.is_struct() and not tagged:
            o, t = _skeletons(conv, fj["fields"], tf._fields)
            ours[name] = o
            theirs[tf.name] = tf.data_class(version=conv.version, **t)
        elif fj["type"] == "records":
            theirs[tf.name] = None  # default difference (a), see below
    return ours, theirs


# Default differences with kafka-python 3.0.12 (canopy follows Kafka's generator):
# (a) ``records`` fields (Produce PartitionData.Records, Fetch PartitionData.Records):
#     Kafka's MessageGenerator defaults every records field to null; kafka-python
#     defaults them to b"". So a Fetch partition whose records the broker leaves out goes
#     out as null (length -1) -- Java maps that to MemoryRecords.EMPTY, but handlers
#     should set records explicitly (b"" for error partitions), as Kafka's broker does.
# (b) ListOffsetsRequest.ReplicaId has no default in Kafka's JSON (so 0); kafka-python's
#     json_patch makes it -1 ("normal consumer"). Only a ListOffsets canopy itself sent
#     could be affected; it sends none, and clients always set the field.
DEFAULT_OVERRIDES = {"ListOffsetsRequest": {"replica_id": -1}}


def test_known_default_differences():
    from kafka.protocol.consumer import FetchResponse, ListOffsetsRequest
    assert api(2).request.defaults(5)["replica_id"] == 0
    assert ListOffsetsRequest(version=5).replica_id == -1
    partition = api(1).response.defaults(12)  # records default, one level down
    records_field = FetchResponse.fields["responses"].fields["partitions"].fields["records"]
    assert records_field.default == b""
    ours = api(1).response.encode({"responses": [{"partitions": [{}]}]}, 12)
    assert api(1).response.decode(ours, 12)["responses"][0]["partitions"][0]["records"] is None
    assert partition["responses"] == []


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_defaults_match_kafka_python(case):
    """Fields left out take the same default on both sides, at every nesting level."""
    key, version, kind = case
    schema = schema_for(key, kind)
    cls = their_class(key, kind)
    conv = _Theirs(version, schema.is_flexible(version))
    ours, theirs = _skeletons(conv, schema.json["fields"], cls._struct._fields)
    ours.update(DEFAULT_OVERRIDES.get(cls.name, {}))
    assert cls(version=version, **theirs).encode(version=version) == schema.encode(ours, version)


# --------------------------------------------------------------------------- Produce v0-v2

def _as_old(fields_json, version, value: dict, old_schema) -> tuple:
    """canopy dict -> the nested tuples kafka-python's hand-written (pre-JSON) Structs use,
    walking canopy's schema JSON and the old Schema side by side (non-flexible versions
    only, so no tagged fields). Representational differences of the old layouts, all
    byte-identical on the wire:

    * a struct array whose element struct has a single field is written there as an
      array of that field's values (MetadataRequest topics as []string,
      CreatePartitionsRequest assignments as [][]int32);
    * consecutive fields may be grouped into an inline Schema, which has no length prefix
      (CreatePartitionsRequest v0-v1 ``new_partitions`` = count + assignments);
    * authorized_operations is the old BitField type: a set of bit numbers, None for
      INT32_MIN (the JSON classes' quirk 2 again).
    """
    present = list(iter_fields(fields_json, version, False))
    return _as_old_fields(present, value, old_schema, version)


def _as_old_fields(present, value, old_schema, version) -> tuple:
    import kafka.protocol.old.types as T

    out, i = [], 0
    for ot in old_schema.fields:
        name, fj, _ = present[i]
        v = value[name]
        if isinstance(ot, T.Schema) and "fields" not in fj:  # an inline group of fields
            n = len(ot.fields)
            out.append(_as_old_fields(present[i:i + n], value, ot, version))
            i += n
            continue
        i += 1
        if v is not None and "fields" in fj:
            if fj["type"].startswith("[]"):
                el = ot.array_of
                if isinstance(el, T.Schema):
                    v = [_as_old(fj["fields"], version, e, el) for e in v]
                else:  # flattened single-field struct
                    (inner,) = list(iter_fields(fj["fields"], version, False))
                    v = [e[inner[0]] for e in v]
            else:
                v = _as_old(fj["fields"], version, v, ot)
        elif ot is T.BitField:
            bits = T.BitField.from_32_bit_field(v & 0xFFFFFFFF)
            v = None if bits == {31} else bits
        out.append(v)
    assert i == len(present), (present, old_schema.names)
    return tuple(out)


def _handwritten_classes() -> dict[tuple[str, int], type]:
    import importlib
    import pkgutil
    import re

    import kafka.protocol.old as old
    out = {}
    for info in pkgutil.iter_modules(old.__path__):
        mod = importlib.import_module(f"kafka.protocol.old.{info.name}")
        for name, obj in vars(mod).items():
            m = re.fullmatch(r"(\w+(?:Request|Response))_v(\d+)", name)
            if m and inspect.isclass(obj) and hasattr(obj, "SCHEMA"):
                out[(m.group(1), int(m.group(2)))] = obj
    return out


HANDWRITTEN = _handwritten_classes()
# Every non-flexible (API, version, direction) kafka-python also has a hand-written layout
# for (flexible ones would need its old TaggedFields handling; the JSON cross-check covers
# them).
HANDWRITTEN_CASES = [c for c in CASES if not schema_for(c[0], c[2]).is_flexible(c[1])
                     and (schema_for(c[0], c[2]).name, c[1]) in HANDWRITTEN]


def test_handwritten_cover_produce_v0_to_v2():
    assert {(v, kind) for k, v, kind in HANDWRITTEN_CASES if k == 0} >= {
        (v, kind) for v in (0, 1, 2) for kind in ("request", "response")}


@pytest.mark.parametrize("case", HANDWRITTEN_CASES, ids=case_id)
def test_matches_kafka_python_handwritten_layouts(case):
    """A third, independent oracle. The JSON cross-check above shares its input with
    canopy, so a version both sides read the same wrong way would pass it -- notably
    Produce v0-v2, outside Kafka 4's JSON (validVersions 3-13), which canopy and
    kafka-python both widen from the v3 schema (quirk 5). kafka-python also ships its
    older hand-written layouts (kafka.protocol.old, transcribed from the protocol guide
    before it moved to the JSON): same bytes both ways."""
    key, version, kind = case
    schema = schema_for(key, kind)
    old_cls = HANDWRITTEN[(schema.name, version)]

    @settings(max_examples=EXAMPLES, **SETTINGS)
    @given(message_strategy(schema, version))
    def check(msg):
        ours = schema.encode(msg, version)
        expected = _as_old(schema.json["fields"], version, msg, old_cls.SCHEMA)
        assert old_cls.SCHEMA.encode(expected) == ours
        assert tuple(old_cls.SCHEMA.decode(BytesIO(ours))) == expected

    check()
