"""Client programs in other languages for the end-to-end tests: Go (sarama, kafka-go from
Debian's packages, built in GOPATH mode) and Node (kafkajs from npm). Each program prints
one JSON object per invocation; ``run`` returns it.

`make test` installs the toolchains and libraries (Makefile targets go-clients, kafkajs);
here they are only located and, for Go, compiled into build/go (git-ignored). Like
require_tool, a missing piece fails the test in CI.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from .conftest import ROOT, require_tool

GOPATH_SYSTEM = Path("/usr/share/gocode")       # where Debian's golang-*-dev put sources
GO_BUILD = ROOT / "build" / "go"
NODE_DIR = ROOT / "tests" / "node"


def go_env() -> dict:
    # Debian packages Go libraries as GOPATH sources, not modules; GOCACHE under build/
    # keeps rebuilds incremental and the home directory untouched.
    return dict(os.environ, GO111MODULE="off", GOPATH=str(GOPATH_SYSTEM),
                GOCACHE=str(GO_BUILD / "cache"), GOFLAGS="")


def build_go_program(name: str, library: str) -> Path:
    """Compile tests/go/<name> (importing the Debian package ``library``) and return the
    binary. Always rebuilt, so the test runs the source in the checkout."""
    go = require_tool("go", "Debian golang-go")
    require_tool(GOPATH_SYSTEM / "src" / library, f"Debian package providing {library}")
    out = GO_BUILD / "bin" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([go, "build", "-o", str(out), f"./tests/go/{name}"], cwd=ROOT,
                       env=go_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"go build {name} failed:\n{r.stderr}"
    return out


def kafkajs_script() -> list[str]:
    node = require_tool("node", "Node.js (Debian nodejs)")
    require_tool(NODE_DIR / "node_modules" / "kafkajs" / "package.json",
                 "kafkajs 2.2.4 from npm (make kafkajs)")
    return [node, str(NODE_DIR / "kafkajs-check.js")]


def run(cmd: list, timeout: float = 120, env: dict | None = None) -> dict:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    assert r.returncode == 0, f"{cmd[0]} exited {r.returncode}:\n{r.stdout}\n{r.stderr[-3000:]}"
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON from {cmd}:\n{r.stdout}\n{r.stderr[-3000:]}"
    return json.loads(lines[-1])
