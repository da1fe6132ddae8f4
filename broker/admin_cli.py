"""`canopy cluster describe` and `canopy cluster promote` — admin commands of a cluster.

Both are ordinary Kafka clients of one broker (any broker answers Metadata the same way,
and a non-controller forwards AlterPartitionReassignments to the controller), speaking
through replication.client.PeerConnection under `trio.run`:

- describe: Metadata v12 (brokers, leaders, epochs, replicas = the tree in breadth-first
  order, ISR) + DescribeCluster v0 (controller) + DescribeConfigs v4 (the topic's
  `replication.fanout`, else the controller's `canopy.fanout`), and prints each tree with
  replication.tree.render.
- promote TOPIC PARTITION NODE [--force]: NODE must be in the ISR (else --force); reorders the partition's replicas with
  replication.tree.promote (NODE first, the old leader moved to the end, a leaf) and sends
  that order as AlterPartitionReassignments v0 — canopy's way to request a promotion.

Errors a user can cause (unknown topic/partition/node, broker unreachable, refused
request) print one line and exit 2.
"""
from __future__ import annotations

import sys

import trio

from replication.client import PeerConnection, PeerError
from replication.client_security import PLAINTEXT
from replication.tree import promote as promote_tree, render

METADATA, DESCRIBE_CONFIGS, ALTER_REASSIGNMENTS, DESCRIBE_CLUSTER = 3, 32, 45, 60
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
UNKNOWN_TOPIC_OR_PARTITION = 3


class AdminError(Exception):
    """Printed as one line; exit status 2."""


def add_parser(sub) -> None:
    """Adds `cluster describe|promote` to the `canopy` argument parser."""
    c = sub.add_parser("cluster", help="describe a cluster's replication trees or promote a replica")
    csub = c.add_subparsers(dest="cluster_command", required=True, parser_class=type(c))
    d = csub.add_parser("describe", help="brokers, controller, and each partition's leader, epoch, ISR and tree")
    d.add_argument("--bootstrap", default="127.0.0.1:9092", help="HOST:PORT of any broker (default 127.0.0.1:9092)")
    d.add_argument("--topic", help="only this topic")
    p = csub.add_parser("promote", help="make NODE the leader of TOPIC's PARTITION")
    p.add_argument("topic")
    p.add_argument("partition", type=int)
    p.add_argument("node", type=int)
    p.add_argument("--force", action="store_true",
                   help="promote NODE even if it is not in the ISR (it may lack acknowledged records)")
    p.add_argument("--bootstrap", default="127.0.0.1:9092", help="HOST:PORT of any broker (default 127.0.0.1:9092)")
    from .users_cli import add_client_security_args
    for sp in (d, p):
        add_client_security_args(sp)   # --security-protocol, --sasl-*, --ssl-cafile


# How the commands log in to the listener they dial (TLS/SASL); set by run().
_security = PLAINTEXT


