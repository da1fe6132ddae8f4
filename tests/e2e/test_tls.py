"""TLS listeners (security protocol SSL): real certificates made with trustme (a test CA,
the broker's certificate for 127.0.0.1, client certificates), real clients — kafka-python,
confluent-kafka, kcat and the Java client (3.9.1 and 4.3.0) — producing and consuming over
TLS; mTLS principals; and refusals: an untrusted broker certificate, no client certificate
under ssl.client.auth=required, a PLAINTEXT client on the TLS port. Each refusal closes the
connection, logs one line and leaves the broker serving everyone else.
"""
from __future__ import annotations

import socket
import ssl
import struct
import subprocess
import time

import pytest
import trustme
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer

from .conftest import free_port, require_tool
from .test_cli import _one_line_error, _run
from .test_java_client import java  # noqa: F401  (the compiled SparkLikeClient, per kafka-clients version)
from .test_listeners import ListenersBroker


class Certs:
    def __init__(self, d):
        self.ca = trustme.CA()
        self.ca_pem = d / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_pem))
        self.server = d / "server.pem"      # key and chain in one PEM: Kafka's PEM keystore
        self.ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(str(self.server))
        self.client = d / "client.pem"
        self.client_cert = self.ca.issue_cert("alice@example.com", common_name="alice",
                                              organization_name="Canopy Tests", organization_unit_name="ops, eu")
        self.client_cert.private_key_and_cert_chain_pem.write_to_path(str(self.client))
        self.client_key = d / "client.key"
        self.client_cert.private_key_pem.write_to_path(str(self.client_key))
        self.client_chain = d / "client.crt"
        self.client_cert.cert_chain_pems[0].write_to_path(str(self.client_chain))
        other = trustme.CA()             # a CA nobody here trusts
        self.untrusted_ca_pem = d / "other-ca.pem"
        other.cert_pem.write_to_path(str(self.untrusted_ca_pem))
        self.untrusted_server = d / "other-server.pem"
        other.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(self.untrusted_server))


@pytest.fixture
def certs(tmp_path):
    d = tmp_path / "certs"
    d.mkdir()
    return Certs(d)


def tls_broker(tmp_path, certs, client_auth: str = "requested", extra=()):
    plain = ("127.0.0.1", free_port())
    tls = ("127.0.0.1", free_port())
    b = ListenersBroker(tmp_path, [
        "--listeners", "PLAINTEXT://%s:%d,SSL://%s:%d" % (*plain, *tls),
        "--ssl-keystore-location", str(certs.server), "--ssl-truststore-location", str(certs.ca_pem),
        "--ssl-client-auth", client_auth, "--log-level", "debug", *extra], [plain, tls])
    return b, "%s:%d" % plain, "%s:%d" % tls


@pytest.fixture
def broker_tls(tmp_path, certs):
    b, plain, tls = tls_broker(tmp_path, certs)
    try:
        yield b, plain, tls
    finally:
        b.stop()


# A refusal's one line (a closed-without-a-word probe, e.g. the fixture's port check, is
# logged at debug only and is not one).
REFUSED = "WARNING canopy.security: closing connection"


def log_lines(b, needle: str) -> list[str]:
    return [line for line in b.log_path.read_text(errors="replace").splitlines() if needle in line]


def wait_log(b, needle: str, count: int = 1, timeout: float = 20) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = log_lines(b, needle)
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def test_kafka_python_over_tls_with_a_client_certificate(broker_tls, certs):
    b, plain, tls = broker_tls
    producer = KafkaProducer(bootstrap_servers=tls, security_protocol="SSL", ssl_cafile=str(certs.ca_pem),
                             ssl_certfile=str(certs.client_chain), ssl_keyfile=str(certs.client_key), acks="all")
    futures = [producer.send("tls-kp", key=b"k%d" % i, value=b"v%d" % i * 50) for i in range(3000)]
    producer.flush(60)
    assert [f.get(30).offset for f in futures] == list(range(3000))
    producer.close()
    consumer = KafkaConsumer("tls-kp", bootstrap_servers=tls, security_protocol="SSL",
                             ssl_cafile=str(certs.ca_pem), group_id="tls-group", auto_offset_reset="earliest",
                             consumer_timeout_ms=20000)
    got = [(m.offset, m.key, m.value) for m in consumer]
    consumer.close()
    assert got == [(i, b"k%d" % i, b"v%d" % i * 50) for i in range(3000)]
    # mTLS principal: User:<subject DN> in RFC 2253 order, special characters escaped.
    dn = "CN=alice,OU=ops\\, eu,O=Canopy Tests"
    assert wait_log(b, f"principal User:{dn}"), b.log_path.read_text()[-3000:]
    assert wait_log(b, "principal User:ANONYMOUS")   # the consumer sent no certificate


