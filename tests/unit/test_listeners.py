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


def test_sasl_listeners_resolve_with_their_protocols():
    lc = resolve(listeners="SASL_PLAINTEXT://:1,SASL_SSL://:2,CLIENT://:3",
                 protocol_map="SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,CLIENT:PLAINTEXT",
                 inter_broker_listener_name="SASL_SSL")
    assert [(x.name, x.security_protocol) for x in lc.listeners] == [
        ("SASL_PLAINTEXT", "SASL_PLAINTEXT"), ("SASL_SSL", "SASL_SSL"), ("CLIENT", "PLAINTEXT")]
    assert lc.inter_broker == "SASL_SSL"


def test_inter_broker_client_security_follows_the_inter_broker_listener(tmp_path):
    from broker.config import BrokerConfig, ConfigError
    base = dict(data_dir=tmp_path, listeners="A://127.0.0.1:1,B://127.0.0.1:2", inter_broker_listener_name="A",
                metadata_store="etcd://127.0.0.1:2379")
    assert BrokerConfig(**base, listener_security_protocol_map="A:PLAINTEXT,B:SASL_PLAINTEXT").validate() \
        .inter_broker_security.protocol == "PLAINTEXT"
    sec = BrokerConfig(**base, listener_security_protocol_map="A:SASL_PLAINTEXT,B:PLAINTEXT",
                       inter_broker_sasl_username="broker", inter_broker_sasl_password="pw",
                       sasl_mechanism_inter_broker_protocol="scram-sha-256").validate().inter_broker_security
    assert (sec.protocol, sec.sasl_mechanism, sec.sasl_username, sec.uses_tls) == \
        ("SASL_PLAINTEXT", "SCRAM-SHA-256", "broker", False)
    with pytest.raises(ConfigError, match="inter-broker-sasl-username"):
        BrokerConfig(**base, listener_security_protocol_map="A:SASL_PLAINTEXT,B:PLAINTEXT").validate()
    with pytest.raises(ConfigError, match="unsupported mechanism 'GSSAPI'"):
        BrokerConfig(**base, listener_security_protocol_map="A:SASL_PLAINTEXT,B:PLAINTEXT",
                     inter_broker_sasl_username="b", inter_broker_sasl_password="p",
                     sasl_mechanism_inter_broker_protocol="GSSAPI").validate()
