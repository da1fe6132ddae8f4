"""ACLs in a cluster: two `canopy serve` processes with `--authorizer standard` on a real
three-member etcd. ACLs live in etcd under /canopy/acls/, so one created through either
broker applies on both, and a restarted broker still has them.

Clients connect on each broker's SSL listener with trustme client certificates (principals
`User:<subject DN>`); the brokers talk PLAINTEXT to each other, so their principal is
User:ANONYMOUS, which is in super.users (replication's Fetch needs CLUSTER_ACTION, forwarded
CreateTopics needs CREATE). acks=all with min.insync.replicas=2 shows that replication still
runs with the authorizer on.
"""
from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import (AclBindingFilter, AclOperation, AclPermissionType, NewTopic, ResourcePatternType,
                                   ResourceType)

from tests.e2e.conftest import free_port
from tests.e2e.test_acl import ADMIN, ALICE, AclCerts, binding, confluent_admin, create, produce_error
from tests.e2e.test_listeners import ListenersBroker

from .conftest import cluster_metadata, wait_for, wait_formed

HOSTS = {1: "127.0.0.31", 2: "127.0.0.32"}
EVERYTHING = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                              AclPermissionType.ANY)


class Node:
    def __init__(self, tmp_path, n: int, certs: AclCerts, etcd, port: int, tls_port: int):
        self.n, self.dir = n, tmp_path / f"node{n}"
        self.dir.mkdir(exist_ok=True)
        h = HOSTS[n]
        self.plain, self.tls = f"{h}:{port}", f"{h}:{tls_port}"
        self.args = ["--node-id", str(n), "--listeners", f"PLAINTEXT://{h}:{port},SSL://{h}:{tls_port}",
                     "--inter-broker-listener-name", "PLAINTEXT",
                     "--ssl-keystore-location", str(certs.server), "--ssl-truststore-location", str(certs.ca_pem),
                     "--ssl-client-auth", "required", "--authorizer", "standard",
                     "--super-users", f"{ADMIN};User:ANONYMOUS", "--min-insync-replicas", "2"]
        self.env = {"CANOPY_METADATA_STORE": etcd.endpoints}
        self.addresses = [(h, port), (h, tls_port)]
        self.proc = None

    def start(self):
        self.proc = ListenersBroker(self.dir, self.args, self.addresses, env=self.env)
        return self

    def stop(self):
        if self.proc is not None:
            self.proc.stop()


@pytest.fixture
def certs(tmp_path):
    d = tmp_path / "certs"
    d.mkdir()
    return AclCerts(d, hosts=tuple(HOSTS.values()))


@pytest.fixture
def acl_cluster(tmp_path, etcd_cluster, certs):
    port, tls_port = free_port(HOSTS[1]), free_port(HOSTS[1])
    nodes = {n: Node(tmp_path, n, certs, etcd_cluster, port, tls_port) for n in HOSTS}
    try:
        for node in nodes.values():
            node.start()
        wait_formed([x.plain for x in nodes.values()], 2)
        yield nodes
    finally:
        for node in nodes.values():
            node.stop()


class _Via:
    """confluent_admin() wants an object with a .tls bootstrap."""
    def __init__(self, tls):
        self.tls = tls


def acls_on(certs, node) -> set:
    admin = confluent_admin(certs, "admin", _Via(node.tls))   # (kept alive until the answer is in)
    got = admin.describe_acls(EVERYTHING, request_timeout=30).result(30)
    return {(b.restype, b.name, b.principal, b.operation, b.permission_type) for b in got}


def test_acls_are_shared_by_the_cluster_and_survive_a_restart(certs, acl_cluster):
    n1, n2 = acl_cluster[1], acl_cluster[2]
    admin1 = confluent_admin(certs, "admin", _Via(n1.tls))
    admin1.create_topics([NewTopic("shared-t", 1, 2), NewTopic("other-t", 1, 2)])["shared-t"].result(30)
    wait_for(lambda: all("other-t" in cluster_metadata(x.plain, ["other-t"])["topics"][0]["name"]
                         and not cluster_metadata(x.plain, ["shared-t", "other-t"])["topics"][0]["error_code"]
                         for x in acl_cluster.values()), "topics on both brokers")
    # created through broker 1 ...
    create(admin1, binding(ResourceType.TOPIC, "shared-", ALICE, AclOperation.WRITE,
                           pattern=ResourcePatternType.PREFIXED))
    want = {(ResourceType.TOPIC, "shared-", ALICE, AclOperation.WRITE, AclPermissionType.ALLOW)}
    assert acls_on(certs, n1) == want
    # ... applies on broker 2 as soon as its etcd watch delivers it
    wait_for(lambda: acls_on(certs, n2) == want, "the ACL on broker 2", timeout=10)
    for node in (n1, n2):
        alice = {**certs.confluent("alice", node.tls), "acks": "all", "enable.idempotence": True}
        assert produce_error(alice, "shared-t") is None   # acks=all, min.insync 2: replicated
        assert produce_error(alice, "other-t").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # deleted through broker 2: refused on broker 1 too
    admin2 = confluent_admin(certs, "admin", _Via(n2.tls))
    [f] = admin2.delete_acls([EVERYTHING], request_timeout=30).values()
    assert len(f.result(30)) == 1
    wait_for(lambda: acls_on(certs, n1) == set(), "the deletion on broker 1", timeout=10)
    assert produce_error(certs.confluent("alice", n1.tls), "shared-t").code() == \
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    # a restarted broker reads them back from etcd
    create(admin1, binding(ResourceType.GROUP, "g", ALICE, AclOperation.READ))
    n2.stop()
    time.sleep(0.5)
    n2.start()
    wait_for(lambda: len(cluster_metadata(n2.plain, [])["brokers"]) == 2, "broker 2 back")
    assert acls_on(certs, n2) == {(ResourceType.GROUP, "g", ALICE, AclOperation.READ, AclPermissionType.ALLOW)}