def test_fetch_larger_than_a_tls_write_matches_plaintext(broker_tls, certs):
    """TLS fetches read record bytes from the segment and encrypt them (no sendfile): the
    bytes a consumer gets over TLS equal those it gets over the zero-copy path."""
    b, plain, tls = broker_tls
    producer = KafkaProducer(bootstrap_servers=plain, acks=1, batch_size=256 * 1024, linger_ms=20)
    payload = [bytes([i % 251]) * 4000 for i in range(1500)]   # ~6 MB, > EXTERNAL_CHUNK several times
    for v in payload:
        producer.send("tls-big", v)
    producer.flush(60)
    producer.close()

    def read(bootstrap, **kw):
        c = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=15000,
                          fetch_max_bytes=16 << 20, max_partition_fetch_bytes=8 << 20, **kw)
        from kafka import TopicPartition as TP
        c.assign([TP("tls-big", 0)])
        out = [m.value for m in c]
        c.close()
        return out
    assert read(plain) == payload
    assert read(tls, security_protocol="SSL", ssl_cafile=str(certs.ca_pem)) == payload


def test_confluent_kafka_over_tls(broker_tls, certs):
    b, plain, tls = broker_tls
    conf = {"bootstrap.servers": tls, "security.protocol": "ssl", "ssl.ca.location": str(certs.ca_pem),
            "ssl.certificate.location": str(certs.client_chain), "ssl.key.location": str(certs.client_key)}
    p = Producer({**conf, "enable.idempotence": True})
    for i in range(5000):
        p.produce("tls-ck", value=b"c%d" % i)
    assert p.flush(60) == 0
    c = Consumer({**conf, "group.id": "tls-ck", "auto.offset.reset": "earliest"})
    c.assign([TopicPartition("tls-ck", 0, 0)])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 5000 and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None:
            assert m.error() is None, m.error()
            got.append(m.value())
    c.close()
    assert got == [b"c%d" % i for i in range(5000)]


