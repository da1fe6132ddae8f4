"""ACLs (issue 11, proof 3) against a real broker with `--authorizer standard`: principals are
mTLS client certificates made with trustme (admin, alice, bob: different subject DNs); the
admin is a super user. ACLs are managed with kafka-python's and confluent-kafka's admin
clients and the Java AdminClient (3.9.1, 4.3.0); produce/consume with confluent-kafka and
kafka-python; exact error codes are read with a raw client over TLS.
"""
from __future__ import annotations

import ssl
import subprocess
import time

import pytest
import trustme
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                   NewTopic, ResourcePatternType, ResourceType)
from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import (ACL, ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType,
                         ResourcePattern, ResourcePatternFilter)
from kafka.admin import ResourceType as KPResourceType
from kafka.errors import ClusterAuthorizationFailedError

from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from .conftest import ROOT, free_port
from .rawclient import RawClient
from .test_java_client import KAFKA_VERSIONS, compile_java
from .test_listeners import ListenersBroker

ORG = "OU=acl,O=Canopy Tests"
ADMIN, ALICE, BOB = f"User:CN=admin,{ORG}", f"User:CN=alice,{ORG}", f"User:CN=bob,{ORG}"


class AclCerts:
    def __init__(self, d, hosts=("127.0.0.1",)):
        self.ca = trustme.CA()
        self.ca_pem = d / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_pem))
        self.server = d / "server.pem"
        self.ca.issue_cert(*hosts, "localhost").private_key_and_cert_chain_pem.write_to_path(str(self.server))
        self.users = {}
        for name in ("admin", "alice", "bob"):
            cert = self.ca.issue_cert(f"{name}@example.com", common_name=name, organization_name="Canopy Tests",
                                        organization_unit_name="acl")
            key, crt = d / f"{name}.key", d / f"{name}.crt"
            cert.private_key_pem.write_to_path(str(key))
            cert.cert_chain_pems[0].write_to_path(str(crt))
            self.users[name] = (crt, key)

    def confluent(self, user: str, bootstrap: str) -> dict:
        crt, key = self.users[user]
        return {"bootstrap.servers": bootstrap, "security.protocol": "ssl", "ssl.ca.location": str(self.ca_pem),
                "ssl.certificate.location": str(crt), "ssl.key.location": str(key)}

    def kafka_python(self, user: str, bootstrap: str) -> dict:
        crt, key = self.users[user]
        return {"bootstrap_servers": bootstrap, "security_protocol": "SSL", "ssl_cafile": str(self.ca_pem),
                "ssl_certfile": str(crt), "ssl_keyfile": str(key)}

    def raw(self, user: str, bootstrap: str) -> RawClient:
        c = RawClient(bootstrap)
        ctx = ssl.create_default_context(cafile=str(self.ca_pem))
        crt, key = self.users[user]
        ctx.load_cert_chain(str(crt), str(key))
        c.sock = ctx.wrap_socket(c.sock, server_hostname=bootstrap.rsplit(":", 1)[0])
        return c


@pytest.fixture
def certs(tmp_path):
    d = tmp_path / "certs"
    d.mkdir()
    return AclCerts(d)


def start_broker(tmp_path, certs, plain=None, tls=None, extra=()):
    plain = plain or ("127.0.0.1", free_port())
    tls = tls or ("127.0.0.1", free_port())
    b = ListenersBroker(tmp_path, [
        "--listeners", "PLAINTEXT://%s:%d,SSL://%s:%d" % (*plain, *tls),
        "--ssl-keystore-location", str(certs.server), "--ssl-truststore-location", str(certs.ca_pem),
        "--ssl-client-auth", "required", "--authorizer", "standard", "--super-users", ADMIN, *extra],
        [plain, tls])
    b.plain, b.tls = "%s:%d" % plain, "%s:%d" % tls
    b.plain_addr, b.tls_addr = plain, tls
    return b


@pytest.fixture
def acl_broker(tmp_path, certs):
    b = start_broker(tmp_path, certs)
    try:
        yield b
    finally:
        b.stop()


