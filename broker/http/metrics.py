"""/metrics: Prometheus text format from prometheus_client, one registry per broker.

Every family is computed when scraped (a custom collector over the broker's state and the
plain counters of broker/stats.py), so metrics cost the request path a few integer
additions. Names follow what the common Kafka JMX exporter rules produce from Kafka's
MBeans (kafka.server:type=BrokerTopicMetrics,name=BytesInPerSec ->
kafka_server_brokertopicmetrics_bytesin_total), so dashboards built for Kafka map onto
them; docs/metrics.md lists every one.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from protocol.errors import ErrorCode
from protocol.messages import api

from .views import coordinated_groups, group_offsets, is_under_replicated, min_insync


def _api_name(key: int) -> str:
    try:
        return api(key).name
    except (KeyError, ValueError):
        return str(key)


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


def _histogram(family: HistogramMetricFamily, labels: list[str], h) -> None:
    buckets = []
    acc = 0
    for bound, n in zip(h.bounds, h.counts):
        acc += n
        buckets.append((repr(float(bound)), acc))
    buckets.append(("+Inf", h.count))
    family.add_metric(labels, buckets, h.sum)


class BrokerCollector:
    def __init__(self, broker):
        self.broker = broker

    def collect(self):
        b = self.broker
        stats = b.stats
        per_partition = b.config.metrics_per_partition

        # -- requests (kafka.network:type=RequestMetrics) -----------------------------
        requests = CounterMetricFamily("kafka_network_requestmetrics_requests", "Requests answered, per API",
                                       labels=["request"])
        latency = HistogramMetricFamily("kafka_network_requestmetrics_totaltime_seconds",
                                        "Time from a request read to its response written, per API",
                                        labels=["request"])
        for key, h in sorted(stats.requests.latency.items()):
            name = _api_name(key)
            requests.add_metric([name], h.count)
            _histogram(latency, [name], h)
        errors = CounterMetricFamily("kafka_network_requestmetrics_errors",
                                     "Error codes in responses (top level and per partition), per API and error",
                                     labels=["request", "error"])
        for (key, code), n in sorted(stats.requests.errors.items()):
            errors.add_metric([_api_name(key), _error_name(code)], n)
        yield requests
        yield latency
        yield errors

        # -- connections (kafka.server:type=socket-server-metrics) ----------------------
        yield GaugeMetricFamily("kafka_server_socketservermetrics_connection_count",
                                "Open client and replica connections", value=stats.connections_open)
        yield CounterMetricFamily("kafka_server_socketservermetrics_connection_creation",
                                  "Connections accepted", value=stats.connections_total)
        yield CounterMetricFamily("kafka_server_socketservermetrics_connection_failures",
                                  "Connections closed for a malformed or failed request, a stalled reader "
                                  "or a handler failure (one log line each)", value=stats.connection_failures)

        # -- traffic (kafka.server:type=BrokerTopicMetrics) ----------------------------
        traffic = {
            "bytesin": ("Record batch bytes produced to partitions led here", "bytes_in"),
            "messagesin": ("Records produced to partitions led here", "messages_in"),
            "bytesout": ("Record batch bytes fetched by consumers", "bytes_out"),
            "replicationbytesin": ("Record batch bytes replicated from upstream replicas", "replication_bytes_in"),
            "replicationmessagesin": ("Records replicated from upstream replicas", "replication_messages_in"),
            "replicationbytesout": ("Record batch bytes fetched by downstream replicas", "replication_bytes_out"),
        }
        label_names = ["topic", "partition"] if per_partition else ["topic"]
        families = {k: CounterMetricFamily(f"kafka_server_brokertopicmetrics_{k}", doc, labels=label_names)
                    for k, (doc, _) in traffic.items()}
        totals = {k: CounterMetricFamily(f"kafka_server_brokertopicmetrics_{k}_all_topics",
                                         doc + " (all topics)") for k, (doc, _) in traffic.items()}

        log_fams = {
            "logstartoffset": GaugeMetricFamily("kafka_log_log_logstartoffset",
                                                "Log start offset (per topic: summed over its partitions)",
                                                labels=label_names),
            "logendoffset": GaugeMetricFamily("kafka_log_log_logendoffset",
                                              "Log end offset (per topic: summed over its partitions)",
                                              labels=label_names),
            "size": GaugeMetricFamily("kafka_log_log_size", "Bytes in the log's segments", labels=label_names),
        }
        hw_fam = GaugeMetricFamily("kafka_cluster_partition_highwatermark",
                                   "High watermark of partitions led here (per topic: summed)", labels=label_names)
        isr_fam = GaugeMetricFamily("kafka_cluster_partition_insyncreplicascount",
                                    "Committed ISR size of partitions led here (per topic: the smallest)",
                                    labels=label_names)
        under_rep = under_min_isr = partitions = leaders = 0
        topic_sums: dict[str, dict] = {}
        for p in list(b.topics.all_partitions()):
            if not p.is_replica:
                continue
            partitions += 1
            t = p.topic.name
            labels = [t, str(p.index)] if per_partition else [t]
            key = tuple(labels)
            acc = topic_sums.get(key)
            if acc is None:
                acc = topic_sums[key] = {k: 0 for k in traffic} | {"logstartoffset": 0, "logendoffset": 0,
                                                                   "size": 0, "hw": None, "isr": None}
            for k, (_, attr) in traffic.items():
                acc[k] += getattr(p, attr)
            lg = p.log
            acc["logstartoffset"] += lg.log_start_offset
            acc["logendoffset"] += lg.log_end_offset
            acc["size"] += lg.size_bytes
            if p.is_leader:
                leaders += 1
                acc["hw"] = (acc["hw"] or 0) + p.high_watermark
                n = len(p.committed_isr)
                acc["isr"] = n if acc["isr"] is None else min(acc["isr"], n)
                if len(p.replicas) > 1 and is_under_replicated(b, p):
                    under_rep += 1
                if len(p.replicas) > 1 and n < min_insync(b, p):
                    under_min_isr += 1
        grand = {k: 0 for k in traffic}
        for labels, acc in sorted(topic_sums.items()):
            for k in traffic:
                families[k].add_metric(list(labels), acc[k])
                grand[k] += acc[k]
            for k, fam in log_fams.items():
                fam.add_metric(list(labels), acc[k])
            if acc["hw"] is not None:
                hw_fam.add_metric(list(labels), acc["hw"])
                isr_fam.add_metric(list(labels), acc["isr"])
        for k in traffic:
            totals[k].add_metric([], grand[k])
            yield families[k]
            yield totals[k]
        yield from log_fams.values()
        yield hw_fam
        yield isr_fam

        # -- replica manager (kafka.server:type=ReplicaManager) -------------------------
        yield GaugeMetricFamily("kafka_server_replicamanager_partitioncount", "Partitions this broker holds a replica of",
                                value=partitions)
        yield GaugeMetricFamily("kafka_server_replicamanager_leadercount", "Partitions this broker leads", value=leaders)
        yield GaugeMetricFamily("kafka_server_replicamanager_underreplicatedpartitions",
                                "Partitions led here with a direct child out of the ISR or a replica on a dead broker",
                                value=under_rep)
        yield GaugeMetricFamily("kafka_server_replicamanager_underminisrpartitioncount",
                                "Partitions led here whose ISR is smaller than min.insync.replicas",
                                value=under_min_isr)
        yield CounterMetricFamily("kafka_server_replicamanager_isrshrinks", "Committed ISR shrinks of partitions led here (the leader's proposals and the controller's removal of dead brokers)",
                                  value=stats.isr_shrinks)
        yield CounterMetricFamily("kafka_server_replicamanager_isrexpands", "Committed ISR expansions of partitions led here",
                                  value=stats.isr_expands)

        # -- fetch sessions (kafka.server:type=FetchSessionCache, KIP-227) ---------------
        sessions = b.fetch_sessions
        yield GaugeMetricFamily("kafka_server_fetchsessioncache_numincrementalfetchsessions",
                                "Incremental fetch sessions cached (followers' and consumers')",
                                value=len(sessions.sessions))
        yield GaugeMetricFamily("kafka_server_fetchsessioncache_numincrementalfetchpartitionscached",
                                "Partitions in all cached fetch sessions", value=sessions.partitions_cached())
        yield CounterMetricFamily("kafka_server_fetchsessioncache_incrementalfetchsessionevictions",
                                  "Fetch sessions evicted to make room for a new one", value=sessions.evictions)

        # -- controller (kafka.controller:type=KafkaController / ControllerStats) -------
        cluster = b.cluster
        active = 1 if (cluster.enabled and cluster.controller.active) or not cluster.enabled else 0
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_activecontrollercount",
                                "1 on the broker that is the controller, 0 elsewhere", value=active)
        epoch = cluster.image.controller_epoch if cluster.enabled else 0
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_controllerepoch",
                                "The controller epoch (etcd create revision of the controller key)", value=epoch)
        offline = 0
        if active and cluster.enabled:
            img = cluster.image
            for t in img.topics.values():
                for pi in t.partitions:
                    if pi is None or pi.leader not in img.brokers:
                        offline += 1
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_offlinepartitionscount",
                                "Partitions without a live leader (reported by the controller)", value=offline)
        yield CounterMetricFamily("kafka_controller_controllerstats_leaderelections",
                                  "Leader elections this broker made as the controller", value=stats.leader_elections)
        yield CounterMetricFamily("kafka_controller_controllerstats_uncleanleaderelections",
                                  "Elections of a leader from outside the ISR", value=stats.unclean_leader_elections)

        # -- storage ---------------------------------------------------------------------
        fsync = HistogramMetricFamily("kafka_log_logflushstats_logflush_seconds",
                                      "Duration of one flush (fsync of every dirty log: one group commit)")
        _histogram(fsync, [], stats.fsync)
        yield fsync

        # -- consumer groups (kafka_exporter's names) ------------------------------------
        glabels = ["consumergroup", "topic", "partition"] if per_partition else ["consumergroup", "topic"]
        current = GaugeMetricFamily("kafka_consumergroup_current_offset",
                                    "Committed offset (per topic: summed)", labels=glabels)
        lag = GaugeMetricFamily("kafka_consumergroup_lag", "High watermark minus committed offset (per topic: summed)",
                                labels=glabels)
        lag_s = GaugeMetricFamily("kafka_consumergroup_lag_seconds",
                                  "Newest record's timestamp minus the newest consumed one's (per topic: the largest)",
                                  labels=glabels)
        members = GaugeMetricFamily("kafka_consumergroup_members", "Members of groups coordinated here",
                                    labels=["consumergroup"])
        for gid in coordinated_groups(b):
            g = b.groups.groups.get(gid)
            members.add_metric([gid], len(g.members) if g is not None else 0)
            sums: dict[tuple, list] = {}
            for row in group_offsets(b, gid):
                labels = (gid, row["topic"], str(row["partition"])) if per_partition else (gid, row["topic"])
                s = sums.setdefault(labels, [0, None, None])
                s[0] += row["committed_offset"]
                if row["lag_records"] is not None:
                    s[1] = (s[1] or 0) + row["lag_records"]
                    s[2] = max(s[2] or 0.0, row["lag_seconds"])
            for labels, (off, lr, ls) in sorted(sums.items()):
                current.add_metric(list(labels), off)
                if lr is not None:
                    lag.add_metric(list(labels), lr)
                    lag_s.add_metric(list(labels), ls)
        yield current
        yield lag
        yield lag_s
        yield members


def make_registry(broker) -> CollectorRegistry:
    """One registry per broker (never the global one): open files, RSS and CPU from
    prometheus_client's process collector, the rest from BrokerCollector."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    registry.register(BrokerCollector(broker))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
