"""The example pipeline (pipelines/) end to end on local[2] against a real canopy process."""
from __future__ import annotations

import json
from collections import Counter

from pipelines import click_counts as C
from pipelines import generate_clicks as G

from .conftest import create_topic, read_all

DELAY_MS = 60_000  # pipelines.click_counts.WATERMARK_DELAY


def final_windows(expected: Counter, evts) -> Counter:
    """Append mode emits a window once the watermark (max event time - delay) passes its end."""
    watermark = max(G.event_time_ms(e) for e in evts) - DELAY_MS
    return Counter({k: v for k, v in expected.items() if k[0] + 60_000 <= watermark})


def parquet_counts(spark, path) -> Counter:
    got: Counter = Counter()
    for r in spark.read.parquet(str(path)).collect():
        key = (int(r.window_start.timestamp() * 1000), r.page)
        assert key not in got, f"window {key} written twice"
        got[key] = r.clicks
    return got


def topic_counts(bootstrap, topic) -> tuple[Counter, int]:
    from datetime import datetime

    got: Counter = Counter()
    n = 0
    for m in read_all(bootstrap, topic):
        d = json.loads(m.value())
        assert m.key().decode() == d["page"]
        start = int(datetime.fromisoformat(d["window_start"].replace("Z", "+00:00")).timestamp() * 1000)
        got[(start, d["page"])] = d["clicks"]
        n += 1
    return got, n


def test_pipeline_available_now_gives_exact_counts(spark, broker, tmp_path):
    evts = G.events(3000, 10, seed=11)
    G.produce(broker.bootstrap, "clicks", evts, partitions=2)
    expected = final_windows(G.expected_counts(evts), evts)
    assert len(expected) == 8 * len(G.PAGES)

    q = C.start(spark, broker.bootstrap, "clicks", "click-counts", str(tmp_path / "pq"),
                str(tmp_path / "ck"), max_offsets_per_trigger=1500)
    q.awaitTermination(240)
    assert q.exception() is None
    batches = [p for p in q.recentProgress if p.numInputRows]
    assert sum(p.numInputRows for p in batches) == 3000
    assert len(batches) == 2 and all(p.numInputRows <= 1500 for p in batches)

    assert parquet_counts(spark, tmp_path / "pq") == expected
    from_topic, n = topic_counts(broker.bootstrap, "click-counts")
    assert from_topic == expected and n == len(expected)


def test_pipeline_restart_from_checkpoint_neither_loses_nor_repeats(spark, broker, tmp_path):
    evts = G.events(2400, 8, seed=12)
    first, second = evts[:1200], evts[1200:]
    G.produce(broker.bootstrap, "clicks", first, partitions=2)
    args = (spark, broker.bootstrap, "clicks", "click-counts", str(tmp_path / "pq"), str(tmp_path / "ck"))

    q1 = C.start(*args, max_offsets_per_trigger=700)
    q1.awaitTermination(240)
    assert q1.exception() is None
    ran1 = [p.batchId for p in q1.recentProgress]

    G.produce(broker.bootstrap, "clicks", second)
    q2 = C.start(*args, max_offsets_per_trigger=700)
    q2.awaitTermination(240)
    assert q2.exception() is None
    ran2 = [p.batchId for p in q2.recentProgress]
    # the second run continues the batch numbering: nothing re-run, nothing skipped
    assert ran2[0] == ran1[-1] + 1, (ran1, ran2)
    assert sum(p.numInputRows for p in q1.recentProgress) == 1200
    assert sum(p.numInputRows for p in q2.recentProgress) == 1200

    # Same result as a single run over all the data: watermark state survived the restart.
    expected = final_windows(G.expected_counts(evts), evts)
    assert parquet_counts(spark, tmp_path / "pq") == expected
    from_topic, n = topic_counts(broker.bootstrap, "click-counts")
    assert from_topic == expected and n == len(expected)
