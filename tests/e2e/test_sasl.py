"""SASL listeners (SASL_PLAINTEXT, SASL_SSL) with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512:
real clients — kafka-python, confluent-kafka, kcat, the Java client 3.9.1/4.3.0 and the
Spark connector's paths through it — logging in with users made by `canopy users`, and
refusals (wrong password, unknown user, unknown mechanism, a client that skips
authentication, handshake v0's closing failure), each a closed connection and one log line
while other clients keep working.
"""
from __future__ import annotations

import struct
import subprocess
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer

from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from .conftest import free_port, require_tool
from .rawclient import RawClient
from .test_cli import _one_line_error, _run
from .test_java_client import java  # noqa: F401  (the compiled SparkLikeClient, per kafka-clients version)
from .test_listeners import ListenersBroker
from .test_tls import Certs, log_lines, wait_log

MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
USER, PASSWORD = "alice", "alice s3cret, with = and spaces"
REFUSED = "WARNING canopy.security: closing connection"


def add_user(target: list[str], name: str, password: str, *extra: str):
    r = subprocess.run([*_canopy(), "users", "add", name, *target, *extra], input=password + "\n",
                       capture_output=True, text=True, timeout=60)
    return r


def _canopy() -> list[str]:
    from .test_cli import CANOPY
    return [str(CANOPY)]


class SaslBroker:
    def __init__(self, d, certs: Certs, extra=()):
        self.plain = "127.0.0.1:%d" % free_port()
        self.sasl = "127.0.0.1:%d" % free_port()
        self.sasl_ssl = "127.0.0.1:%d" % free_port()
        # The first user is made before the broker starts, straight in its data directory.
        r = add_user(["--data-dir", str(d / "data")], USER, PASSWORD, "--iterations", "4096")
        assert r.returncode == 0, r.stderr
        addrs = [tuple((a.split(":")[0], int(a.split(":")[1]))) for a in (self.plain, self.sasl, self.sasl_ssl)]
        self.b = ListenersBroker(d, [
            "--listeners", f"PLAINTEXT://{self.plain},SASL_PLAINTEXT://{self.sasl},SASL_SSL://{self.sasl_ssl}",
            "--ssl-keystore-location", str(certs.server), "--log-level", "debug", *extra], addrs)
        self.log_path = self.b.log_path
        self.proc = self.b.proc

    def stop(self):
        self.b.stop()


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("sasl-certs")
    return Certs(d)


@pytest.fixture(scope="module")
def sb(tmp_path_factory, certs):
    b = SaslBroker(tmp_path_factory.mktemp("sasl-broker"), certs)
    try:
        yield b
    finally:
        b.stop()


def kp_conf(sb, certs, mech, protocol="SASL_PLAINTEXT", user=USER, password=PASSWORD) -> dict:
    conf = {"bootstrap_servers": sb.sasl if protocol == "SASL_PLAINTEXT" else sb.sasl_ssl,
            "security_protocol": protocol, "sasl_mechanism": mech,
            "sasl_plain_username": user, "sasl_plain_password": password}
    if protocol == "SASL_SSL":
        conf["ssl_cafile"] = str(certs.ca_pem)
    return conf


@pytest.mark.parametrize("protocol, mech", [("SASL_PLAINTEXT", m) for m in MECHANISMS] + [("SASL_SSL", "SCRAM-SHA-512"),
                                                                                          ("SASL_SSL", "PLAIN")])
def test_kafka_python(sb, certs, protocol, mech):
    topic = f"kp-{mech}-{protocol}".lower()
    conf = kp_conf(sb, certs, mech, protocol)
    producer = KafkaProducer(acks="all", **conf)
    futures = [producer.send(topic, key=b"k%d" % i, value=b"v%d" % i) for i in range(500)]
    producer.flush(60)
    assert [f.get(30).offset for f in futures] == list(range(500))
    producer.close()
    consumer = KafkaConsumer(topic, group_id=f"g-{topic}", auto_offset_reset="earliest",
                             consumer_timeout_ms=15000, **conf)
    got = [(m.offset, m.value) for m in consumer]
    consumer.close()
    assert got == [(i, b"v%d" % i) for i in range(500)]
    assert wait_log(sb, f"SASL {mech} authenticated User:{USER}")


