"""Brokers that talk SASL_SSL to each other: three `canopy serve` processes on 127.0.0.11/.12/.13
with a real three-member etcd, whose inter-broker listener INTERNAL is SASL_SSL (a trustme CA,
one broker certificate for the three addresses, SCRAM-SHA-512 as user `broker`). Replication
(followers fetching from their upstream in a chain 1 -> 2 -> 3 tree), forwarding to the
controller and acks=all all cross that listener; clients use a PLAINTEXT CLIENT listener.
"""
from __future__ import annotations

import subprocess

import trustme
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer

from tests.e2e.conftest import CANOPY, free_port
from tests.e2e.test_listeners import ListenersBroker

from .conftest import cluster_metadata, partition_metadata, wait_for, wait_formed
from .test_replication import fetch_all

HOSTS = {1: "127.0.0.11", 2: "127.0.0.12", 3: "127.0.0.13"}
BROKER_PASSWORD = "inter-broker secret"
N = 3000


def _users_add(store: str, name: str, password: str, *extra: str) -> None:
    r = subprocess.run([str(CANOPY), "users", "add", name, "--metadata-store", store, *extra], input=password + "\n",
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def _start(tmp_path, etcd_cluster, ca_pem, server_pem, password=BROKER_PASSWORD, nodes=HOSTS, env=None, ports=None):
    internal_port, client_port = ports or (free_port(HOSTS[1]), free_port(HOSTS[1]))
    brokers = {}
    for n, h in nodes.items():
        d = tmp_path / f"node{n}"
        d.mkdir()
        brokers[n] = ListenersBroker(d, [
            "--node-id", str(n), "--listeners", f"INTERNAL://{h}:{internal_port},CLIENT://{h}:{client_port}",
            "--listener-security-protocol-map", "INTERNAL:SASL_SSL,CLIENT:PLAINTEXT",
            "--inter-broker-listener-name", "INTERNAL", "--log-level", "debug"],
            [(h, internal_port), (h, client_port)],
            env={"CANOPY_METADATA_STORE": etcd_cluster.endpoints, "CANOPY_FANOUT": "1",
                 "CANOPY_MIN_INSYNC_REPLICAS": "2", "CANOPY_SSL_KEYSTORE_LOCATION": str(server_pem),
                 "CANOPY_SSL_TRUSTSTORE_LOCATION": str(ca_pem),
                 "CANOPY_SASL_MECHANISM_INTER_BROKER_PROTOCOL": "SCRAM-SHA-512",
                 "CANOPY_INTER_BROKER_SASL_USERNAME": "broker", "CANOPY_INTER_BROKER_SASL_PASSWORD": password,
                 **(env or {})})
        brokers[n].client = f"{h}:{client_port}"
    return brokers


def test_replication_tree_over_sasl_ssl(tmp_path, etcd_cluster):
    ca = trustme.CA()
    ca_pem, server_pem = tmp_path / "ca.pem", tmp_path / "server.pem"
    ca.cert_pem.write_to_path(str(ca_pem))
    ca.issue_cert(*HOSTS.values()).private_key_and_cert_chain_pem.write_to_path(str(server_pem))
    # The brokers' own user exists before any broker starts (written straight to etcd).
    _users_add(etcd_cluster.endpoints, "broker", BROKER_PASSWORD, "--mechanism", "SCRAM-SHA-512")
    brokers = _start(tmp_path, etcd_cluster, ca_pem, server_pem)
    try:
        wait_formed([b.client for b in brokers.values()], 3)
        controller = cluster_metadata(brokers[1].client, [])["controller_id"]
        other = next(n for n in brokers if n != controller)
        # CreateTopics on a broker that is not the controller: forwarded over SASL_SSL.
        admin = AdminClient({"bootstrap.servers": brokers[other].client})
        admin.create_topics([NewTopic("secure", 1, -1)])["secure"].result(30)
        wait_for(lambda: all(len(partition_metadata(b.client, "secure")) == 1 for b in brokers.values()),
                 "secure on every broker")
        # fanout 1: the ISR is the leader and its one direct child (docs/cluster.md)
        wait_for(lambda: len(partition_metadata(brokers[1].client, "secure")[0][3]) == 2, "full ISR")
        leader, _, replicas, _ = partition_metadata(brokers[1].client, "secure")[0]
        assert len(replicas) == 3

        producer = KafkaProducer(bootstrap_servers=brokers[leader].client, acks="all", linger_ms=5)
        futures = [producer.send("secure", value=b"r%d" % i) for i in range(N)]
        producer.flush(60)
        assert [f.get(30).offset for f in futures] == list(range(N))
        producer.close()

        # Every replica holds every acknowledged record: the ISR (min.insync.replicas=2) at
        # once, the grandchild once it fetched them from its upstream, a follower.
        for n, b in brokers.items():
            got = fetch_all(b.client, "secure", N)
            assert [v for _, v in got][:N] == [b"r%d" % i for i in range(N)], f"node {n}"

        # The followers logged in to their upstream as User:broker on the SASL_SSL listener.
        followers = [n for n in replicas if n != leader]
        upstreams = [replicas[replicas.index(n) - 1] for n in followers]   # fanout 1: a chain
        for up in upstreams:
            log = brokers[up].log_path.read_text(errors="replace")
            assert "on listener INTERNAL: SASL SCRAM-SHA-512 authenticated User:broker" in log, log[-3000:]

        # A user added through one broker (AlterUserScramCredentials -> etcd) logs in on
        # every broker at once: each applies /canopy/users/<name> from its etcd watch.
        r = subprocess.run([str(CANOPY), "users", "add", "carol", "--bootstrap", brokers[1].client],
                           input="carol-pw\n", capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        for n, b in brokers.items():
            internal = b.client.rsplit(":", 1)[0] + ":" + str(b.addresses[0][1])
            p = KafkaProducer(bootstrap_servers=internal, security_protocol="SASL_SSL", ssl_cafile=str(ca_pem),
                              sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="carol",
                              sasl_plain_password="carol-pw", acks="all")
            assert p.send("secure", b"carol-%d" % n).get(30).offset >= N
            p.close()
        # `canopy cluster describe` logs in to the SASL_SSL listener too (and dials the
        # controller over it for its fan-out).
        pw = tmp_path / "broker.pw"
        pw.write_text(BROKER_PASSWORD + "\n")
        internal1 = "%s:%d" % brokers[1].addresses[0]
        r = subprocess.run([str(CANOPY), "cluster", "describe", "--bootstrap", internal1, "--security-protocol",
                            "SASL_SSL", "--sasl-username", "broker", "--sasl-password-file", str(pw),
                            "--ssl-cafile", str(ca_pem)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        for n, b in brokers.items():
            assert "  %d  %s:%d  rack=-" % (n, *b.addresses[0]) in r.stdout, r.stdout
        assert "topic secure  partitions 1  fanout 1" in r.stdout, r.stdout
        r = subprocess.run([str(CANOPY), "cluster", "describe", "--bootstrap", internal1], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr   # plaintext on SASL_SSL
        for b in brokers.values():
            assert b.proc.poll() is None
            assert "Traceback" not in b.log_path.read_text(errors="replace")
    finally:
        for b in brokers.values():
            b.stop()


def test_a_broker_with_the_wrong_inter_broker_password_is_refused_and_logged(tmp_path, etcd_cluster):
    """Broker 3 logs in with a wrong password: its upstreams refuse it (one line each), it
    never receives a record, and acks=all carries on once it has left the ISRs."""
    ca = trustme.CA()
    ca_pem, server_pem = tmp_path / "ca.pem", tmp_path / "server.pem"
    ca.cert_pem.write_to_path(str(ca_pem))
    ca.issue_cert(*HOSTS.values()).private_key_and_cert_chain_pem.write_to_path(str(server_pem))
    _users_add(etcd_cluster.endpoints, "broker", BROKER_PASSWORD, "--mechanism", "SCRAM-SHA-512")
    good = _start(tmp_path, etcd_cluster, ca_pem, server_pem, nodes={1: HOSTS[1], 2: HOSTS[2]},
                  env={"CANOPY_FANOUT": "2", "CANOPY_REPLICA_LAG_TIME_MAX_MS": "3000"})
    (tmp_path / "bad").mkdir()
    bad = _start(tmp_path / "bad", etcd_cluster, ca_pem, server_pem, password="wrong", nodes={3: HOSTS[3]},
                 env={"CANOPY_FANOUT": "2", "CANOPY_REPLICA_LAG_TIME_MAX_MS": "3000"})
    everyone = {**good, **bad}
    try:
        wait_for(lambda: all(len(cluster_metadata(b.client, [])["brokers"]) == 3 for b in everyone.values()),
                 "three brokers registered")
        admin = AdminClient({"bootstrap.servers": good[1].client})
        admin.create_topics([NewTopic("guarded", 3, -1)])["guarded"].result(30)
        wait_for(lambda: len(partition_metadata(good[1].client, "guarded")) == 3, "guarded created")
        parts = partition_metadata(good[1].client, "guarded")
        refusal = "SASL_AUTHENTICATION_FAILED (SCRAM-SHA-512, user 'broker'): wrong password"
        # Some partition has broker 3 as a direct child of a good leader: that leader refuses it.
        upstreams = {leader for leader, _, replicas, _ in parts.values() if leader in good and 3 in replicas}
        assert upstreams, parts
        for up in upstreams:
            wait_for(lambda: refusal in good[up].log_path.read_text(errors="replace"), "the refusal logged")
        p = next(i for i, (leader, _, replicas, _) in parts.items() if leader in good and 3 in replicas)
        leader = parts[p][0]
        producer = KafkaProducer(bootstrap_servers=good[leader].client, acks="all", request_timeout_ms=60000)
        assert producer.send("guarded", b"x", partition=p).get(90).offset == 0
        producer.close()
        for n, b in good.items():
            assert fetch_all(b.client, "guarded", 1, partition=p) == [(0, b"x")], n
        assert bad[3].proc.poll() is None and good[leader].proc.poll() is None
    finally:
        for b in everyone.values():
            b.stop()
