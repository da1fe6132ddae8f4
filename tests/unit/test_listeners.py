"""broker/listeners.py: the listener options resolved as Kafka's KafkaConfig resolves them."""
from __future__ import annotations

import pytest

from broker.listeners import Listener, ListenerError, build, parse_endpoints, parse_protocol_map


def resolve(**kw):
    args = dict(listen="127.0.0.1:9092", listen_given=False, advertise=None, listeners="",
                advertised_listeners="", protocol_map="", inter_broker_listener_name="")
    args.update(kw)
    return build(**args)


def test_listen_and_advertise_are_one_plaintext_listener():
    lc = resolve(listen="0.0.0.0:9093", listen_given=True)
    assert lc.listeners == (Listener("PLAINTEXT", "0.0.0.0", 9093, "PLAINTEXT"),)
    # a wildcard cannot be dialled: advertised as loopback, as before listeners existed
    assert lc.advertised == {"PLAINTEXT": ("127.0.0.1", 9093)} and lc.inter_broker == "PLAINTEXT"
    lc = resolve(listen="0.0.0.0:9093", listen_given=True, advertise="canopy-1:9093")
    assert lc.inter_broker_address == ("canopy-1", 9093)


def test_internal_and_external():
    lc = resolve(listeners="internal://0.0.0.0:9092, EXTERNAL://[::1]:19092",
                 advertised_listeners="INTERNAL://canopy-1:9092",
                 protocol_map="INTERNAL:PLAINTEXT,EXTERNAL:plaintext", inter_broker_listener_name="internal")
    assert [str(x) for x in lc.listeners] == ["INTERNAL://0.0.0.0:9092", "EXTERNAL://[::1]:19092"]
    assert lc.advertised == {"INTERNAL": ("canopy-1", 9092), "EXTERNAL": ("::1", 19092)}
    assert lc.inter_broker == "INTERNAL" and lc.inter_broker_address == ("canopy-1", 9092)


def test_default_map_names_protocols_and_plaintext_is_the_default_inter_broker_listener():
    lc = resolve(listeners="PLAINTEXT://:1,OTHER://:2", protocol_map="PLAINTEXT:PLAINTEXT,OTHER:PLAINTEXT")
    assert lc.inter_broker == "PLAINTEXT"
    with pytest.raises(ListenerError, match="no entry"):
        resolve(listeners="PLAINTEXT://:1,OTHER://:2")   # a given map replaces the default; none given here


@pytest.mark.parametrize("kw, needle", [
    (dict(listeners="A://:1", protocol_map="A:GSSAPI"), "unknown security protocol"),
    (dict(listeners="A://:1,B://:1", protocol_map="A:PLAINTEXT,B:PLAINTEXT", inter_broker_listener_name="A"),
     "bind the same address"),
    (dict(listeners="A://h:1", protocol_map="A"), "is not NAME:PROTOCOL"),
    (dict(listeners="A://h:70000", protocol_map="A:PLAINTEXT"), "out of range"),
    (dict(listeners=" , "), "no listener given"),
    (dict(listeners="A B://h:1"), "bad listener name"),
])
def test_refusals(kw, needle):
    with pytest.raises(ListenerError, match=needle):
        resolve(**kw)


def test_parsers_keep_order_and_upper_case_names():
    assert list(parse_endpoints("b://h:1,a://h:2", "listeners")) == ["B", "A"]
    assert parse_protocol_map("x:sasl_ssl") == {"X": "SASL_SSL"}