def run(args) -> int:
    global _security
    try:
        from .users_cli import client_security
        try:
            _security = client_security(args)
        except ValueError as e:
            raise AdminError(str(e)) from None
        host, port = _hostport(args.bootstrap)
        if args.cluster_command == "describe":
            lines = trio.run(describe, host, port, args.topic)
        else:
            lines = trio.run(promote, host, port, args.topic, args.partition, args.node, args.force)
    except (AdminError, PeerError) as e:
        print(f"canopy: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


def _hostport(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise AdminError(f"--bootstrap must be HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


async def _metadata(conn: PeerConnection, topic: str | None) -> dict:
    body = {"topics": None if topic is None else [{"topic_id": b"\0" * 16, "name": topic}],
            "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}
    return await conn.request(METADATA, 12, body, timeout=10)


async def _topic_fanout(conn: PeerConnection, topic: str) -> int | None:
    r = await conn.request(DESCRIBE_CONFIGS, 4, {
        "resources": [{"resource_type": TOPIC_RESOURCE, "resource_name": topic,
                       "configuration_keys": ["replication.fanout"]}],
        "include_synonyms": False, "include_documentation": False}, timeout=10)
    for res in r["results"]:
        for c in res["configs"] if res["error_code"] == 0 else []:
            if c["name"] == "replication.fanout" and c["value"]:
                return int(c["value"])
    return None


async def _broker_fanout(conn: PeerConnection, node: int) -> int | None:
    r = await conn.request(DESCRIBE_CONFIGS, 4, {
        "resources": [{"resource_type": BROKER_RESOURCE, "resource_name": str(node),
                       "configuration_keys": ["canopy.fanout"]}],
        "include_synonyms": False, "include_documentation": False}, timeout=10)
    for res in r["results"]:
        for c in res["configs"] if res["error_code"] == 0 else []:
            if c["name"] == "canopy.fanout" and c["value"]:
                return int(c["value"])
    return None


async def describe(host: str, port: int, topic: str | None = None) -> list[str]:
    conn = PeerConnection(host, port, "canopy-admin", security=_security)
    try:
        md = await _metadata(conn, topic)
        cluster = await conn.request(DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": False},
                                     timeout=10)
        controller = cluster["controller_id"]
        brokers = {b["node_id"]: b for b in md["brokers"]}
        # The controller decided every tree's fan-out when it created the topic (a topic's
        # replication.fanout, else its own `fanout`), so its broker default is the fallback.
        default_fanout = await _default_fanout(conn, host, port, brokers, controller)
        store = await _store_view(conn, host, port, brokers)
        lines = [f"cluster {cluster['cluster_id']}  controller {controller}"
                 + (f"  epoch {store['canopy.controller.epoch']}" if "canopy.controller.epoch" in store else "")]
        if "canopy.metadata.store" in store:
            lines.append(f"metadata store {store['canopy.metadata.store']}: "
                         f"{store.get('canopy.metadata.store.health', '?')}")
        lines.append("brokers:")
        for nid, b in sorted(brokers.items()):
            mark = "  (controller)" if nid == controller else ""
            lines.append(f"  {nid}  {b['host']}:{b['port']}  rack={b['rack'] or '-'}{mark}")
        topics = sorted((t for t in md["topics"] if not t.get("is_internal")), key=lambda t: t["name"])
        if topic is not None:
            t = topics[0] if topics else None
            if t is None or t["error_code"] == UNKNOWN_TOPIC_OR_PARTITION:
                raise AdminError(f"unknown topic {topic!r}")
        for t in topics:
            if t["error_code"]:
                lines.append(f"topic {t['name']}: error {t['error_code']}")
                continue
            fanout = await _topic_fanout(conn, t["name"]) or default_fanout or 2
            lines.append(f"topic {t['name']}  partitions {len(t['partitions'])}  fanout {fanout}")
            for p in sorted(t["partitions"], key=lambda p: p["partition_index"]):
                lines.append(f"  partition {p['partition_index']}  leader {p['leader_id']}  "
                             f"epoch {p['leader_epoch']}  replicas {_ids(p['replica_nodes'])}  "
                             f"committed isr {_ids(p['isr_nodes'])}"
                             + (f"  error {p['error_code']}" if p["error_code"] else ""))
                lines.extend("    " + line for line in render(list(p["replica_nodes"]), fanout))
        return lines
    finally:
        await conn.aclose()


async def _store_view(conn, host, port, brokers) -> dict[str, str]:
    """The controller epoch and etcd's health as the broker we reached sees them."""
    me = next((n for n, x in brokers.items() if (x["host"], x["port"]) == (host, port)), None)
    r = await conn.request(DESCRIBE_CONFIGS, 4, {
        "resources": [{"resource_type": BROKER_RESOURCE, "resource_name": str(me) if me is not None else "",
                       "configuration_keys": ["canopy.controller.epoch", "canopy.metadata.store",
                                              "canopy.metadata.store.health"]}],
        "include_synonyms": False, "include_documentation": False}, timeout=20)
    return {c["name"]: c["value"] for res in r["results"] if res["error_code"] == 0 for c in res["configs"]}


async def _default_fanout(conn, host, port, brokers, controller) -> int | None:
    b = brokers.get(controller)
    if b is not None and (b["host"], b["port"]) != (host, port):
        other = PeerConnection(b["host"], b["port"], "canopy-admin", security=_security)
        try:
            return await _broker_fanout(other, controller)
        except PeerError:
            pass   # controller down: the broker we reached is the next best guess
        finally:
            await other.aclose()
    me = next((n for n, x in brokers.items() if (x["host"], x["port"]) == (host, port)), None)
    return await _broker_fanout(conn, me) if me is not None else None


async def promote(host: str, port: int, topic: str, partition: int, node: int, force: bool = False) -> list[str]:
    conn = PeerConnection(host, port, "canopy-admin", security=_security)
    try:
        md = await _metadata(conn, topic)
        t = md["topics"][0] if md["topics"] else None
        if t is None or t["error_code"] == UNKNOWN_TOPIC_OR_PARTITION:
            raise AdminError(f"unknown topic {topic!r}")
        if t["error_code"]:
            raise AdminError(f"topic {topic!r}: error {t['error_code']}")
        p = next((p for p in t["partitions"] if p["partition_index"] == partition), None)
        if p is None:
            raise AdminError(f"unknown partition {topic}-{partition} (the topic has {len(t['partitions'])})")
        replicas = list(p["replica_nodes"])
        leader = p["leader_id"]
        if node not in replicas:
            known = "a broker" if node in {b["node_id"] for b in md["brokers"]} else "not a broker"
            raise AdminError(f"node {node} is not a replica of {topic}-{partition} "
                             f"(replicas {_ids(replicas)}; {node} is {known})")
        if node == leader:
            return [f"{topic}-{partition}: {node} is already the leader (epoch {p['leader_epoch']})"]
        if node not in p["isr_nodes"] and not force:
            # like Kafka's preferred-leader election, only an in-sync replica is sure to hold
            # every acknowledged record; deeper tiers replicate asynchronously
            raise AdminError(f"node {node} is not in the ISR {_ids(p['isr_nodes'])} of {topic}-{partition}; "
                             "--force promotes it anyway")
        new = promote_tree(replicas, node, demoted=leader)
        try:
            r = await conn.request(ALTER_REASSIGNMENTS, 0, {
                "timeout_ms": 30000,
                "topics": [{"name": topic, "partitions": [{"partition_index": partition, "replicas": new}]}]},
                timeout=35)
        except PeerError as e:
            raise AdminError(f"promote failed: {e} (the controller, node {md['controller_id']}, serves "
                             "promotions; is it up?)") from None
        if r["error_code"]:
            raise AdminError(f"promote refused: error {r['error_code']} {r.get('error_message') or ''}".strip())
        for rt in r["responses"]:
            for rp in rt["partitions"]:
                if rp["error_code"]:
                    raise AdminError(f"promote refused: error {rp['error_code']} {rp.get('error_message') or ''}"
                                     .strip())
        return [f"{topic}-{partition}: leader {leader} -> {node}; replicas {_ids(replicas)} -> {_ids(new)}"]
    finally:
        await conn.aclose()


def _ids(nodes) -> str:
    return "[" + ",".join(str(n) for n in nodes) + "]"
