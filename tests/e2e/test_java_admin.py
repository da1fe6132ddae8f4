"""The Java AdminClient (kafka-clients 3.9.1 and 4.3.0) against a real `canopy serve`: every
admin call of issue 12 (tests/java/AdminCalls.java runs them in order), with Kafka's
answers for bad input arriving as the exceptions Kafka's own broker causes:
InvalidConfigurationException for an unknown config or an out-of-range value,
InvalidRequestException for a static broker config, GroupNotEmptyException,
GroupSubscribedToTopicException and GroupIdNotFoundException for DeleteGroups /
OffsetDelete, ElectionNotNeededException for a preferred election on one broker.
"""
from __future__ import annotations

import subprocess
import uuid

import pytest

from tests.e2e.test_java_client import KAFKA_VERSIONS, ROOT, _no_slf4j, _tail, compile_java

SOURCE = ROOT / "tests" / "java" / "AdminCalls.java"

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", params=KAFKA_VERSIONS, ids=lambda v: f"kafka-clients-{v}")
def admin_calls(request, tmp_path_factory) -> str:
    return compile_java(SOURCE, request.param, tmp_path_factory)[1]


def _steps(stdout: str) -> dict[str, dict[str, str]]:
    out = {}
    for line in stdout.splitlines():
        if line.startswith("step="):
            toks = line.split()
            fields = {"ok": "ok" in toks}
            fields.update(t.split("=", 1) for t in toks if "=" in t)
            out[fields["step"]] = fields
    return out


def test_java_admin_apis(admin_calls, broker):
    topic, group = f"java-admin-{uuid.uuid4().hex[:8]}", f"java-group-{uuid.uuid4().hex[:8]}"
    p = subprocess.run(["java", "-cp", admin_calls, "AdminCalls", broker.bootstrap, topic, group],
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, f"{_tail(p.stdout)}\n{_tail(_no_slf4j(p.stderr))}\n{broker.log_text()[-3000:]}"
    s = _steps(p.stdout)
    detail = f"\n{p.stdout}"

    def ok(name):
        assert s[name]["ok"], f"{name}: {s[name]}{detail}"
        return s[name]

    def error(name, cls, text=None):
        assert s[name].get("error") == cls, f"{name}: {s[name]}{detail}"
        if text:
            assert text in s[name]["message"].replace("_", " "), f"{name}: {s[name]}{detail}"

    ok("create")
    error("create-unknown-config", "InvalidConfigurationException", "Unknown topic config name: no.such.config")
    error("create-out-of-range", "InvalidConfigurationException",
          "Invalid value -5 for configuration retention.ms: Value must be at least -1")
    d = ok("describe-created")
    assert (d["delete.retention.ms"], d["delete.retention.ms.source"], d["delete.retention.ms.default"]) == \
        ("3600000", "DYNAMIC_TOPIC_CONFIG", "false"), d
    assert (d["retention.ms"], d["retention.ms.source"], d["retention.ms.default"]) == \
        ("604800000", "DEFAULT_CONFIG", "true"), d
    assert d["retention.ms.synonyms"] == "log.retention.ms:DEFAULT_CONFIG", d
    assert ok("alter-validate-only")["retention.ms.source"] == "DEFAULT_CONFIG"
    a = ok("alter")
    assert (a["retention.ms"], a["retention.ms.source"]) == ("3600000", "DYNAMIC_TOPIC_CONFIG"), a
    assert a["retention.ms.synonyms"] == "retention.ms:DYNAMIC_TOPIC_CONFIG,log.retention.ms:DEFAULT_CONFIG", a
    error("alter-unknown-config", "InvalidConfigurationException", "Unknown topic config name: no.such.config")
    error("alter-out-of-range", "InvalidConfigurationException",
          "Invalid value 0 for configuration min.insync.replicas: Value must be at least 1")
    b = ok("alter-broker-dynamic")
    assert (b["retention.bytes"], b["retention.bytes.source"]) == ("1073741824", "DYNAMIC_BROKER_CONFIG"), b
    assert b["retention.bytes.synonyms"] == \
        "log.retention.bytes:DYNAMIC_BROKER_CONFIG,log.retention.bytes:DEFAULT_CONFIG", b
    error("alter-broker-static", "InvalidRequestException", "Cannot update these configs dynamically")
    assert ok("alter-broker-delete")["retention.bytes.source"] == "DEFAULT_CONFIG"
    assert ok("describe-producers")["producers"] == "1"
    assert ok("describe-producers")["last_sequence"] == "4"
    ld = ok("describe-log-dirs")
    assert ld["dirs"] == "1" and int(ld["size"]) > 0, ld
    assert ok("elect-preferred")["result"] == "ElectionNotNeededException"
    assert "consumed=5" in p.stdout, detail
    error("delete-group-non-empty", "GroupNotEmptyException")
    error("delete-offsets-subscribed", "GroupSubscribedToTopicException")
    assert ok("delete-offsets")["left"] == "0"
    ok("delete-group")
    error("delete-group-unknown", "GroupIdNotFoundException")
