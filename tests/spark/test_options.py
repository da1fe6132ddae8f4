"""Pure parts of the canopy source: option parsing, offset JSON, maxOffsetsPerTrigger split."""
from __future__ import annotations

import re

import pytest

from canopy_spark import kafka as K
from canopy_spark.source import CanopyStreamReader


def test_offsets_json_round_trip_is_sparks_format():
    offs = {("t", 0): 5, ("t", 1): 7, ("u", 0): 0}
    j = K.to_offsets_json(offs)
    assert j == {"t": {"0": 5, "1": 7}, "u": {"0": 0}}
    assert K.from_offsets_json(j) == offs


def test_subscription_needs_exactly_one_strategy():
    assert K.Subscription.from_options({"subscribe": "a, b"}).value == ["a", "b"]
    assert K.Subscription.from_options({"assign": '{"a":[0,2]}'}).value == {"a": [0, 2]}
    pat = K.Subscription.from_options({"subscribepattern": "ord.*"}).value
    assert isinstance(pat, re.Pattern) and pat.search("my-orders")  # found, as Spark 4
    for bad in ({}, {"subscribe": "a", "assign": '{"a":[0]}'}):
        with pytest.raises(ValueError, match="exactly one"):
            K.Subscription.from_options(bad)


def test_client_config_strips_prefix_and_java_only_keys():
    conf = K.client_config({"kafka.bootstrap.servers": "h:1", "kafka.client.id": "x",
                            "kafka.key.deserializer": "Foo", "subscribe": "t"})
    assert conf == {"bootstrap.servers": "h:1", "client.id": "x"}
    with pytest.raises(ValueError, match="bootstrap"):
        K.client_config({"subscribe": "t"})


def test_rate_limit_shares_max_offsets_by_lag_and_always_progresses():
    begin = {("t", 0): 0, ("t", 1): 100}
    latest = {("t", 0): 300, ("t", 1): 200}  # lags 300 and 100
    out = CanopyStreamReader._rate_limit(begin, latest, 100)
    assert out == {("t", 0): 75, ("t", 1): 125}
    assert sum(out[tp] - begin[tp] for tp in begin) == 100
    # tiny limits still move forward
    out = CanopyStreamReader._rate_limit(begin, latest, 1)
    assert sum(out[tp] - begin[tp] for tp in begin) == 1
    # under the limit: everything
    assert CanopyStreamReader._rate_limit(begin, latest, 10_000) == latest
