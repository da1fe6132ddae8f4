"""compose.yaml, checked without a Docker engine (none runs here).

1. Debian's `docker-compose config` (1.29) parses and validates the file against the
   compose schema and resolves the YAML anchors/merge keys. It never contacts an engine
   (checked: it succeeds with DOCKER_HOST pointing at a socket that does not exist, which
   the test does too) and does not open the build context, so no image is built.
2. Structural facts the cluster relies on, read with PyYAML from the resolved config:
   four brokers, one controller, the same peer list everywhere, unique node ids, a data
   volume per broker, and that the peer list and node ids agree.
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


def peer_list(value: str) -> dict[int, tuple[str, str | None]]:
    out = {}
    for item in value.split(","):
        node, _, rest = item.partition("@")
        addr, _, rack = rest.partition("/")
        out[int(node)] = (addr, rack or None)
    return out


def test_four_brokers_one_controller_same_peers(resolved):
    services = resolved["services"]
    assert len(services) == 4
    envs = {name: svc["environment"] for name, svc in services.items()}
    peers = {e["CANOPY_PEERS"] for e in envs.values()}
    assert len(peers) == 1, f"CANOPY_PEERS differs between services: {peers}"
    peer_map = peer_list(peers.pop())
    node_ids = [int(e["CANOPY_NODE_ID"]) for e in envs.values()]
    assert len(set(node_ids)) == 4, f"node ids not unique: {node_ids}"
    assert set(node_ids) == set(peer_map)
    controllers = {e["CANOPY_CONTROLLER"] for e in envs.values()}
    assert len(controllers) == 1, f"services disagree on the controller: {controllers}"
    assert int(controllers.pop()) in node_ids
    for name, e in envs.items():
        nid = int(e["CANOPY_NODE_ID"])
        host, _, port = peer_map[nid][0].rpartition(":")
        # the peer address of a node is the service's own name/hostname, and what it advertises
        assert host in (name, services[name].get("hostname")), (name, peer_map[nid])
        assert e["CANOPY_ADVERTISE"] == peer_map[nid][0]
        assert e["CANOPY_LISTEN"].endswith(":" + port)
        assert e.get("CANOPY_RACK") == peer_map[nid][1]
    # a tree of four brokers: leader, two children, a grandchild
    assert {e["CANOPY_FANOUT"] for e in envs.values()} == {"2"}


def test_a_data_volume_per_service(resolved):
    services = resolved["services"]
    mounts = {}
    for name, svc in services.items():
        data = [v for v in svc.get("volumes", []) if (v["target"] if isinstance(v, dict) else v.split(":")[1]) == "/data"]
        assert len(data) == 1, f"{name} has no /data volume"
        v = data[0]
        mounts[name] = v["source"] if isinstance(v, dict) else v.split(":")[0]
        assert svc["environment"]["CANOPY_DATA_DIR"] == "/data"
    assert len(set(mounts.values())) == 4, f"services share a data volume: {mounts}"
    assert set(mounts.values()) <= set(resolved.get("volumes", {}))


def test_services_build_canopy_and_run_serve(resolved):
    for name, svc in resolved["services"].items():
        assert Path(svc["build"]["context"]) == ROOT, name
        assert svc["command"] == ["canopy", "serve"], name
    assert (ROOT / "Dockerfile").is_file()
    ports = [p["published"] if isinstance(p, dict) else p.split(":")[0]
             for svc in resolved["services"].values() for p in svc.get("ports", [])]
    assert len(set(map(str, ports))) == len(ports) == 4
