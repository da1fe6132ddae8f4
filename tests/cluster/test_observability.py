"""Issue 13, proof 1: /metrics of a running three-broker cluster (real etcd, real
`canopy serve` processes), parsed with prometheus_client's own parser, while real clients
produce; a follower killed with SIGKILL and restarted."""
from __future__ import annotations

import time
import urllib.request

import pytest
from kafka import KafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import free_port
from tests.e2e.rawclient import RawClient, make_batch, produce

from .conftest import cluster_metadata, etcd_brokers, partition_metadata, wait_for

HOSTS = {1: "127.0.0.11", 2: "127.0.0.12", 3: "127.0.0.13"}


@pytest.fixture
def http_cluster(tmp_path, etcd_cluster):
    with etcd_brokers(tmp_path, etcd_cluster, HOSTS,
                      extra_args=lambda n, h: ["--http-listen", f"{h}:{free_port(h)}"],
                      env={"CANOPY_FANOUT": "2", "CANOPY_MIN_INSYNC_REPLICAS": "2",
                           "CANOPY_REPLICA_LAG_TIME_MAX_MS": "3000", "CANOPY_LEADER_FAILURE_TIMEOUT_MS": "3000",
                           # one unreplicated offsets partition: the under-replicated
                           # counts below are the test topic's alone
                           "CANOPY_OFFSETS_TOPIC_NUM_PARTITIONS": "1",
                           "CANOPY_OFFSETS_TOPIC_REPLICATION_FACTOR": "1"}) as brokers:
        for b in brokers.values():
            b.http = b.extra_args[-1]
        yield brokers


