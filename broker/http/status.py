"""/status.json and the status page (/).

Each broker knows its own replicas best: its log end, high watermark, newest timestamp,
when it last heard from its upstream, and, as a leader, where each direct child last
fetched. ``local_view`` is that (``/status.json?scope=local``). The cluster view asks
every live broker for its local view over HTTP (their addresses are in their etcd
registrations), in parallel with a short timeout, and joins them into one tree per
partition: a replica's own report when it answered, else what its leader knows of it
(a paused follower does not answer, but its leader sees it fall behind).
"""
from __future__ import annotations

import html

import httpx
import trio

from ..broker import monotonic_ms
from .views import (children_view, coordinated_groups, decode_assignment, group_offsets, newest_timestamp, now_ms)

PEER_TIMEOUT_S = 1.5


def local_view(broker) -> dict:
    cluster = broker.cluster
    now_mono = monotonic_ms()
    parts = []
    for p in list(broker.topics.all_partitions()):
        if not p.is_replica:
            continue
        lg = p.log
        parts.append({
            "topic": p.topic.name, "partition": p.index,
            "leader": p.leader, "leader_epoch": p.leader_epoch, "replicas": list(p.replicas), "fanout": p.fanout,
            "isr": list(p.committed_isr),
            "role": "leader" if p.is_leader else ("fenced" if p.fenced else "follower"),
            "upstream": p.upstream,
            "log_start_offset": lg.log_start_offset, "log_end_offset": lg.log_end_offset,
            "high_watermark": p.high_watermark, "newest_timestamp": newest_timestamp(p),
            "last_upstream_fetch_age_ms": (now_mono - p.last_upstream_fetch_ms
                                           if p.last_upstream_fetch_ms >= 0 else None),
            "children": {str(c): v for c, v in children_view(p).items()},
        })
    groups = []
    for gid in coordinated_groups(broker):
        g = broker.groups.groups.get(gid)
        members = []
        if g is not None:
            for m in g.members.values():
                members.append({"member_id": m.member_id, "client_id": m.client_id, "client_host": m.client_host,
                                "assignment": [{"topic": t, "partitions": ps}
                                               for t, ps in decode_assignment(m.assignment)]})
        groups.append({"group_id": gid, "state": g.state if g is not None else "Empty",
                       "coordinator": broker.node_id, "members": members,
                       "offsets": group_offsets(broker, gid)})
    return {
        "node_id": broker.node_id, "rack": broker.config.rack,
        "is_controller": bool(cluster.is_controller),
        "controller_id": cluster.controller_id,
        "controller_epoch": cluster.image.controller_epoch if cluster.enabled else 0,
        "time_ms": now_ms(),
        "partitions": parts, "groups": groups,
    }


async def _peer_view(client: httpx.AsyncClient, addr: tuple[str, int]) -> dict | None:
    try:
        with trio.move_on_after(PEER_TIMEOUT_S):
            r = await client.get("http://%s:%d/status.json?scope=local" % addr)
            if r.status_code == 200:
                return r.json()
    except (httpx.HTTPError, ValueError):
        pass
    return None


