"""Issue 13, proof 2: the status page of the compose.yaml cluster (four brokers, fan-out 2,
run as local processes) opened in headless Chromium (Debian's `chromium`): the SVG tree of
a partition has one box per replica and one line per parent-child edge of its tree, and a
follower paused with SIGSTOP shows lag while its leader keeps taking records."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from html.parser import HTMLParser

from kafka import KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition

from replication.tree import children_of
from tests.e2e.conftest import require_tool

from .conftest import wait_for


class TreeParser(HTMLParser):
    """Replica boxes and edges of every partition's <svg class="tree">."""

    def __init__(self):
        super().__init__()
        self.trees: dict[str, dict] = {}
        self._current = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg" and a.get("class") == "tree":
            self._current = self.trees.setdefault(f'{a["data-topic"]}-{a["data-partition"]}',
                                                  {"nodes": {}, "edges": set()})
        elif self._current is not None and tag == "g" and a.get("class") == "replica":
            self._current["nodes"][int(a["data-node"])] = a
        elif self._current is not None and tag == "line" and a.get("class") == "edge":
            self._current["edges"].add((int(a["data-parent"]), int(a["data-child"])))

    def handle_endtag(self, tag):
        if tag == "svg":
            self._current = None


def chromium_dom(chromium: str, url: str) -> str:
    r = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--virtual-time-budget=2000", "--dump-dom", url],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def chromium_screenshot(chromium: str, url: str, path) -> None:
    r = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--hide-scrollbars", "--window-size=1300,820", "--virtual-time-budget=2000",
                        f"--screenshot={path}", url], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def trees(chromium: str, node) -> dict:
    p = TreeParser()
    p.feed(chromium_dom(chromium, "http://%s:%d/" % node.http))
    return p.trees


def test_page_draws_the_four_broker_tree_and_shows_a_paused_followers_lag(cluster, tmp_path):
    chromium = require_tool("chromium", "Debian package chromium")
    cluster.create_topic("seen", configs={"min.insync.replicas": "2"})
    leader, _, replicas, _ = cluster.metadata("seen")[0]
    assert len(replicas) == 4 and leader == replicas[0]
    edges = {(parent, child) for parent in replicas for child in children_of(replicas, parent, 2)}
    assert len(edges) == 3   # e.g. 1 -> 2, 3 ; 2 -> 4
    p = KafkaProducer(bootstrap_servers=cluster.nodes[leader].bootstrap, acks=1)
    for i in range(50):
        p.send("seen", value=b"r%d" % i)
    p.flush(30)
    wait_for(lambda: all(cluster.log_end_offset(n, "seen") == 50 for n in replicas), "every replica has 50")

    # A consumer group that read 40 of them: members, assignment and lag on the page.
    c = KafkaConsumer(bootstrap_servers=cluster.nodes[leader].bootstrap, group_id="watchers",
                      enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=40)
    c.subscribe(["seen"])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 40 and time.monotonic() < deadline:
        for msgs in c.poll(1000, max_records=40 - len(got)).values():
            got.extend(msgs)
    c.commit({TopicPartition("seen", 0): OffsetAndMetadata(40, "", -1)})
    dom = chromium_dom(chromium, "http://%s:%d/" % cluster.nodes[leader].http)
    assert re.search(r"<td>watchers</td><td>Stable</td>.*seen\[0\].*seen-0: committed 40, lag 10 rec", dom), dom[-3000:]
    c.close()

    # Any broker's page draws the same tree: every replica once, every edge of the tree.
    for node in cluster.nodes.values():
        t = trees(chromium, node)["seen-0"]
        assert set(t["nodes"]) == set(replicas), t
        assert t["edges"] == edges, t
    t = trees(chromium, cluster.nodes[leader])["seen-0"]
    assert all(t["nodes"][r]["data-lag-records"] == "0" for r in replicas), t["nodes"]
    assert all(t["nodes"][r]["data-in-isr"] == "true" for r in (leader, *children_of(replicas, leader, 2)))

    # Pause a direct child; the leader keeps taking records; the page shows the lag.
    paused = children_of(replicas, leader, 2)[-1]
    cluster.nodes[paused].signal(signal.SIGSTOP)
    try:
        for i in range(30):
            p.send("seen", value=b"late%d" % i)
            if i % 10 == 9:
                p.flush(30)
                time.sleep(0.05)   # later timestamps: lag in seconds too
        p.flush(30)
        t = trees(chromium, cluster.nodes[leader])["seen-0"]
        assert t["nodes"][paused]["data-lag-records"] == "30", t["nodes"][paused]
        dom = chromium_dom(chromium, "http://%s:%d/" % cluster.nodes[leader].http)
        assert re.search(r"lag 30 rec · [0-9.]+ s", dom), "lag in records and seconds on the page"
        # the paused broker answers nothing: "(not answering)" while its etcd lease lasts,
        # "dead" once it lapsed
        assert "not answering" in dom or "dead" in dom
        shot = tmp_path / "status.png"
        chromium_screenshot(chromium, "http://%s:%d/" % cluster.nodes[leader].http, shot)
        assert shot.stat().st_size > 10_000
        if os.environ.get("CANOPY_STATUS_SCREENSHOT"):
            # how docs/status-page.png was made
            shutil.copy(shot, os.environ["CANOPY_STATUS_SCREENSHOT"])
    finally:
        cluster.nodes[paused].signal(signal.SIGCONT)
    wait_for(lambda: trees(chromium, cluster.nodes[leader])["seen-0"]["nodes"][paused]["data-lag-records"] == "0",
             "the resumed follower catches up on the page", timeout=60)

    # A paused grandchild's lag shows through its upstream (a follower), not its leader.
    grandchild = replicas[3]
    assert grandchild not in children_of(replicas, leader, 2)
    cluster.nodes[grandchild].signal(signal.SIGSTOP)
    try:
        for i in range(20):
            p.send("seen", value=b"later%d" % i)
        p.flush(30)
        wait_for(lambda: all(cluster.log_end_offset(n, "seen") == 100 for n in replicas if n != grandchild),
                 "the other replicas have all 100")
        t = trees(chromium, cluster.nodes[leader])["seen-0"]
        assert t["nodes"][grandchild]["data-lag-records"] == "20", t["nodes"][grandchild]
    finally:
        cluster.nodes[grandchild].signal(signal.SIGCONT)
    p.close()
