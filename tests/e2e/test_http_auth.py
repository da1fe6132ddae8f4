"""The HTTP port (issue 13) is no more open than the Kafka listeners when they use SASL
(issue 11): HTTP Basic credentials of a SCRAM user, checked like SASL PLAIN, and the
authorizer's ACLs (broker/http/auth.py). Real `canopy serve`, real kafka-python clients."""
from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import ACL, ACLOperation, ACLPermissionType, NewTopic, ResourcePattern
from kafka.admin import ResourceType as KPResourceType

from .conftest import free_port
from .test_listeners import ListenersBroker
from .test_sasl import add_user

pytestmark = pytest.mark.timeout(180)


def get(url: str, user: str | None = None, password: str = "") -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url)
    if user is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_http_port_of_a_sasl_broker_asks_for_credentials_and_applies_acls(tmp_path):
    kafka_addr, http_port = ("127.0.0.1", free_port()), free_port()
    for name, password in (("admin", "admin-pw"), ("alice", "alice-pw")):
        r = add_user(["--data-dir", str(tmp_path / "data")], name, password, "--iterations", "4096")
        assert r.returncode == 0, r.stderr
    b = ListenersBroker(tmp_path, [
        "--listeners", "SASL_PLAINTEXT://%s:%d" % kafka_addr, "--http-listen", f"127.0.0.1:{http_port}",
        "--authorizer", "standard", "--super-users", "User:admin"], [kafka_addr, ("127.0.0.1", http_port)])
    base = f"http://127.0.0.1:{http_port}"
    try:
        conf = {"bootstrap_servers": "%s:%d" % kafka_addr, "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": "admin",
                "sasl_plain_password": "admin-pw"}
        admin = KafkaAdminClient(**conf)
        admin.create_topics([NewTopic("t", 1, 1)])
        producer = KafkaProducer(**conf)
        producer.send("t", b"hello", partition=0).get(timeout=30)
        producer.close()

        # No credentials, or wrong ones: 401 with a Basic challenge and a JSON body.
        for user, password in ((None, ""), ("alice", "wrong"), ("nobody", "x")):
            status, headers, body = get(f"{base}/metrics", user, password)
            assert status == 401, (user, status, body)
            assert headers.get("www-authenticate", headers.get("WWW-Authenticate")) == 'Basic realm="canopy"'
            assert json.loads(body)["error"] == "SASL_AUTHENTICATION_FAILED"
        # The super user sees everything.
        status, _, body = get(f"{base}/metrics", "admin", "admin-pw")
        assert status == 200 and b"kafka_server_replicamanager_partitioncount" in body
        status, _, body = get(f"{base}/topics/t/partitions/0/records?from=0&max_records=1", "admin", "admin-pw")
        assert status == 200 and json.loads(body.splitlines()[0])["offset"] == 0
        # alice has no ACLs: the cluster pages and the tail are refused with Kafka's error names.
        status, _, body = get(f"{base}/status.json", "alice", "alice-pw")
        assert (status, json.loads(body)["error"]) == (403, "CLUSTER_AUTHORIZATION_FAILED")
        status, _, body = get(f"{base}/topics/t/partitions/0/records?from=0&max_records=1", "alice", "alice-pw")
        assert (status, json.loads(body)["error"]) == (403, "TOPIC_AUTHORIZATION_FAILED")
        # READ on the topic lets her tail it (and only it).
        admin.create_acls([ACL("User:alice", "*", ACLOperation.READ, ACLPermissionType.ALLOW,
                               ResourcePattern(KPResourceType.TOPIC, "t"))])
        admin.close()
        status, _, body = get(f"{base}/topics/t/partitions/0/records?from=0&max_records=1", "alice", "alice-pw")
        assert status == 200, body
        assert json.loads(body.splitlines()[0])["value"] == "hello"
        assert "Traceback" not in b.log_path.read_text()
    finally:
        b.stop()
