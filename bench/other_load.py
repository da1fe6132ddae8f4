"""Non-Kafka comparisons — Redis streams, NATS JetStream, RabbitMQ streams — each with its
own Python client, so these figures include a different (pure-Python) client and protocol:
they say what those systems cost here, not how canopy compares on equal terms.

W1 equivalent: N records of SIZE bytes appended in pipelined batches, then read back from
the start; W2 equivalent: sequential single appends, waited for one by one.
"""
from __future__ import annotations

import asyncio
import os
import time
import uuid

from brokers import Broker
from kafka_load import pct, result
from progress import Progress

BATCH = 1000


# --------------------------------------------------------------------------- Redis

def redis_w1(b: Broker, n: int, size: int, bar: Progress) -> tuple[dict, dict]:
    import redis
    r = redis.Redis(port=b.port)
    key = f"s-{uuid.uuid4().hex[:6]}"
    payload = os.urandom(size)
    cpu0, t0 = b.cpu(), time.perf_counter()
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(key, {b"v": payload})
        if (i + 1) % BATCH == 0 or i == n - 1:
            pipe.execute()
            bar.step(0, f"redis produce {i + 1}/{n}")
    t1, cpu1 = time.perf_counter(), b.cpu()
    prod = result(n, size, t1 - t0, cpu1 - cpu0, b)
    cpu0, t0 = b.cpu(), time.perf_counter()
    last, got = "0-0", 0
    while got < n:
        res = r.xread({key: last}, count=10000)
        entries = res[0][1]
        got += len(entries)
        last = entries[-1][0]
        bar.step(0, f"redis consume {got}/{n}")
    t1, cpu1 = time.perf_counter(), b.cpu()
    return prod, result(got, size, t1 - t0, cpu1 - cpu0, b)


def redis_rt(b: Broker, n: int) -> dict:
    import redis
    r = redis.Redis(port=b.port)
    key = f"rt-{uuid.uuid4().hex[:6]}"
    samples = []
    for i in range(n + 100):
        t0 = time.perf_counter_ns()
        r.xadd(key, {b"v": b"x" * 100})
        if i >= 100:
            samples.append(time.perf_counter_ns() - t0)
    samples.sort()
    return {"p50_us": pct(samples, .5), "p99_us": pct(samples, .99),
            "p999_us": pct(samples, .999)}


# --------------------------------------------------------------------------- NATS

async def _nats_w1(b: Broker, n: int, size: int, bar: Progress):
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StorageType
    nc = await nats.connect(f"nats://127.0.0.1:{b.port}")
    js = nc.jetstream()
    name = f"S{uuid.uuid4().hex[:6]}"
    await js.add_stream(name=name, subjects=[name], storage=StorageType.FILE)
    payload = os.urandom(size)
    cpu0, t0 = b.cpu(), time.perf_counter()
    for i in range(0, n, BATCH):
        futs = [await js.publish_async(name, payload) for _ in range(min(BATCH, n - i))]
        await asyncio.gather(*futs)
        bar.step(0, f"nats produce {i + len(futs)}/{n}")
    t1, cpu1 = time.perf_counter(), b.cpu()
    prod = result(n, size, t1 - t0, cpu1 - cpu0, b)
    cpu0, t0 = b.cpu(), time.perf_counter()
    sub = await js.pull_subscribe(name, config=ConsumerConfig(ack_policy=AckPolicy.NONE))
    got = 0
    while got < n:
        msgs = await sub.fetch(batch=BATCH, timeout=10)
        got += len(msgs)
        bar.step(0, f"nats consume {got}/{n}")
    t1, cpu1 = time.perf_counter(), b.cpu()
    cons = result(got, size, t1 - t0, cpu1 - cpu0, b)
    samples = []
    for i in range(1100):
        t = time.perf_counter_ns()
        await js.publish(name, b"x" * 100)
        if i >= 100:
            samples.append(time.perf_counter_ns() - t)
    samples.sort()
    await nc.close()
    return prod, cons, {"p50_us": pct(samples, .5), "p99_us": pct(samples, .99),
                        "p999_us": pct(samples, .999)}


# --------------------------------------------------------------------------- RabbitMQ

async def _rabbit_w1(b: Broker, n: int, size: int, bar: Progress):
    from rstream import (AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType,
                         Producer)
    name = f"s-{uuid.uuid4().hex[:6]}"
    payload = os.urandom(size)
    async with Producer("127.0.0.1", port=b.port, username="guest",
                        password="guest") as prod:
        await prod.create_stream(name, exists_ok=True)
        cpu0, t0 = b.cpu(), time.perf_counter()
        confirmed = [0]

        def on_confirm(status):
            confirmed[0] += 1

        for i in range(0, n, BATCH):
            await prod.send_batch(name, [AMQPMessage(body=payload)
                                         for _ in range(min(BATCH, n - i))],
                                  on_publish_confirm=on_confirm)
            bar.step(0, f"rabbitmq produce {i + BATCH}/{n}")
        deadline = time.monotonic() + 60
        while confirmed[0] < n and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        t1, cpu1 = time.perf_counter(), b.cpu()
        p_res = result(n, size, t1 - t0, cpu1 - cpu0, b)
        samples = []
        for i in range(1100):
            t = time.perf_counter_ns()
            await prod.send_wait(name, AMQPMessage(body=b"x" * 100))
            if i >= 100:
                samples.append(time.perf_counter_ns() - t)
        samples.sort()
    got = [0]
    done = asyncio.Event()

    async def on_msg(msg, ctx):
        got[0] += 1
        if got[0] >= n:
            done.set()

    async with Consumer("127.0.0.1", port=b.port, username="guest",
                        password="guest") as cons:
        cpu0, t0 = b.cpu(), time.perf_counter()
        await cons.subscribe(name, on_msg, offset_specification=ConsumerOffsetSpecification(
            OffsetType.FIRST, None))
        while not done.is_set():
            try:
                await asyncio.wait_for(done.wait(), 0.25)
            except asyncio.TimeoutError:
                pass
            bar.step(0, f"rabbitmq consume {got[0]}/{n}")
        t1, cpu1 = time.perf_counter(), b.cpu()
    c_res = result(n, size, t1 - t0, cpu1 - cpu0, b)
    return p_res, c_res, {"p50_us": pct(samples, .5), "p99_us": pct(samples, .99),
                          "p999_us": pct(samples, .999)}


# --------------------------------------------------------------------------- entry

def run(b: Broker, cfg: dict, bar: Progress) -> dict:
    """W1 (both sizes) and a W2-style round trip for one non-Kafka system."""
    out: dict = {"w1": {}, "w2": {}}
    for size in cfg["sizes"]:
        if b.kind == "redis":
            p, c = redis_w1(b, cfg["records"], size, bar)
            rt = redis_rt(b, 1000)
        elif b.kind == "nats":
            p, c, rt = asyncio.run(_nats_w1(b, cfg["records"], size, bar))
        else:
            p, c, rt = asyncio.run(_rabbit_w1(b, cfg["records"], size, bar))
        out["w1"][f"produce_{size}"], out["w1"][f"consume_{size}"] = p, c
        out["w2"]["round_trip"] = rt
        bar.step(1)
    return out