def confluent_admin(certs, user, b) -> AdminClient:
    return AdminClient(certs.confluent(user, b.tls))


def binding(rt, name, principal, op, perm=AclPermissionType.ALLOW, pattern=ResourcePatternType.LITERAL):
    return AclBinding(rt, name, pattern, principal, "*", op, perm)


def create(admin: AdminClient, *bindings):
    for f in admin.create_acls(list(bindings), request_timeout=30).values():
        f.result(30)


def create_topics(certs, b, *names):
    admin = confluent_admin(certs, "admin", b)
    for f in admin.create_topics([NewTopic(n, 1, 1) for n in names]).values():
        f.result(30)


def produce_error(conf: dict, topic: str):
    """Produce one record; the delivery error (None on success)."""
    p = Producer({**conf, "message.timeout.ms": 15000})
    errors = []
    p.produce(topic, b"x", on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)
    assert len(errors) == 1
    return errors[0]


def test_acl_apis_need_an_authorizer_and_cluster_rights(tmp_path, certs, acl_broker):
    b = acl_broker
    # kafka-python: a non-super user may neither create nor list ACLs
    alice = KafkaAdminClient(**certs.kafka_python("alice", b.tls))
    acl = ACL(ALICE, "*", ACLOperation.READ, ACLPermissionType.ALLOW, ResourcePattern(KPResourceType.TOPIC, "t"))
    r = alice.create_acls([acl])
    assert r["failed"] == [ClusterAuthorizationFailedError], r
    with pytest.raises(ClusterAuthorizationFailedError):
        alice.describe_acls(ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                      ResourcePatternFilter(KPResourceType.ANY, None, ACLResourcePatternType.ANY)))
    alice.close()
    # the super user may; a binding that is not concrete is refused on its own
    admin = KafkaAdminClient(**certs.kafka_python("admin", b.tls))
    good = ACL(ALICE, "*", ACLOperation.READ, ACLPermissionType.ALLOW,
               ResourcePattern(KPResourceType.TOPIC, "logs-", ACLResourcePatternType.PREFIXED))
    other = ACL(BOB, "127.0.0.1", ACLOperation.ALL, ACLPermissionType.DENY,
                ResourcePattern(KPResourceType.GROUP, "g1"))
    r = admin.create_acls([good, other])
    assert r["failed"] == [] and len(r["succeeded"]) == 2, r
    everything = ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                           ResourcePatternFilter(KPResourceType.ANY, None, ACLResourcePatternType.ANY))
    acls, err = admin.describe_acls(everything)
    assert sorted((a.principal, a.resource_pattern.resource_name, a.resource_pattern.pattern_type)
                  for a in acls) == [(ALICE, "logs-", ACLResourcePatternType.PREFIXED),
                                     (BOB, "g1", ACLResourcePatternType.LITERAL)]
    # MATCH: the patterns that apply to topic logs-eu
    acls, _ = admin.describe_acls(ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                            ResourcePatternFilter(KPResourceType.TOPIC, "logs-eu",
                                                                  ACLResourcePatternType.MATCH)))
    assert [a.resource_pattern.resource_name for a in acls] == ["logs-"]
    [(flt, deleted, err)] = admin.delete_acls([ACLFilter(BOB, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                                         ResourcePatternFilter(KPResourceType.ANY, None,
                                                                               ACLResourcePatternType.ANY))])
    assert [(a.principal, a.resource_pattern.resource_name) for a in deleted] == [(BOB, "g1")]
    acls, _ = admin.describe_acls(everything)
    assert [a.principal for a in acls] == [ALICE]
    admin.close()
    # a raw filter with an UNKNOWN resource type: INVALID_REQUEST; a creation with ANY: INVALID_REQUEST
    raw = certs.raw("admin", b.tls)
    r = raw.request(ApiKey.DESCRIBE_ACLS, 2, {"resource_type_filter": 0, "resource_name_filter": None,
                                              "pattern_type_filter": 1, "principal_filter": None, "host_filter": None,
                                              "operation": 1, "permission_type": 1})
    assert r["error_code"] == ErrorCode.INVALID_REQUEST
    r = raw.request(ApiKey.CREATE_ACLS, 2, {"creations": [
        {"resource_type": 2, "resource_name": "t", "resource_pattern_type": 1, "principal": ALICE, "host": "*",
         "operation": 3, "permission_type": 3},
        {"resource_type": 4, "resource_name": "kafka-cluster", "resource_pattern_type": 3, "principal": ALICE,
         "host": "*", "operation": 8, "permission_type": 3}]})
    assert [x["error_code"] for x in r["results"]] == [ErrorCode.INVALID_REQUEST, 0]