def test_kcat_over_tls(broker_tls, certs):
    b, plain, tls = broker_tls
    kcat = require_tool("kcat", "Debian package kcat")
    ssl_args = ["-X", "security.protocol=ssl", "-X", f"ssl.ca.location={certs.ca_pem}"]
    lines = "".join(f"line {i}\n" for i in range(1000))
    r = subprocess.run([kcat, "-b", tls, *ssl_args, "-P", "-t", "tls-kcat"], input=lines, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([kcat, "-b", tls, *ssl_args, "-C", "-t", "tls-kcat", "-o", "beginning", "-e", "-q"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == lines
    r = subprocess.run([kcat, "-b", tls, *ssl_args, "-L"], capture_output=True, text=True, timeout=60)
    assert f"broker 0 at {tls}" in r.stdout, r.stdout


def test_java_client_over_tls(java, broker_tls, certs):  # noqa: F811
    b, plain, tls = broker_tls
    props = ["--prop", "security.protocol=SSL", "--prop", "ssl.truststore.type=PEM",
             "--prop", f"ssl.truststore.location={certs.ca_pem}"]
    res = java.run("produce", tls, "tls-java", 2000, "--partition", 0, *props)
    assert res.kv_lines()[0] == {"acked": "2000"}, res.stdout
    res = java.run("consume-range", tls, "tls-java", 0, 0, 2000, *props)
    last = res.kv_lines()[-1]
    assert (last["count"], last["first"], last["last"]) == ("2000", "0", "1999"), res.stdout


def _refused_by_tls(address: str, context: ssl.SSLContext) -> str:
    """Handshake, then an ApiVersions request: the refusal surfaces as an SSL error or EOF."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        try:
            with context.wrap_socket(raw, server_hostname=host) as s:
                body = struct.pack(">hhih", 18, 0, 1, 4) + b"test"
                s.sendall(struct.pack(">i", len(body)) + body)
                data = s.recv(4)
                return "eof" if not data else f"answered {data!r}"
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as e:
            return type(e).__name__ + ": " + str(e)


def test_refusals_close_the_connection_log_one_line_and_others_keep_working(tmp_path, certs):
    b, plain, tls = tls_broker(tmp_path, certs, client_auth="required")
    try:
        # mTLS required, no client certificate.
        ctx = ssl.create_default_context(cafile=str(certs.ca_pem))
        outcome = _refused_by_tls(tls, ctx)
        assert not outcome.startswith("answered"), outcome
        lines = wait_log(b, REFUSED)
        assert len(lines) == 1 and "CERTIFICATE" in lines[0].upper(), lines

        # A client that does not trust the broker's certificate refuses it; the broker logs it.
        ctx = ssl.create_default_context(cafile=str(certs.untrusted_ca_pem))
        ctx.load_cert_chain(str(certs.client_chain), str(certs.client_key))
        outcome = _refused_by_tls(tls, ctx)
        assert "CERTIFICATE_VERIFY_FAILED" in outcome, outcome
        assert len(wait_log(b, REFUSED, 2)) == 2

        # A client certificate from a CA the broker does not trust.
        other = trustme.CA().issue_cert("mallory@example.com")
        stranger = tmp_path / "stranger.pem"
        other.private_key_and_cert_chain_pem.write_to_path(str(stranger))
        ctx = ssl.create_default_context(cafile=str(certs.ca_pem))
        ctx.load_cert_chain(str(stranger))
        outcome = _refused_by_tls(tls, ctx)
        assert not outcome.startswith("answered"), outcome
        assert len(wait_log(b, REFUSED, 3)) == 3

        # A PLAINTEXT client on the SSL port.
        host, port = tls.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            body = struct.pack(">hhih", 18, 0, 1, 4) + b"test"
            s.sendall(struct.pack(">i", len(body)) + body)
            s.settimeout(10)
            try:
                data = s.recv(100)
            except ConnectionResetError:
                data = b""
            assert not data.startswith(b"\x00\x00"), data   # no Kafka response, maybe a TLS alert
        lines = wait_log(b, "not a TLS client", 1)
        assert len(lines) == 1, lines
        assert len(log_lines(b, REFUSED)) == 4

        # Everyone else is served: an mTLS client and a plaintext one.
        producer = KafkaProducer(bootstrap_servers=tls, security_protocol="SSL", ssl_cafile=str(certs.ca_pem),
                                 ssl_certfile=str(certs.client_chain), ssl_keyfile=str(certs.client_key))
        assert producer.send("after", b"x").get(30).offset == 0
        producer.close()
        producer = KafkaProducer(bootstrap_servers=plain)
        assert producer.send("after", b"y").get(30).offset == 1
        producer.close()
        assert b.proc.poll() is None
        assert not log_lines(b, "Traceback")
    finally:
        b.stop()


def test_bad_tls_options_are_one_line(tmp_path, certs):
    base = ["serve", "--data-dir", str(tmp_path / "d"), "--listeners", f"SSL://127.0.0.1:{free_port()}"]
    _one_line_error(_run(base), "needs ssl-keystore-location")
    _one_line_error(_run([*base, "--ssl-keystore-location", str(tmp_path / "nope.pem")]), "no such file")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    _one_line_error(_run([*base, "--ssl-keystore-location", str(garbage)]), "not a PEM certificate chain")
    _one_line_error(_run([*base, "--ssl-keystore-location", str(certs.server), "--ssl-client-auth", "required"]),
                    "needs ssl-truststore-location")
    _one_line_error(_run([*base, "--ssl-keystore-location", str(certs.server),
                          "--ssl-truststore-location", str(garbage)]), "not PEM CA certificates")
    _one_line_error(_run([*base, "--ssl-keystore-location", str(certs.server)],
                         env={"CANOPY_SSL_CLIENT_AUTH": "sometimes"}), "ssl-client-auth must be one of")
    # An SSL inter-broker listener is fine (brokers dial each other over TLS); an unreadable
    # keystore for the brokers' own client certificate is one line.
    _one_line_error(_run([*base, "--ssl-keystore-location", str(certs.server), "--ssl-truststore-location",
                          str(tmp_path / "nope.pem"), "--metadata-store", "etcd://127.0.0.1:1"]), "no such file")


def test_http_port_serves_tls_with_the_listeners_client_auth(tmp_path, certs):
    """Issue 13: when every Kafka listener is SSL, the HTTP port (metrics, tail) asks for
    the same TLS and client certificates; no way around the listeners' authentication."""
    import http.client
    import urllib.error
    import urllib.request

    tls = ("127.0.0.1", free_port())
    port = free_port()
    b = ListenersBroker(tmp_path, [
        "--listeners", "SSL://%s:%d" % tls, "--ssl-keystore-location", str(certs.server),
        "--ssl-truststore-location", str(certs.ca_pem), "--ssl-client-auth", "required",
        "--http-listen", f"127.0.0.1:{port}"], [tls])
    try:
        ok = ssl.create_default_context(cafile=str(certs.ca_pem))
        ok.load_cert_chain(str(certs.client))
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ok, timeout=20) as r:
            assert r.status == 200 and b"kafka_server_replicamanager_partitioncount" in r.read()
        no_cert = ssl.create_default_context(cafile=str(certs.ca_pem))
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=no_cert, timeout=20) as r:
                r.read()
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20).read()
        assert "Traceback" not in b.log_path.read_text()
    finally:
        b.stop()
