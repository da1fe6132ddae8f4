"""compose.yaml, checked without a Docker engine (none runs here).

1. Debian's `docker-compose config` (1.29) parses and validates the file against the
   compose schema and resolves the YAML anchors/merge keys. It never contacts an engine
   (checked: it succeeds with DOCKER_HOST pointing at a socket that does not exist, which
   the test does too) and does not open the build context, so no image is built.
2. Structural facts the cluster relies on, read with PyYAML from the resolved config:
   three etcd members from the upstream image forming one cluster, four brokers that all
   name those members as their metadata store, unique node ids, a data volume per broker
   and per etcd member, and listeners (parsed by the broker's own config loader): an
   INTERNAL one the brokers use among themselves, advertised under the service's own name,
   and an EXTERNAL one bound on the published container port and advertised as
   localhost:<published host port>, so clients on the host reach every broker.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import ROOT, require_tool

COMPOSE = ROOT / "compose.yaml"
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/canopy-no-docker.sock", "PATH": "/usr/bin:/bin:/usr/local/bin"}


def compose_config(path: Path, *args: str) -> subprocess.CompletedProcess:
    tool = require_tool("docker-compose", "validates compose.yaml")
    return subprocess.run([tool, "-f", str(path), "config", *args], capture_output=True, text=True,
                          timeout=60, env=NO_ENGINE, cwd=path.parent)


@pytest.fixture(scope="module")
def resolved() -> dict:
    """The config as docker-compose resolves it (anchors and merge keys applied)."""
    r = compose_config(COMPOSE)
    assert r.returncode == 0, r.stderr
    return yaml.safe_load(r.stdout)


def test_docker_compose_config_accepts_the_file():
    r = compose_config(COMPOSE, "-q")
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == "", r.stderr   # no warnings either (unset variables, ...)


def test_docker_compose_config_rejects_a_broken_file(tmp_path):
    """Proves the validator validates: a wrong type for `ports` must fail."""
    doc = yaml.safe_load(COMPOSE.read_text())
    doc["services"]["canopy-1"]["ports"] = 19091
    bad = tmp_path / "compose.yaml"
    bad.write_text(yaml.safe_dump(doc))
    r = compose_config(bad, "-q")
    assert r.returncode != 0
    assert "ports" in r.stderr


def brokers_of(resolved) -> dict:
    return {n: s for n, s in resolved["services"].items() if n.startswith("canopy")}


def etcd_of(resolved) -> dict:
    return {n: s for n, s in resolved["services"].items() if n.startswith("etcd")}


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_three_etcd_members_form_one_cluster(resolved):
    members = etcd_of(resolved)
    assert len(members) == 3
    for name, svc in members.items():
        assert svc["image"].startswith("quay.io/coreos/etcd:"), svc["image"]   # the upstream image
        cmd = svc["command"]
        assert flag(cmd, "--name") == name
        assert flag(cmd, "--advertise-client-urls") == f"http://{name}:2379"
        assert flag(cmd, "--initial-advertise-peer-urls") == f"http://{name}:2380"
        assert flag(cmd, "--initial-cluster") == ",".join(f"{m}=http://{m}:2380" for m in sorted(members))


def test_four_brokers_share_the_metadata_store(resolved):
    services = brokers_of(resolved)
    assert len(services) == 4
    envs = {name: svc["environment"] for name, svc in services.items()}
    stores = {e["CANOPY_METADATA_STORE"] for e in envs.values()}
    assert stores == {"etcd://" + ",".join(f"{m}:2379" for m in sorted(etcd_of(resolved)))}, stores
    node_ids = [int(e["CANOPY_NODE_ID"]) for e in envs.values()]
    assert len(set(node_ids)) == 4, f"node ids not unique: {node_ids}"
    for name, e in envs.items():
        assert "CANOPY_PEERS" not in e and "CANOPY_CONTROLLER" not in e
        assert set(services[name]["depends_on"]) == set(etcd_of(resolved))
    # a tree of four brokers: leader, two children, a grandchild
    assert {e["CANOPY_FANOUT"] for e in envs.values()} == {"2"}


def test_a_data_volume_per_service(resolved):
    services = brokers_of(resolved)
    mounts = {}
    for name, svc in services.items():
        data = [v for v in svc.get("volumes", []) if (v["target"] if isinstance(v, dict) else v.split(":")[1]) == "/data"]
        assert len(data) == 1, f"{name} has no /data volume"
        v = data[0]
        mounts[name] = v["source"] if isinstance(v, dict) else v.split(":")[0]
        assert svc["environment"]["CANOPY_DATA_DIR"] == "/data"
    assert len(set(mounts.values())) == 4, f"services share a data volume: {mounts}"
    assert set(mounts.values()) <= set(resolved.get("volumes", {}))
    etcd_mounts = {name: [v for v in svc["volumes"]] for name, svc in etcd_of(resolved).items()}
    assert all(len(v) == 1 for v in etcd_mounts.values()), etcd_mounts


def test_services_build_canopy_and_run_serve(resolved):
    for name, svc in brokers_of(resolved).items():
        assert Path(svc["build"]["context"]) == ROOT, name
        assert svc["command"] == ["canopy", "serve"], name
    assert (ROOT / "Dockerfile").is_file()
    ports = [p["published"] if isinstance(p, dict) else p.split(":")[0]
             for svc in resolved["services"].values() for p in svc.get("ports", [])]
    assert len(set(map(str, ports))) == len(ports) == 8   # EXTERNAL listener and HTTP port of each broker


def test_internal_listener_for_brokers_external_one_for_the_host(resolved):
    """The issue's repro: `kcat -b localhost:19092 -L` must list addresses the host can
    dial, while brokers keep talking to each other by service name."""
    from broker.config import load_config

    for name, svc in brokers_of(resolved).items():
        env = {k: str(v) for k, v in svc["environment"].items()}
        assert "CANOPY_LISTEN" not in env and "CANOPY_ADVERTISE" not in env   # listeners replace them
        lc = load_config({}, environ=env).listener_config
        bound = {x.name: x for x in lc.listeners}
        assert set(bound) == set(lc.advertised) == {"INTERNAL", "EXTERNAL"}, name
        assert {x.security_protocol for x in lc.listeners} == {"PLAINTEXT"}
        assert lc.inter_broker == "INTERNAL"
        # INTERNAL: every interface of the container, advertised as the service's name
        assert (bound["INTERNAL"].host, bound["INTERNAL"].port) == ("0.0.0.0", 9092)
        assert lc.advertised["INTERNAL"] == (svc.get("hostname", name), 9092)
        assert svc.get("hostname", name) == name
        # EXTERNAL: bound on the container port that is published, advertised as the host port
        published, target = next((p, t) for p, t in _ports(svc) if t != HTTP_PORT)
        assert bound["EXTERNAL"].host == "0.0.0.0" and bound["EXTERNAL"].port == target, (name, port)
        assert lc.advertised["EXTERNAL"] == ("localhost", published), name


HTTP_PORT = 8080


def _ports(svc) -> list[tuple[int, int]]:
    out = []
    for port in svc["ports"]:
        if isinstance(port, dict):
            out.append((int(port["published"]), int(port["target"])))
        else:
            out.append(tuple(int(x) for x in str(port).split(":")))
    return out


def test_http_port_published_on_every_broker(resolved):
    """The status page and /metrics of every broker are reachable from the host, and
    other brokers reach it by service name (the status page asks each broker)."""
    from broker.config import load_config

    for name, svc in brokers_of(resolved).items():
        env = {k: str(v) for k, v in svc["environment"].items()}
        config = load_config({}, environ=env)
        assert config.http_listen == f"0.0.0.0:{HTTP_PORT}", name
        assert config.http_advertised == (name, HTTP_PORT), name
        assert sum(1 for _, t in _ports(svc) if t == HTTP_PORT) == 1, name
