"""Counters the request path bumps, read by /metrics at scrape time (broker/http/metrics.py).

The hot path does plain integer arithmetic on lists here: no locks, no label lookups, no
prometheus_client objects (each of those costs microseconds per request, and a produce
request is answered in ~80 µs). The Prometheus families are built from these numbers
only when someone scrapes.
"""
from __future__ import annotations

from bisect import bisect_left

# Request latency buckets in seconds (Kafka's request times are mostly well under a
# millisecond on loopback; long polls and acks=all waits reach the hundreds of ms).
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0)
FSYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Histogram:
    """Per-bucket counts (not cumulative; the exporter accumulates) and the sum."""
    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds=LATENCY_BUCKETS):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1


class RequestStats:
    """Per API key: requests, errors by code, latency (Kafka's RequestMetrics)."""

    def __init__(self):
        self.latency: dict[int, Histogram] = {}
        self.errors: dict[tuple[int, int], int] = {}

    def record(self, api_key: int, seconds: float, response) -> None:
        h = self.latency.get(api_key)
        if h is None:
            h = self.latency[api_key] = Histogram()
        h.observe(seconds)
        if response is None:
            return
        if api_key == 0:        # Produce: the hot path, so its one known shape is read directly
            for t in response["responses"]:
                for p in t["partition_responses"]:
                    if p["error_code"]:
                        self._error(0, p["error_code"])
            return
        if api_key == 1:        # Fetch: top-level code, then each partition's
            if response.get("error_code"):
                self._error(1, response["error_code"])
            for t in response["responses"]:
                for p in t["partitions"]:
                    if p["error_code"]:
                        self._error(1, p["error_code"])
            return
        codes = []
        _error_codes(response, codes)
        for code in codes:
            self._error(api_key, code)

    def _error(self, api_key: int, code: int) -> None:
        k = (api_key, int(code))
        self.errors[k] = self.errors.get(k, 0) + 1


def _error_codes(node, out: list) -> None:
    """Every non-zero error_code in a response (Kafka's errorCounts(): the top-level code
    and each partition's / topic's / member's). Only dicts and lists are walked: record
    bytes are never looked at."""
    if isinstance(node, dict):
        code = node.get("error_code")
        if code:
            out.append(int(code))
        for v in node.values():
            if isinstance(v, (list, dict)):
                _error_codes(v, out)
    elif isinstance(node, list):
        for v in node:
            if isinstance(v, (list, dict)):
                _error_codes(v, out)


class BrokerStats:
    def __init__(self):
        self.requests = RequestStats()
        self.connections_open = 0
        self.connections_total = 0
        self.connection_failures = 0       # connections closed for a protocol/handler failure
        self.fsync = Histogram(FSYNC_BUCKETS)
        self.isr_shrinks = 0
        self.isr_expands = 0
        self.leader_elections = 0          # elections this broker made as the controller
        self.unclean_leader_elections = 0
