"""Older and asyncio clients against a real `canopy serve`: kafka-python 2.0.2 (still widely
deployed; it infers the broker version from the ApiVersions ranges, so no api_version is
passed) and aiokafka. Each produces, then consumes through a consumer group that commits, and
a second member of the group resumes from that commit.

kafka-python 2.0.2 cannot share a venv with 3.0.x (same import name), so it runs in
`.venv-kp2` (`make kp2`) as a subprocess. Both clients are exercised in one test and their
outcomes reported together, so a failure of one does not hide the other.
"""
from __future__ import annotations

import asyncio
import json
import re
import subprocess
import textwrap
import traceback
import uuid

import pytest

from .conftest import ROOT, require_tool

pytestmark = pytest.mark.timeout(240)

KP2_SCRIPT = textwrap.dedent(r'''
    import json, sys, time
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    bootstrap, topic, group, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    out = {}

    def read(consumer, want, timeout=30.0):
        got = []
        deadline = time.time() + timeout
        while len(got) < want and time.time() < deadline:
            for recs in consumer.poll(timeout_ms=500).values():
                got.extend(recs)
        return got

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    out["api_version"] = list(producer.config["api_version"])
    futures = [producer.send(topic, key=b"k%d" % i, value=b"kp2-%d" % i, partition=0)
               for i in range(n)]
    producer.flush(timeout=30)
    out["offsets"] = [f.get(timeout=30).offset for f in futures]

    def member():
        return KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             fetch_max_wait_ms=200, session_timeout_ms=10000,
                             heartbeat_interval_ms=1000)

    c1 = member()
    recs = read(c1, n)
    out["first"] = [[r.partition, r.offset, r.key.decode(), r.value.decode()] for r in recs]
    c1.commit()
    out["committed"] = c1.committed(TopicPartition(topic, 0))
    c1.close()

    for i in range(n, n + 50):
        producer.send(topic, key=b"k%d" % i, value=b"kp2-%d" % i, partition=0)
    producer.flush(timeout=30)
    producer.close(timeout=10)

    c2 = member()
    recs = read(c2, 50)
    time.sleep(0.5)
    recs += [r for rs in c2.poll(timeout_ms=500).values() for r in rs]
    out["second"] = [[r.partition, r.offset, r.value.decode()] for r in recs]
    c2.close()
    print(json.dumps(out))
''')


def unique(prefix, request) -> str:
    name = re.sub(r"[^a-zA-Z0-9._-]", "-", request.node.name)[:40]
    return f"{prefix}-{name}-{uuid.uuid4().hex[:8]}"


def check_kafka_python_2(broker, kp2_python, topic, group, n=500) -> None:
    try:
        proc = subprocess.run([kp2_python, "-c", KP2_SCRIPT, broker.bootstrap, topic, group,
                               str(n)], capture_output=True, timeout=150, cwd="/")
    except subprocess.TimeoutExpired as e:
        raise AssertionError("kafka-python 2.0.2 script timed out; stderr:\n"
                             + (e.stderr or b"").decode(errors="replace")[-4000:]) from None
    assert proc.returncode == 0, (
        f"kafka-python 2.0.2 script exited {proc.returncode}:\n"
        + proc.stderr.decode(errors="replace")[-4000:])
    out = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    # It must infer a broker new enough for v2 record batches (Kafka >= 0.11).
    assert tuple(out["api_version"]) >= (0, 11), out["api_version"]
    assert out["offsets"] == list(range(n))
    assert out["first"] == [[0, i, f"k{i}", f"kp2-{i}"] for i in range(n)]
    assert out["committed"] == n
    assert out["second"] == [[0, i, f"kp2-{i}"] for i in range(n, n + 50)]


async def aiokafka_round_trip(bootstrap, topic, group, n=500) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=True, linger_ms=5)
    await asyncio.wait_for(producer.start(), 30)
    try:
        futures = [await producer.send(topic, key=b"k%d" % i, value=b"aio-%d" % i, partition=0)
                   for i in range(n)]
        metas = await asyncio.wait_for(asyncio.gather(*futures), 60)
        assert [m.offset for m in metas] == list(range(n))

        async def read(consumer, want, timeout=30.0):
            got = []
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while len(got) < want and loop.time() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for recs in batch.values():
                    got.extend(recs)
            return got

        def member():
            return AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    fetch_max_wait_ms=200, session_timeout_ms=10000,
                                    heartbeat_interval_ms=1000)

        tp = TopicPartition(topic, 0)
        c1 = member()
        await asyncio.wait_for(c1.start(), 30)
        try:
            recs = await read(c1, n)
            assert [(r.offset, r.key, r.value) for r in recs] == \
                [(i, b"k%d" % i, b"aio-%d" % i) for i in range(n)]
            await asyncio.wait_for(c1.commit(), 15)
            assert await asyncio.wait_for(c1.committed(tp), 15) == n
        finally:
            await asyncio.wait_for(c1.stop(), 30)

        more = [await producer.send(topic, value=b"aio-%d" % i, partition=0)
                for i in range(n, n + 50)]
        await asyncio.wait_for(asyncio.gather(*more), 60)

        c2 = member()
        await asyncio.wait_for(c2.start(), 30)
        try:
            recs = await read(c2, 50)
            extra = await c2.getmany(timeout_ms=500)
            recs += [r for rs in extra.values() for r in rs]
            assert [(r.offset, r.value) for r in recs] == \
                [(i, b"aio-%d" % i) for i in range(n, n + 50)]
        finally:
            await asyncio.wait_for(c2.stop(), 30)
    finally:
        await asyncio.wait_for(producer.stop(), 30)


def test_kafka_python_2_0_2_and_aiokafka_produce_and_consume_through_groups(broker, request):
    kp2_python = require_tool(ROOT / ".venv-kp2" / "bin" / "python",
                              "kafka-python 2.0.2 venv")
    failures = {}
    try:
        check_kafka_python_2(broker, kp2_python, unique("kp2", request),
                             f"kp2g-{uuid.uuid4().hex[:8]}")
    except Exception:
        failures["kafka-python 2.0.2"] = traceback.format_exc()
    try:
        asyncio.run(asyncio.wait_for(
            aiokafka_round_trip(broker.bootstrap, unique("aio", request),
                                f"aiog-{uuid.uuid4().hex[:8]}"), 150))
    except Exception:
        failures["aiokafka"] = traceback.format_exc()
    assert not failures, "\n\n".join(f"== {client} ==\n{tb}" for client, tb in failures.items()) \
        + f"\n== broker log ==\n{broker.log_text()}"