def ck_conf(sb, certs, mech, protocol="SASL_PLAINTEXT") -> dict:
    conf = {"bootstrap.servers": sb.sasl if protocol == "SASL_PLAINTEXT" else sb.sasl_ssl,
            "security.protocol": protocol.lower(), "sasl.mechanisms": mech,
            "sasl.username": USER, "sasl.password": PASSWORD}
    if protocol == "SASL_SSL":
        conf["ssl.ca.location"] = str(certs.ca_pem)
    return conf


@pytest.mark.parametrize("protocol, mech", [("SASL_PLAINTEXT", m) for m in MECHANISMS] + [("SASL_SSL", "SCRAM-SHA-256")])
def test_confluent_kafka(sb, certs, protocol, mech):
    topic = f"ck-{mech}-{protocol}".lower()
    conf = ck_conf(sb, certs, mech, protocol)
    p = Producer({**conf, "enable.idempotence": True})
    for i in range(2000):
        p.produce(topic, value=b"c%d" % i)
    assert p.flush(60) == 0
    c = Consumer({**conf, "group.id": topic, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 2000 and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None:
            assert m.error() is None, m.error()
            got.append(m.value())
    c.close()
    assert got == [b"c%d" % i for i in range(2000)]


@pytest.mark.parametrize("protocol, mech", [("SASL_PLAINTEXT", m) for m in MECHANISMS] + [("SASL_SSL", "SCRAM-SHA-512")])
def test_kcat(sb, certs, protocol, mech):
    kcat = require_tool("kcat", "Debian package kcat")
    topic = f"kcat-{mech}-{protocol}".lower()
    addr = sb.sasl if protocol == "SASL_PLAINTEXT" else sb.sasl_ssl
    args = ["-X", f"security.protocol={protocol.lower()}", "-X", f"sasl.mechanisms={mech}",
            "-X", f"sasl.username={USER}", "-X", f"sasl.password={PASSWORD}"]
    if protocol == "SASL_SSL":
        args += ["-X", f"ssl.ca.location={certs.ca_pem}"]
    lines = "".join(f"line {i}\n" for i in range(500))
    r = subprocess.run([kcat, "-b", addr, *args, "-P", "-t", topic], input=lines, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([kcat, "-b", addr, *args, "-C", "-t", topic, "-o", "beginning", "-e", "-q"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == lines


def java_props(sb, certs, mech, protocol) -> list:
    module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if mech == "PLAIN"
              else "org.apache.kafka.common.security.scram.ScramLoginModule")
    jaas = f'{module} required username="{USER}" password="{PASSWORD}";'
    props = ["--prop", f"security.protocol={protocol}", "--prop", f"sasl.mechanism={mech}",
             "--prop", f"sasl.jaas.config={jaas}"]
    if protocol == "SASL_SSL":
        props += ["--prop", "ssl.truststore.type=PEM", "--prop", f"ssl.truststore.location={certs.ca_pem}"]
    return props


@pytest.mark.parametrize("protocol, mech", [("SASL_PLAINTEXT", m) for m in MECHANISMS] + [("SASL_SSL", "SCRAM-SHA-512")])
def test_java_client(java, sb, certs, protocol, mech):  # noqa: F811
    addr = sb.sasl if protocol == "SASL_PLAINTEXT" else sb.sasl_ssl
    topic = f"java-{mech}-{protocol}-{java.version}".lower()
    props = java_props(sb, certs, mech, protocol)
    res = java.run("produce", addr, topic, 1000, "--partition", 0, *props)
    assert res.kv_lines()[0] == {"acked": "1000"}, res.stdout
    res = java.run("consume-range", addr, topic, 0, 0, 1000, *props)
    last = res.kv_lines()[-1]
    assert (last["count"], last["first"], last["last"]) == ("1000", "0", "999"), res.stdout


def test_spark_source_paths_over_sasl_ssl(java, sb, certs):  # noqa: F811
    """Spark passes `kafka.security.protocol=SASL_SSL` (and the other kafka.* options) to
    every client it makes: the driver's AdminClient (topic listing, ListOffsets) and the
    executors' consumers (assign, seek, poll)."""
    props = java_props(sb, certs, "SCRAM-SHA-512", "SASL_SSL")
    run = uuid.uuid4().hex[:8]
    topic = f"spark-sasl-{run}"
    res = java.run("create-topic", sb.sasl_ssl, topic, 2, *props)
    res = java.run("produce", sb.sasl_ssl, topic, 600, "--partition", 0, *props)
    assert res.kv_lines()[0] == {"acked": "600"}, res.stdout
    res = java.run("list-pattern", sb.sasl_ssl, f"spark-sasl-{run}.*", *props)
    assert topic in res.stdout, res.stdout
    assert java.run("offset-range", sb.sasl_ssl, topic, 0, *props).kv_lines()[-1] == {"earliest": "0",
                                                                                     "latest": "600"}
    res = java.run("spark-get", sb.sasl_ssl, topic, 0, 100, 400, *props)
    last = res.kv_lines()[-1]
    assert last["count"] == "300", res.stdout


# ------------------------------------------------------------------------------ refusals

def _authenticate(c: RawClient, mech: str, token: bytes) -> dict:
    hs = c.request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": mech})
    assert hs["error_code"] == 0, hs
    return c.request(ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": token})


def _still_serving(sb, certs, n: int):
    """Another client (SCRAM on SASL_PLAINTEXT) produces while the refusals happen."""
    producer = KafkaProducer(**kp_conf(sb, certs, "SCRAM-SHA-256"))
    assert producer.send(f"after-refusals-{n}", b"x").get(30).offset == 0
    producer.close()


def test_refusals_close_the_connection_log_one_line_and_others_keep_working(tmp_path, certs):
    sb = SaslBroker(tmp_path, certs)
    try:
        # Wrong password (PLAIN): SASL_AUTHENTICATION_FAILED with Kafka's message, then closed.
        c = RawClient(sb.sasl)
        r = _authenticate(c, "PLAIN", f"\0{USER}\0wrong".encode())
        assert r["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert "invalid credentials with SASL mechanism PLAIN" in r["error_message"]
        assert c.closed_by_peer()
        c.close()
        assert len(wait_log(sb, REFUSED, 1)) == 1
        assert "wrong password" in log_lines(sb, REFUSED)[0]

        # Unknown user (SCRAM): refused at the client-first message, same answer.
        c = RawClient(sb.sasl)
        r = _authenticate(c, "SCRAM-SHA-256", b"n,,n=mallory,r=abcdefghijklmnop")
        assert r["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert "SCRAM-SHA-256" in r["error_message"]
        assert c.closed_by_peer()
        c.close()
        assert "unknown user" in wait_log(sb, REFUSED, 2)[1]
        _still_serving(sb, certs, 1)

        # Wrong password with a real SCRAM client (kafka-python gives up on bootstrap).
        with pytest.raises(Exception):
            KafkaProducer(request_timeout_ms=5000, max_block_ms=5000,
                          **kp_conf(sb, certs, "SCRAM-SHA-512", password="nope"))
        assert any("SCRAM-SHA-512" in line and "wrong password" in line for line in wait_log(sb, REFUSED, 3))

        # Unknown mechanism: UNSUPPORTED_SASL_MECHANISM with the enabled list, then closed.
        before = len(log_lines(sb, REFUSED))
        c = RawClient(sb.sasl)
        hs = c.request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "GSSAPI"})
        assert hs == {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": MECHANISMS}
        assert c.closed_by_peer()
        c.close()
        assert "UNSUPPORTED_SASL_MECHANISM" in wait_log(sb, REFUSED, before + 1)[-1]

        # A client that skips authentication: Metadata first gets no answer, the connection closes.
        c = RawClient(sb.sasl)
        versions = c.request(ApiKey.API_VERSIONS, 3, {"client_software_name": "raw", "client_software_version": "1"})
        assert versions["error_code"] == 0   # ApiVersions is answered before authentication
        c.send_only(ApiKey.METADATA, 1, {"topics": None})
        assert c.closed_by_peer()
        c.close()
        assert "ILLEGAL_SASL_STATE: Metadata request before SASL authentication" in \
            wait_log(sb, REFUSED, before + 2)[-1]

        # SaslAuthenticate before SaslHandshake: ILLEGAL_SASL_STATE, closed.
        c = RawClient(sb.sasl)
        r = c.request(ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": b"\0a\0b"})
        assert r["error_code"] == ErrorCode.ILLEGAL_SASL_STATE
        assert c.closed_by_peer()
        c.close()

        # Handshake v0: raw tokens; a failure can only close the connection.
        c = RawClient(sb.sasl)
        assert c.request(ApiKey.SASL_HANDSHAKE, 0, {"mechanism": "PLAIN"})["error_code"] == 0
        tok = f"\0{USER}\0bad".encode()
        c.send_raw(struct.pack(">i", len(tok)) + tok)
        assert c.closed_by_peer()
        c.close()
        assert "handshake v0" in wait_log(sb, REFUSED, before + 4)[-1]
        _still_serving(sb, certs, 2)

        # Every refusal was one line; the broker is up and logged no traceback.
        assert len(log_lines(sb, REFUSED)) == before + 4
        assert sb.proc.poll() is None
        assert not log_lines(sb, "Traceback")
    finally:
        sb.stop()


def test_handshake_v0_raw_tokens_then_requests(sb):
    """The pre-KIP-152 exchange: after SaslHandshake v0 the PLAIN token is a bare frame and
    the answer an empty bare frame; then ordinary requests are served."""
    c = RawClient(sb.sasl)
    try:
        assert c.request(ApiKey.SASL_HANDSHAKE, 0, {"mechanism": "PLAIN"})["error_code"] == 0
        tok = f"\0{USER}\0{PASSWORD}".encode()
        c.send_raw(struct.pack(">i", len(tok)) + tok)
        assert c.recv_frame() == b""
        md = c.request(ApiKey.METADATA, 1, {"topics": None})
        assert md["brokers"][0]["port"] == int(sb.sasl.split(":")[1])
        # A second handshake after authentication is ILLEGAL_SASL_STATE (answered by the handler).
        assert c.request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})["error_code"] == ErrorCode.ILLEGAL_SASL_STATE
    finally:
        c.close()


def test_plaintext_listener_does_not_take_sasl(sb):
    c = RawClient(sb.plain)
    try:
        assert c.request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})["error_code"] == ErrorCode.ILLEGAL_SASL_STATE
    finally:
        c.close()


# ------------------------------------------------------------------------------ users

def test_users_cli_through_the_broker(sb, certs, tmp_path):
    """`canopy users` over the Kafka API (KIP-554): a user added through the broker logs in
    at once, with every mechanism; a deleted one cannot. Logged in itself over SASL_SSL."""
    pwfile = tmp_path / "admin-pw"
    pwfile.write_text(PASSWORD + "\n")
    over_sasl_ssl = ["--bootstrap", sb.sasl_ssl, "--security-protocol", "SASL_SSL", "--sasl-mechanism",
                     "SCRAM-SHA-256", "--sasl-username", USER, "--sasl-password-file", str(pwfile),
                     "--ssl-cafile", str(certs.ca_pem)]
    name = f"bob-{uuid.uuid4().hex[:6]}"
    r = add_user(over_sasl_ssl, name, "bobpw", "--mechanism", "SCRAM-SHA-512")
    assert r.returncode == 0, r.stderr
    r = _run(["users", "list", "--bootstrap", sb.plain])
    assert r.returncode == 0, r.stderr
    assert f"{name}: SCRAM-SHA-512 (iterations 8192)" in r.stdout.splitlines()
    assert f"{USER}: SCRAM-SHA-256 (iterations 4096), SCRAM-SHA-512 (iterations 4096)" in r.stdout.splitlines()
    for mech in ("SCRAM-SHA-512", "PLAIN"):   # PLAIN checks against the SCRAM-SHA-512 credential
        p = KafkaProducer(**kp_conf(sb, certs, mech, user=name, password="bobpw"))
        assert p.send(f"users-{name}", b"x").get(30).offset >= 0
        p.close()
    r = _run(["users", "delete", name, "--bootstrap", sb.plain])
    assert r.returncode == 0, r.stderr
    assert name not in _run(["users", "list", "--bootstrap", sb.plain]).stdout
    c = RawClient(sb.sasl)
    try:
        r = _authenticate(c, "PLAIN", f"\0{name}\0bobpw".encode())
        assert r["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
    finally:
        c.close()
    # Kafka's per-user errors, one line each.
    _one_line_error(_run(["users", "delete", name, "--bootstrap", sb.plain]), "no such user")
    _one_line_error(subprocess.run([*_canopy(), "users", "add", "x", "--bootstrap", sb.plain, "--iterations", "100"],
                                   input="pw\n", capture_output=True, text=True, timeout=30), "--iterations")
    _one_line_error(_run(["users", "list", "--bootstrap", sb.sasl_ssl, "--security-protocol", "SASL_SSL",
                          "--sasl-username", USER, "--sasl-password-file", str(tmp_path / "missing"),
                          "--ssl-cafile", str(certs.ca_pem)]), "--sasl-password-file")
    wrong = tmp_path / "wrong"
    wrong.write_text("nope\n")
    _one_line_error(_run(["users", "list", "--bootstrap", sb.sasl, "--security-protocol", "SASL_PLAINTEXT",
                          "--sasl-username", USER, "--sasl-password-file", str(wrong)]),
                    "invalid credentials")


def test_alter_user_scram_credentials_errors(sb):
    c = RawClient(sb.plain)
    try:
        r = c.request(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, {
            "deletions": [{"name": "ghost", "mechanism": 1}],
            "upsertions": [{"name": "m", "mechanism": 7, "iterations": 4096, "salt": b"s", "salted_password": b"p"},
                           {"name": "few", "mechanism": 1, "iterations": 1000, "salt": b"s", "salted_password": b"p"}]})
        got = {x["user"]: x["error_code"] for x in r["results"]}
        assert got == {"ghost": ErrorCode.RESOURCE_NOT_FOUND, "m": ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                       "few": ErrorCode.UNACCEPTABLE_CREDENTIAL}
        r = c.request(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, {"users": [{"name": "ghost"}, {"name": USER}]})
        got = {x["user"]: (x["error_code"], x["credential_infos"]) for x in r["results"]}
        assert got == {"ghost": (ErrorCode.RESOURCE_NOT_FOUND, []),
                       USER: (0, [{"mechanism": 1, "iterations": 4096}, {"mechanism": 2, "iterations": 4096}])}
    finally:
        c.close()


def test_credentials_file_holds_no_password_and_survives_restart(tmp_path, certs):
    sb = SaslBroker(tmp_path, certs)
    try:
        r = add_user(["--bootstrap", sb.plain], "carol", "carolpw")
        assert r.returncode == 0, r.stderr
    finally:
        sb.stop()
    text = (tmp_path / "data" / "scram-credentials.json").read_text()
    assert "carolpw" not in text and PASSWORD not in text and "carol" in text
    # the bootstrap form refuses a data directory a broker holds (it would not see the change)
    addr = "127.0.0.1:%d" % free_port()
    b = ListenersBroker(tmp_path, ["--listeners", f"SASL_PLAINTEXT://{addr}", "--sasl-enabled-mechanisms",
                                   "SCRAM-SHA-256"], [(addr.split(":")[0], int(addr.split(":")[1]))])
    try:
        _one_line_error(subprocess.run([*_canopy(), "users", "add", "dave", "--data-dir", str(tmp_path / "data")],
                                       input="pw\n", capture_output=True, text=True, timeout=30), "in use")
        p = KafkaProducer(bootstrap_servers=addr, security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                          sasl_plain_username="carol", sasl_plain_password="carolpw")
        assert p.send("restart", b"x").get(30).offset == 0
        p.close()
        c = RawClient(addr)   # PLAIN is not enabled on this broker
        hs = c.request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
        assert hs == {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": ["SCRAM-SHA-256"]}
        c.close()
    finally:
        b.stop()


def test_bad_sasl_options_are_one_line(tmp_path):
    base = ["serve", "--data-dir", str(tmp_path / "d"), "--listeners", f"SASL_PLAINTEXT://127.0.0.1:{free_port()}"]
    _one_line_error(_run([*base, "--sasl-enabled-mechanisms", "GSSAPI"]), "unsupported mechanism 'GSSAPI'")
    _one_line_error(_run(base, env={"CANOPY_SASL_ENABLED_MECHANISMS": " , "}), "no mechanism given")
    _one_line_error(_run(["serve", "--data-dir", str(tmp_path / "d"), "--listeners",
                          f"SASL_SSL://127.0.0.1:{free_port()}"]), "needs ssl-keystore-location")
    (tmp_path / "d").mkdir(exist_ok=True)
    (tmp_path / "d" / "scram-credentials.json").write_text("{not json")
    _one_line_error(_run(base), "unreadable SCRAM credentials")
    _one_line_error(subprocess.run([*_canopy(), "users", "add", "x", "--data-dir", str(tmp_path / "e")],
                                   input="\n", capture_output=True, text=True, timeout=30), "empty password")
    _one_line_error(_run(["users", "list", "--bootstrap", f"127.0.0.1:{free_port()}"]), "cannot connect")
    _one_line_error(_run(["users", "list", "--metadata-store", "nonsense"]), "--metadata-store")
    # A SASL inter-broker listener needs the broker's own login, with an enabled mechanism.
    cluster = [*base, "--metadata-store", "etcd://127.0.0.1:1"]
    _one_line_error(_run(cluster), "set inter-broker-sasl-username and inter-broker-sasl-password")
    _one_line_error(_run([*cluster, "--inter-broker-sasl-username", "b", "--inter-broker-sasl-password", "p",
                          "--sasl-enabled-mechanisms", "PLAIN"]), "is not in sasl-enabled-mechanisms")


def test_confluent_admin_client_manages_scram_users(sb, certs):
    """KIP-554 through a real client's AdminClient (librdkafka): the salted password it
    computes becomes a credential the broker accepts; describe lists mechanisms and
    iterations; per-user errors come back as Kafka's."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                       UserScramCredentialDeletion, UserScramCredentialUpsertion)
    admin = AdminClient({"bootstrap.servers": sb.plain})
    futs = admin.alter_user_scram_credentials([
        UserScramCredentialUpsertion("dora", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"dora-pw"),
        UserScramCredentialUpsertion("dora", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 5000), b"dora-pw")])
    for f in futs.values():
        f.result(30)
    desc = admin.describe_user_scram_credentials(["dora"])["dora"].result(30)
    assert sorted((i.mechanism, i.iterations) for i in desc.scram_credential_infos) == [
        (ScramMechanism.SCRAM_SHA_256, 4096), (ScramMechanism.SCRAM_SHA_512, 5000)]
    for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"):
        p = KafkaProducer(**kp_conf(sb, certs, mech, user="dora", password="dora-pw"))
        assert p.send("dora-topic", b"x").get(30).offset >= 0
        p.close()
    with pytest.raises(KafkaException) as e:
        admin.describe_user_scram_credentials(["nobody"])["nobody"].result(30)
    assert e.value.args[0].code() == ErrorCode.RESOURCE_NOT_FOUND
    with pytest.raises(KafkaException) as e:
        admin.alter_user_scram_credentials([UserScramCredentialDeletion("nobody", ScramMechanism.SCRAM_SHA_256)]
                                           )["nobody"].result(30)
    assert e.value.args[0].code() == ErrorCode.RESOURCE_NOT_FOUND
    admin.alter_user_scram_credentials([UserScramCredentialDeletion("dora", ScramMechanism.SCRAM_SHA_256),
                                        UserScramCredentialDeletion("dora", ScramMechanism.SCRAM_SHA_512)]
                                       )["dora"].result(30)
    with pytest.raises(KafkaException):
        admin.describe_user_scram_credentials(["dora"])["dora"].result(30)