def scrape(broker) -> dict[str, dict[tuple, float]]:
    """{sample name: {sorted label items: value}} from one broker's /metrics."""
    with urllib.request.urlopen(f"http://{broker.http}/metrics", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def value(samples: dict, name: str, **labels) -> float:
    return samples.get(name, {}).get(tuple(sorted(labels.items())), 0.0)


def create_topic(brokers, name: str) -> None:
    c = RawClient(brokers[2].bootstrap)
    try:
        r = c.request(19, 5, {"topics": [{"name": name, "num_partitions": 1, "replication_factor": -1,
                                          "configs": []}], "timeout_ms": 10000})
    finally:
        c.close()
    assert r["topics"][0]["error_code"] == 0, r
    wait_for(lambda: all(len(partition_metadata(b.bootstrap, name)[0][3]) == 3 for b in brokers.values()),
             f"{name} on every broker with all three in its ISR")


def test_metrics_count_exactly_and_follow_a_killed_follower(http_cluster):
    brokers = http_cluster
    create_topic(brokers, "obs")
    leader, _, replicas, _ = partition_metadata(brokers[1].bootstrap, "obs")[0]
    followers = [r for r in replicas if r != leader]

    # Exactly one broker is the active controller; all agree on the controller epoch.
    scraped = {n: scrape(b) for n, b in brokers.items()}
    active = [n for n, s in scraped.items()
              if value(s, "kafka_controller_kafkacontroller_activecontrollercount") == 1]
    assert len(active) == 1, active
    assert active[0] == cluster_metadata(brokers[1].bootstrap, [])["controller_id"]
    epochs = {value(s, "kafka_controller_kafkacontroller_controllerepoch") for s in scraped.values()}
    assert len(epochs) == 1 and epochs.pop() > 0

    before = scraped
    # Load 1: a real client (kafka-python, acks=all): records in move by exactly what it sent.
    n_records = 3000
    p = KafkaProducer(bootstrap_servers=brokers[leader].bootstrap, acks="all", linger_ms=5)
    for i in range(n_records):
        p.send("obs", value=b"x" * (i % 50))
    p.flush(60)
    p.close()
    # Load 2: batches of known size from a raw client: bytes in move by exactly their sizes.
    c = RawClient(brokers[leader].bootstrap)
    sizes = []
    try:
        for k in range(7):
            batch = make_batch([b"v%d" % i for i in range(10 + k)], timestamp=int(time.time() * 1000))
            sizes.append(len(batch))
            r = produce(c, "obs", batch, acks=-1)
            assert r["error_code"] == 0, r
    finally:
        c.close()
    raw_records = sum(10 + k for k in range(7))

    after = scrape(brokers[leader])
    b0 = before[leader]
    assert value(after, "kafka_server_brokertopicmetrics_messagesin_total", topic="obs") - \
        value(b0, "kafka_server_brokertopicmetrics_messagesin_total", topic="obs") == n_records + raw_records
    produce_reqs = value(after, "kafka_network_requestmetrics_requests_total", request="Produce") - \
        value(b0, "kafka_network_requestmetrics_requests_total", request="Produce")
    assert produce_reqs >= 7 + 1
    hist_count = value(after, "kafka_network_requestmetrics_totaltime_seconds_count", request="Produce") - \
        value(b0, "kafka_network_requestmetrics_totaltime_seconds_count", request="Produce")
    assert hist_count == produce_reqs
    # the latency histogram's +Inf bucket holds every request
    assert value(after, "kafka_network_requestmetrics_totaltime_seconds_bucket", request="Produce", le="+Inf") == \
        value(after, "kafka_network_requestmetrics_totaltime_seconds_count", request="Produce")
    client_bytes = value(after, "kafka_server_brokertopicmetrics_bytesin_total", topic="obs") - \
        value(b0, "kafka_server_brokertopicmetrics_bytesin_total", topic="obs")
    assert client_bytes > sum(sizes)
    # Every follower replicated exactly the records and bytes the leader took in.
    for f in followers:
        wait_for(lambda: value(scrape(brokers[f]), "kafka_server_brokertopicmetrics_replicationmessagesin_total",
                               topic="obs") == n_records + raw_records, f"node {f} replicated everything")
        s = scrape(brokers[f])
        assert value(s, "kafka_server_brokertopicmetrics_replicationbytesin_total", topic="obs") == client_bytes
        assert value(s, "kafka_server_brokertopicmetrics_messagesin_total", topic="obs") == 0
        assert value(s, "kafka_log_log_logendoffset", topic="obs") == n_records + raw_records
    assert value(after, "kafka_server_brokertopicmetrics_replicationbytesout_total", topic="obs") >= 2 * client_bytes
    # Both followers are the leader's children (fan-out 2) and fetch in a KIP-227 session each.
    s = scrape(brokers[leader])
    assert value(s, "kafka_server_fetchsessioncache_numincrementalfetchsessions") == len(followers) == 2
    assert value(s, "kafka_server_fetchsessioncache_numincrementalfetchpartitionscached") == 2

    # The raw batches' exact sizes: one more produce, measured alone.
    c = RawClient(brokers[leader].bootstrap)
    try:
        mid = scrape(brokers[leader])
        for size_batch in (make_batch([b"a" * 100] * 3), make_batch([b"b"] * 40)):
            assert produce(c, "obs", size_batch, acks=-1)["error_code"] == 0
        end = scrape(brokers[leader])
    finally:
        c.close()
    assert value(end, "kafka_server_brokertopicmetrics_bytesin_total", topic="obs") - \
        value(mid, "kafka_server_brokertopicmetrics_bytesin_total", topic="obs") == \
        len(make_batch([b"a" * 100] * 3)) + len(make_batch([b"b"] * 40))
    assert value(end, "kafka_server_brokertopicmetrics_messagesin_total", topic="obs") - \
        value(mid, "kafka_server_brokertopicmetrics_messagesin_total", topic="obs") == 43
    assert value(end, "kafka_network_requestmetrics_requests_total", request="Produce") - \
        value(mid, "kafka_network_requestmetrics_requests_total", request="Produce") == 2
    assert value(end, "kafka_server_replicamanager_underreplicatedpartitions") == 0

    # Kill a follower: the leader reports the partition under-replicated, then not again
    # once the follower is back in the ISR.
    victim = followers[-1]
    others = [n for n in brokers if n != victim]

    def under_replicated() -> float:
        return sum(value(scrape(brokers[n]), "kafka_server_replicamanager_underreplicatedpartitions") for n in others)

    brokers[victim].kill9()
    wait_for(lambda: under_replicated() == 1, "one under-replicated partition", timeout=60)
    wait_for(lambda: value(scrape(brokers[leader]), "kafka_server_replicamanager_isrshrinks_total") >= 1,
             "the leader's ISR shrink counted", timeout=60)
    assert value(scrape(brokers[leader]), "kafka_cluster_partition_insyncreplicascount", topic="obs") == 2
    brokers[victim].start()
    wait_for(lambda: under_replicated() == 0 and
             value(scrape(brokers[victim]), "kafka_server_replicamanager_underreplicatedpartitions") == 0,
             "no under-replicated partition once the follower is back", timeout=90)
    s = scrape(brokers[leader])
    assert value(s, "kafka_server_replicamanager_isrexpands_total") >= 1
    assert value(s, "kafka_cluster_partition_insyncreplicascount", topic="obs") == 3
    active = [n for n, b in brokers.items()
              if value(scrape(b), "kafka_controller_kafkacontroller_activecontrollercount") == 1]
    assert len(active) == 1, active
    # process metrics: open files and RSS of this broker
    assert value(s, "process_open_fds") > 0 and value(s, "process_resident_memory_bytes") > 10e6

    # Kill the leader: the controller (whichever broker holds the role then) counts one
    # clean election, and no partition stays offline.
    offsets_leader = partition_metadata(brokers[leader].bootstrap, "__consumer_offsets")[0][2][0]
    elections_before = sum(value(scrape(b), "kafka_controller_controllerstats_leaderelections_total")
                           for n, b in brokers.items() if n != leader)
    brokers[leader].kill9()
    survivors = [n for n in brokers if n != leader]
    wait_for(lambda: partition_metadata(brokers[survivors[0]].bootstrap, "obs")[0][0] in survivors,
             "a new leader", timeout=60)

    def elections() -> float:
        return sum(value(scrape(brokers[n]), "kafka_controller_controllerstats_leaderelections_total")
                   for n in survivors)
    wait_for(lambda: elections() >= elections_before + 1, "the election counted", timeout=60)
    assert sum(value(scrape(brokers[n]), "kafka_controller_controllerstats_uncleanleaderelections_total")
               for n in survivors) == 0
    wait_for(lambda: sum(value(scrape(brokers[n]), "kafka_controller_kafkacontroller_activecontrollercount")
                         for n in survivors) == 1, "one active controller among the survivors", timeout=60)
    # Offline: only the offsets topic's one unreplicated partition, if the dead broker held it.
    expected_offline = 1 if offsets_leader == leader else 0
    wait_for(lambda: sum(value(scrape(brokers[n]), "kafka_controller_kafkacontroller_offlinepartitionscount")
                         for n in survivors) == expected_offline, "offline partitions counted", timeout=30)