def test_prefix_writer_cannot_read_or_touch_other_topics_and_deny_wins(certs, acl_broker):
    b = acl_broker
    create_topics(certs, b, "orders-eu", "orders-secret", "payments")
    admin = confluent_admin(certs, "admin", b)
    create(admin,
           binding(ResourceType.TOPIC, "orders-", ALICE, AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED),
           binding(ResourceType.TOPIC, "orders-secret", ALICE, AclOperation.WRITE, AclPermissionType.DENY),
           binding(ResourceType.GROUP, "alice-", ALICE, AclOperation.READ, pattern=ResourcePatternType.PREFIXED))
    alice = certs.confluent("alice", b.tls)
    # WRITE under the prefix works, with idempotence (InitProducerId: WRITE on some topic)
    p = Producer({**alice, "enable.idempotence": True})
    for i in range(100):
        p.produce("orders-eu", b"o%d" % i)
    assert p.flush(30) == 0
    assert produce_error(alice, "orders-eu") is None
    # DENY beats the prefixed ALLOW; another topic is refused
    assert produce_error(alice, "orders-secret").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert produce_error(alice, "payments").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # WRITE does not allow READ, even with the group allowed
    c = Consumer({**alice, "group.id": "alice-g", "auto.offset.reset": "earliest"})
    c.assign([TopicPartition("orders-eu", 0, 0)])
    err = None
    deadline = time.monotonic() + 30
    while err is None and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is not None:
            err = m.error()
        assert m is None or m.error() is not None, "alice read a record she may not read"
    c.close()
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err
    # The topic listing shows only what alice may describe (WRITE implies DESCRIBE)
    md = confluent_admin(certs, "alice", b).list_topics(timeout=30)
    assert sorted(md.topics) == ["orders-eu", "orders-secret"]
    # the admin (a super user) sees and does everything
    md = admin.list_topics(timeout=30)
    assert {"orders-eu", "orders-secret", "payments"} <= set(md.topics)
    assert produce_error(certs.confluent("admin", b.tls), "payments") is None
    # bob has no ACL at all: no topics, no idempotent producer id (CLUSTER_AUTHORIZATION_FAILED)
    bob = certs.confluent("bob", b.tls)
    assert sorted(confluent_admin(certs, "bob", b).list_topics(timeout=30).topics) == []
    raw = certs.raw("bob", b.tls)
    r = raw.request(ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout_ms": 60000,
                                                 "producer_id": -1, "producer_epoch": -1})
    assert r["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    # a topic bob may not describe answers TOPIC_AUTHORIZATION_FAILED whether it exists or not
    r = raw.request(ApiKey.METADATA, 12, {"topics": [{"name": "payments", "topic_id": None},
                                                     {"name": "no-such-topic", "topic_id": None}],
                                          "allow_auto_topic_creation": True,
                                          "include_topic_authorized_operations": False})
    assert sorted((t["name"], t["error_code"]) for t in r["topics"]) == [
        ("no-such-topic", ErrorCode.TOPIC_AUTHORIZATION_FAILED), ("payments", ErrorCode.TOPIC_AUTHORIZATION_FAILED)]
    assert produce_error(bob, "no-such-topic").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "no-such-topic" not in admin.list_topics(timeout=30).topics   # not auto-created for bob


def test_groups_transactional_ids_and_authorized_operations(certs, acl_broker):
    b = acl_broker
    create_topics(certs, b, "events")
    admin = confluent_admin(certs, "admin", b)
    create(admin,
           binding(ResourceType.TOPIC, "events", BOB, AclOperation.READ),
           binding(ResourceType.GROUP, "bob-ok", BOB, AclOperation.READ),
           binding(ResourceType.TRANSACTIONAL_ID, "tx-", BOB, AclOperation.WRITE,
                   pattern=ResourcePatternType.PREFIXED))
    assert produce_error(certs.confluent("admin", b.tls), "events") is None
    # kafka-python consumer in an allowed group reads and commits
    consumer = KafkaConsumer("events", group_id="bob-ok", auto_offset_reset="earliest", consumer_timeout_ms=15000,
                             **certs.kafka_python("bob", b.tls))
    assert [m.value for m in consumer] == [b"x"]
    consumer.commit()
    consumer.close()
    raw = certs.raw("bob", b.tls)

    def coordinator(key, key_type):
        r = raw.request(ApiKey.FIND_COORDINATOR, 4, {"key_type": key_type, "coordinator_keys": [key]})
        return r["coordinators"][0]
    assert coordinator("bob-ok", 0)["error_code"] == 0
    assert coordinator("other", 0)["error_code"] == ErrorCode.GROUP_AUTHORIZATION_FAILED
    # transactional ids: WRITE on tx-* implies DESCRIBE; others are refused by the ACL
    assert coordinator("zz-1", 1)["error_code"] == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert coordinator("zz-1", 1)["error_message"] == "DESCRIBE is needed"
    assert coordinator("tx-1", 1)["error_message"] == "canopy does not support transactions"
    r = raw.request(ApiKey.JOIN_GROUP, 9, {"group_id": "other", "session_timeout_ms": 10000,
                                           "rebalance_timeout_ms": 10000, "member_id": "",
                                           "group_instance_id": None, "protocol_type": "consumer",
                                           "protocols": [{"name": "range", "metadata": b""}], "reason": None})
    assert r["error_code"] == ErrorCode.GROUP_AUTHORIZATION_FAILED
    r = raw.request(ApiKey.OFFSET_COMMIT, 8, {"group_id": "other", "generation_id_or_member_epoch": -1,
                                              "member_id": "", "group_instance_id": None, "topics": [
                                                  {"name": "events", "partitions": [
                                                      {"partition_index": 0, "committed_offset": 0,
                                                       "committed_leader_epoch": -1, "committed_metadata": ""}]}]})
    assert r["topics"][0]["partitions"][0]["error_code"] == ErrorCode.GROUP_AUTHORIZATION_FAILED
    # ListGroups: bob sees only the groups he may describe; the admin sees them all
    admin_raw = certs.raw("admin", b.tls)
    admin_raw.request(ApiKey.OFFSET_COMMIT, 8, {"group_id": "admins", "generation_id_or_member_epoch": -1,
                                                "member_id": "", "group_instance_id": None, "topics": [
                                                    {"name": "events", "partitions": [
                                                        {"partition_index": 0, "committed_offset": 1,
                                                         "committed_leader_epoch": -1, "committed_metadata": ""}]}]})
    def groups(c):
        return sorted(g["group_id"] for g in c.request(ApiKey.LIST_GROUPS, 4, {"states_filter": []})["groups"])
    assert groups(raw) == ["bob-ok"]
    assert groups(admin_raw) == ["admins", "bob-ok"]
    r = raw.request(ApiKey.DESCRIBE_GROUPS, 5, {"groups": ["bob-ok", "admins"], "include_authorized_operations": True})
    ops = {g["group_id"]: (g["error_code"], g["authorized_operations"]) for g in r["groups"]}
    assert ops == {"bob-ok": (0, (1 << 3) | (1 << 8)), "admins": (ErrorCode.GROUP_AUTHORIZATION_FAILED, -2147483648)}
    # Metadata and DescribeCluster: Kafka's bit sets
    r = raw.request(ApiKey.METADATA, 10, {"topics": [{"name": "events", "topic_id": None}],
                                          "allow_auto_topic_creation": False,
                                          "include_cluster_authorized_operations": True,
                                          "include_topic_authorized_operations": True})
    assert r["topics"][0]["topic_authorized_operations"] == (1 << 3) | (1 << 8)   # READ, DESCRIBE
    assert r["cluster_authorized_operations"] == 0
    r = admin_raw.request(ApiKey.DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": True})
    assert r["cluster_authorized_operations"] == sum(1 << o for o in (5, 7, 8, 9, 10, 11, 12))


def test_acls_survive_a_restart(tmp_path, certs):
    b = start_broker(tmp_path, certs)
    try:
        create_topics(certs, b, "kept")
        create(confluent_admin(certs, "admin", b),
               binding(ResourceType.TOPIC, "kept", ALICE, AclOperation.DESCRIBE))
    finally:
        b.stop()
    b = start_broker(tmp_path, certs, plain=b.plain_addr, tls=b.tls_addr)
    try:
        admin = confluent_admin(certs, "admin", b)
        f = admin.describe_acls(AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                                 AclOperation.ANY, AclPermissionType.ANY), request_timeout=30)
        got = f.result(30)
        assert [(x.name, x.principal, x.operation) for x in got] == [("kept", ALICE, AclOperation.DESCRIBE)]
        assert sorted(confluent_admin(certs, "alice", b).list_topics(timeout=30).topics) == ["kept"]
        # confluent-kafka's delete_acls
        [f] = admin.delete_acls([AclBindingFilter(ResourceType.TOPIC, "kept", ResourcePatternType.LITERAL, None,
                                                  None, AclOperation.ANY, AclPermissionType.ANY)],
                                request_timeout=30).values()
        assert len(f.result(30)) == 1
        assert sorted(confluent_admin(certs, "alice", b).list_topics(timeout=30).topics) == []
    finally:
        b.stop()


def test_without_an_authorizer_acl_apis_are_disabled_and_operations_all_allowed(broker):
    raw = RawClient(broker.bootstrap)
    r = raw.request(ApiKey.DESCRIBE_ACLS, 1, {"resource_type_filter": 1, "resource_name_filter": None,
                                              "pattern_type_filter": 1, "principal_filter": None, "host_filter": None,
                                              "operation": 1, "permission_type": 1})
    assert r["error_code"] == ErrorCode.SECURITY_DISABLED
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([__import__("kafka.admin", fromlist=["NewTopic"]).NewTopic("open", 1, 1)])
    admin.close()
    r = raw.request(ApiKey.METADATA, 12, {"topics": [{"name": "open", "topic_id": None}],
                                          "allow_auto_topic_creation": False,
                                          "include_topic_authorized_operations": True})
    assert r["topics"][0]["topic_authorized_operations"] == sum(1 << o for o in (3, 4, 5, 6, 7, 8, 10, 11))
    r = raw.request(ApiKey.METADATA, 12, {"topics": [{"name": "open", "topic_id": None}],
                                          "allow_auto_topic_creation": False,
                                          "include_topic_authorized_operations": False})
    assert r["topics"][0]["topic_authorized_operations"] == -2147483648


# ------------------------------------------------------------------ Java AdminClient
JAVA_SOURCE = ROOT / "tests" / "java" / "AclAdmin.java"


@pytest.fixture(scope="session", params=KAFKA_VERSIONS, ids=lambda v: f"kafka-clients-{v}")
def acl_admin_java(request, tmp_path_factory):
    return compile_java(JAVA_SOURCE, request.param, tmp_path_factory)[1]


def test_java_admin_client_manages_acls(acl_admin_java, certs, acl_broker, tmp_path):
    b = acl_broker
    crt, key = certs.users["admin"]
    # The Java client's PEM keystore takes the key (PKCS#8) and certificate chain in one file.
    from cryptography.hazmat.primitives import serialization
    pkcs8 = serialization.load_pem_private_key(key.read_bytes(), None).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    keystore = tmp_path / "admin-keystore.pem"
    keystore.write_bytes(pkcs8 + crt.read_bytes())
    props = ["security.protocol=SSL", "ssl.truststore.type=PEM", f"ssl.truststore.location={certs.ca_pem}",
             "ssl.keystore.type=PEM", f"ssl.keystore.location={keystore}"]

    def run(*args):
        prop_args = [a for x in props for a in ("--prop", x)]
        p = subprocess.run(["java", "-cp", acl_admin_java, "AclAdmin", b.tls, *args, *prop_args],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr[-3000:]
        return sorted(p.stdout.splitlines())
    assert run("create", "TOPIC", "java-", "PREFIXED", ALICE, "WRITE", "ALLOW") == []
    assert run("create", "GROUP", "jg", "LITERAL", BOB, "READ", "DENY") == []
    assert run("describe") == [f"GROUP jg LITERAL {BOB} * READ DENY", f"TOPIC java- PREFIXED {ALICE} * WRITE ALLOW"]
    assert run("delete", "GROUP") == [f"GROUP jg LITERAL {BOB} * READ DENY"]
    assert run("describe") == [f"TOPIC java- PREFIXED {ALICE} * WRITE ALLOW"]
    # enforced: alice may write java-x but not other-x
    create_topics(certs, b, "java-x", "other-x")
    alice = certs.confluent("alice", b.tls)
    assert produce_error(alice, "java-x") is None
    assert produce_error(alice, "other-x").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


# ------------------------------------------------------------------ canopy acls (CLI)
def _cli(*args):
    from .conftest import CANOPY
    return subprocess.run([str(CANOPY), "acls", *args], capture_output=True, text=True, timeout=60)


def test_canopy_acls_cli(broker_factory, acl_broker):
    b = broker_factory("cli-data", extra_args=["--authorizer", "standard", "--super-users", "User:ANONYMOUS"])
    boot = ["--bootstrap", b.bootstrap]
    r = _cli("add", *boot, "--topic", "orders-", "--pattern-type", "prefixed", "--principal", ALICE,
             "--operation", "write", "--operation", "describe")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"TOPIC orders- PREFIXED {ALICE} * WRITE ALLOW",
                                     f"TOPIC orders- PREFIXED {ALICE} * DESCRIBE ALLOW"]
    assert _cli("add", *boot, "--group", "g", "--principal", BOB, "--operation", "read", "--deny").returncode == 0
    r = _cli("list", *boot, "--topic", "orders-eu", "--pattern-type", "match")
    assert r.stdout.splitlines() == [f"TOPIC orders- PREFIXED {ALICE} * DESCRIBE ALLOW",
                                     f"TOPIC orders- PREFIXED {ALICE} * WRITE ALLOW"], r.stderr
    r = _cli("remove", *boot, "--operation", "write")
    assert r.stdout.splitlines() == [f"TOPIC orders- PREFIXED {ALICE} * WRITE ALLOW"], r.stderr
    assert _cli("list", *boot).stdout.splitlines() == [f"GROUP g LITERAL {BOB} * READ DENY",
                                                       f"TOPIC orders- PREFIXED {ALICE} * DESCRIBE ALLOW"]
    # bad input and refusals: one line, exit 2
    r = _cli("add", *boot, "--topic", "x", "--principal", "alice", "--operation", "read")
    assert (r.returncode, r.stderr.count("\n")) == (2, 1) and "INVALID_REQUEST" in r.stderr, r.stderr
    r = _cli("list", "--bootstrap", acl_broker.plain)   # User:ANONYMOUS is no super user there
    assert (r.returncode, r.stderr.count("\n")) == (2, 1) and "CLUSTER_AUTHORIZATION_FAILED" in r.stderr, r.stderr
    r = _cli("list", "--bootstrap", "127.0.0.1:notaport")
    assert (r.returncode, r.stderr.count("\n")) == (2, 1), r.stderr