async def cluster_view(broker, authorization: bytes | None = None) -> dict:
    """``authorization``: the caller's HTTP credentials, passed on to the other brokers
    (each checks them itself: http/auth.py)."""
    cluster = broker.cluster
    me = local_view(broker)
    views = {broker.node_id: me}
    brokers = []
    if cluster.enabled:
        peers = {n: b.http for n, b in cluster.image.brokers.items() if n != broker.node_id and b.http}
        if peers:
            headers = {"authorization": authorization.decode("latin-1")} if authorization else None
            async with httpx.AsyncClient(timeout=PEER_TIMEOUT_S, headers=headers) as client:
                async def one(n, addr):
                    views[n] = await _peer_view(client, addr)
                async with trio.open_nursery() as nursery:
                    for n, addr in peers.items():
                        nursery.start_soon(one, n, addr)
        for n, b in sorted(cluster.image.brokers.items()):
            brokers.append({"node_id": n, "rack": b.rack, "host": b.host, "port": b.port, "alive": True,
                            "http": "%s:%d" % b.http if b.http else None,
                            "answered": views.get(n) is not None,
                            "role": "controller" if n == cluster.image.controller_id else "broker"})
        topics = cluster.image.topics
        known = {(t.name, i): (pi.replicas, pi.leader_epoch, pi.isr, t.fanout)
                 for t in topics.values() for i, pi in enumerate(t.partitions) if pi is not None}
        for n in sorted({r for reps, *_ in known.values() for r in reps} - {b["node_id"] for b in brokers}):
            brokers.append({"node_id": n, "rack": None, "host": None, "port": None, "alive": False, "http": None,
                            "answered": False, "role": "broker"})
        store = [{"endpoint": cluster.config.metadata_store, "healthy": False, "leader": False,
                  "error": "no answer within %g s" % PEER_TIMEOUT_S}]
        with trio.move_on_after(PEER_TIMEOUT_S):
            store = await cluster.store.health()   # never raises
    else:
        brokers.append({"node_id": broker.node_id, "rack": broker.config.rack, "alive": True, "answered": True,
                        "role": "controller", "host": None, "port": None, "http": None})
        known = {(p["topic"], p["partition"]): (p["replicas"], p["leader_epoch"], p["isr"], p["fanout"])
                 for p in me["partitions"]}
        store = []

    reports: dict[tuple[str, int], dict[int, dict]] = {}
    for n, v in views.items():
        if v is None:
            continue
        for p in v["partitions"]:
            reports.setdefault((p["topic"], p["partition"]), {})[n] = p
    alive = {b["node_id"] for b in brokers if b["alive"]}
    partitions = []
    for (topic, index), (replicas, epoch, isr, fanout) in sorted(known.items()):
        rep = reports.get((topic, index), {})
        leader = replicas[0] if replicas else -1
        lead = rep.get(leader)
        newest = lead["newest_timestamp"] if lead else -1
        leader_end = lead["log_end_offset"] if lead else None
        nodes = []
        for i, r in enumerate(replicas):
            own = rep.get(r)
            parent = None if i == 0 else replicas[(i - 1) // fanout]
            node = {"node_id": r, "parent": parent, "depth": _depth(i, fanout), "in_isr": r in isr,
                    "alive": r in alive, "answered": own is not None, "log_end_offset": None,
                    "high_watermark": None, "lag_records": None, "lag_seconds": None, "last_fetch_age_ms": None}
            if own is not None:
                node["log_end_offset"] = own["log_end_offset"]
                node["high_watermark"] = own["high_watermark"]
                if i > 0:
                    node["last_fetch_age_ms"] = own["last_upstream_fetch_age_ms"]
            if i > 0:
                seen = (rep.get(parent) or {}).get("children", {}).get(str(r))
                if seen is not None:
                    # Its upstream's view: where it last fetched, how long ago; the only
                    # view of a replica that does not answer (paused, cut off).
                    node["last_fetch_age_ms"] = seen["last_fetch_age_ms"]
                    if own is None and seen["log_end_offset"] is not None:
                        node["log_end_offset"] = seen["log_end_offset"]
                        if leader_end is not None:
                            node["lag_records"] = max(0, leader_end - seen["log_end_offset"])
                        up = rep.get(parent)
                        # behind its upstream, plus the upstream's own lag behind the leader
                        up_lag = (max(0, newest - up["newest_timestamp"]) / 1000
                                  if parent != leader and newest >= 0 and up["newest_timestamp"] >= 0 else 0.0)
                        node["lag_seconds"] = seen["lag_seconds"] + up_lag
                if node["log_end_offset"] is not None and leader_end is not None and node["lag_records"] is None:
                    node["lag_records"] = max(0, leader_end - node["log_end_offset"])
                    if own is not None and newest >= 0 and own["newest_timestamp"] >= 0:
                        node["lag_seconds"] = max(0, newest - own["newest_timestamp"]) / 1000
                    elif node["lag_records"] == 0:
                        node["lag_seconds"] = 0.0
            else:
                node["lag_records"] = 0 if own is not None else None
                node["lag_seconds"] = 0.0 if own is not None else None
            nodes.append(node)
        partitions.append({"topic": topic, "partition": index, "leader": leader, "leader_epoch": epoch,
                           "isr": isr, "fanout": fanout, "replicas": nodes,
                           "log_end_offset": leader_end, "high_watermark": lead["high_watermark"] if lead else None,
                           "edges": [[n["parent"], n["node_id"]] for n in nodes if n["parent"] is not None]})
    groups = [g for v in views.values() if v is not None for g in v["groups"]]
    controller = cluster.controller_id
    return {"node_id": broker.node_id, "controller_id": controller,
            "controller_epoch": me["controller_epoch"], "metadata_store": store,
            "brokers": sorted(brokers, key=lambda b: b["node_id"]), "partitions": partitions,
            "groups": sorted(groups, key=lambda g: g["group_id"]), "time_ms": me["time_ms"]}


def _depth(i: int, fanout: int) -> int:
    d = 0
    while i > 0:
        i = (i - 1) // fanout
        d += 1
    return d


# -- the page ----------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em;margin:0 0 .3em}h2{font-size:1.1em;margin:1.2em 0 .4em}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left}
.ok{color:#176a2a}.bad{color:#b00020;font-weight:bold}.muted{color:#777}
.part{display:inline-block;vertical-align:top;margin:0 1.5em 1.5em 0;border:1px solid #ddd;padding:.5em}
svg text{font-size:11px}
"""

_SCRIPT = """
(function(){var box=document.getElementById('refresh');var t=null;
function arm(){if(t)clearTimeout(t);if(box.checked)t=setTimeout(function(){location.reload()},3000);}
box.checked=location.hash!=='#paused';box.onchange=function(){location.hash=box.checked?'':'#paused';arm();};arm();})();
"""

NODE_W, NODE_H, GAP_X, GAP_Y = 178, 62, 16, 34


def _fmt(v, unit="") -> str:
    if v is None:
        return "?"
    if isinstance(v, float):
        return f"{v:.1f}{unit}"
    return f"{v}{unit}"


def tree_svg(part: dict) -> str:
    """The partition's replication tree as SVG: one box per replica (a <g class="replica"
    data-node=...>), one line per parent-child edge (<line class="edge" data-parent
    data-child>), leaders on top, children below their upstream."""
    nodes = part["replicas"]
    by_id = {n["node_id"]: n for n in nodes}
    kids: dict[int, list[int]] = {}
    for n in nodes:
        if n["parent"] is not None:
            kids.setdefault(n["parent"], []).append(n["node_id"])
    pos: dict[int, tuple[float, float]] = {}
    next_x = [0]

    def place(nid: int, depth: int) -> float:
        ch = kids.get(nid, [])
        if not ch:
            x = next_x[0]
            next_x[0] += NODE_W + GAP_X
        else:
            xs = [place(c, depth + 1) for c in ch]
            x = (xs[0] + xs[-1]) / 2
        pos[nid] = (x, depth * (NODE_H + GAP_Y))
        return x

    if nodes:
        place(nodes[0]["node_id"], 0)
    width = max(next_x[0] - GAP_X, NODE_W)
    height = (max((n["depth"] for n in nodes), default=0) + 1) * (NODE_H + GAP_Y) - GAP_Y
    out = [f'<svg class="tree" xmlns="http://www.w3.org/2000/svg" width="{width + 4}" height="{height + 4}" '
           f'data-topic="{html.escape(part["topic"])}" data-partition="{part["partition"]}">']
    for parent, child in part["edges"]:
        if parent in pos and child in pos:
            x1, y1 = pos[parent]
            x2, y2 = pos[child]
            out.append(f'<line class="edge" data-parent="{parent}" data-child="{child}" x1="{x1 + NODE_W / 2 + 2}" '
                       f'y1="{y1 + NODE_H + 2}" x2="{x2 + NODE_W / 2 + 2}" y2="{y2 + 2}" stroke="#888" stroke-width="1.5"/>')
    for nid, (x, y) in pos.items():
        n = by_id[nid]
        leader = n["parent"] is None
        lagging = (n["lag_records"] or 0) > 0
        fill = "#fde2e1" if not n["alive"] else "#fff4d6" if lagging else "#e3f4e6" if n["in_isr"] or leader else "#eef"
        stroke = "#b00020" if not n["alive"] else "#333"
        role = "leader" if leader else ("ISR" if n["in_isr"] else "follower")
        age = n["last_fetch_age_ms"]
        out.append(f'<g class="replica" data-node="{nid}" data-lag-records="{_fmt(n["lag_records"])}" '
                   f'data-in-isr="{str(n["in_isr"]).lower()}" transform="translate({x + 2},{y + 2})">'
                   f'<rect width="{NODE_W}" height="{NODE_H}" rx="6" fill="{fill}" stroke="{stroke}"/>'
                   f'<text x="8" y="15" font-weight="bold">node {nid} · {role}{"" if n["alive"] else " · DEAD"}</text>'
                   f'<text x="8" y="30">log end {_fmt(n["log_end_offset"])}</text>'
                   f'<text x="8" y="44" class="lag">lag {_fmt(n["lag_records"])} rec · {_fmt(n["lag_seconds"], " s")}</text>'
                   f'<text x="8" y="57" class="muted">{"" if leader else "fetched " + _fmt(None if age is None else age / 1000, " s ago")}</text>'
                   '</g>')
    out.append("</svg>")
    return "".join(out)


def render_page(view: dict) -> str:
    e = html.escape
    rows = []
    for b in view["brokers"]:
        live = '<span class="ok">alive</span>' if b["alive"] else '<span class="bad">dead</span>'
        if b["alive"] and not b["answered"]:
            live += ' <span class="bad">(not answering)</span>'
        rows.append(f'<tr class="broker" data-node="{b["node_id"]}"><td>{b["node_id"]}</td><td>{e(str(b["rack"] or ""))}</td>'
                    f'<td>{live}</td><td>{e(b["role"])}</td><td>{e(str(b.get("host") or ""))}'
                    f'{":" + str(b["port"]) if b.get("port") else ""}</td></tr>')
    store_rows = "".join(
        f'<tr><td>{e(s["endpoint"])}</td><td class="{"ok" if s["healthy"] else "bad"}">'
        f'{"healthy" if s["healthy"] else "unhealthy"}</td><td>{"leader" if s.get("leader") else ""}</td>'
        f'<td>{e(str(s.get("error") or ""))}</td></tr>' for s in view["metadata_store"])
    parts, internal = [], []
    for p in view["partitions"]:
        (internal if p["topic"].startswith("__") else parts).append(f'<div class="part" id="{e(p["topic"])}-{p["partition"]}"><div><b>{e(p["topic"])}-{p["partition"]}</b> '
                     f'epoch {p["leader_epoch"]} · ISR {p["isr"]} · HW {_fmt(p["high_watermark"])}</div>'
                     f'{tree_svg(p)}</div>')
    groups = []
    for g in view["groups"]:
        members = "<br>".join(
            f'{e(m["client_id"])} ({e(m["client_host"])}): '
            + e(", ".join(f'{a["topic"]}{a["partitions"]}' for a in m["assignment"]))
            for m in g["members"]) or '<span class="muted">none</span>'
        lag = "<br>".join(f'{e(o["topic"])}-{o["partition"]}: committed {o["committed_offset"]}, lag '
                          f'{_fmt(o["lag_records"])} rec / {_fmt(o["lag_seconds"], " s")}' for o in g["offsets"])
        groups.append(f'<tr><td>{e(g["group_id"])}</td><td>{e(str(g["state"]))}</td><td>{g["coordinator"]}</td>'
                      f'<td>{members}</td><td>{lag}</td></tr>')
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>canopy · node {view["node_id"]}</title><style>{_CSS}</style></head>
<body>
<h1>canopy cluster</h1>
<div class="muted">served by node {view["node_id"]} · controller <b id="controller">{view["controller_id"]}</b>
(epoch {view["controller_epoch"]}) · <label><input type="checkbox" id="refresh"> refresh every 3 s</label>
· <a href="/status.json">status.json</a> · <a href="/metrics">metrics</a></div>
<h2>Brokers</h2>
<table><tr><th>node</th><th>rack</th><th>liveness</th><th>role</th><th>address</th></tr>{"".join(rows)}</table>
<h2>Metadata store (etcd)</h2>
<table><tr><th>endpoint</th><th>health</th><th>raft</th><th>error</th></tr>{store_rows or '<tr><td colspan="4" class="muted">none: a single broker</td></tr>'}</table>
<h2>Partitions</h2>
{"".join(parts) or '<p class="muted">no topics</p>'}
<details><summary>internal topics ({len(internal)} partitions)</summary>{"".join(internal)}</details>
<h2>Consumer groups</h2>
<table><tr><th>group</th><th>state</th><th>coordinator</th><th>members and assignments</th><th>lag</th></tr>{"".join(groups) or '<tr><td colspan="5" class="muted">none</td></tr>'}</table>
<script>{_SCRIPT}</script>
</body></html>"""
