"""The `canopy serve` command line: options from flags, CANOPY_* variables and a TOML
file; one-line errors (no traceback) for a bad option, a busy port and a data directory
another broker holds; `python -m broker` is the same program."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from .conftest import CANOPY, free_port
from .rawclient import RawClient, create_topic, end_offset, make_batch, produce


def _run(args, env=None, timeout=30):
    return subprocess.run([str(CANOPY), *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def _one_line_error(proc, needle: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("canopy: ") and needle in lines[0], lines[0]


@pytest.mark.parametrize("args, needle", [
    (["serve", "--listen", "nope"], "HOST:PORT"),
    (["serve", "--listen", "127.0.0.1:99999"], "out of range"),
    (["serve", "--node-id", "x"], "invalid int value"),
    (["serve", "--flush", "sometimes"], "invalid choice"),
    (["serve", "--no-such-option"], "unrecognized arguments"),
    (["serve", "--config", "/nonexistent/canopy.toml"], "not found"),
])
def test_bad_option_is_one_line(tmp_path, args, needle):
    _one_line_error(_run([*args, "--data-dir", str(tmp_path / "d")] if "--data-dir" not in args else args), needle)


def test_bad_environment_value_is_one_line(tmp_path):
    _one_line_error(_run(["serve", "--data-dir", str(tmp_path)], env={"CANOPY_NODE_ID": "seven"}), "CANOPY_NODE_ID")


def test_bad_config_file_is_one_line(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('listen = "127.0.0.1:1"\nno_such_key = 3\n')
    _one_line_error(_run(["serve", "--config", str(cfg), "--data-dir", str(tmp_path / "d")]), "unknown option")
    cfg.write_text("this is [not toml\n")
    _one_line_error(_run(["serve", "--config", str(cfg), "--data-dir", str(tmp_path / "d")]), str(cfg))


def test_busy_port_is_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        _one_line_error(_run(["serve", "--data-dir", str(tmp_path), "--listen", f"127.0.0.1:{port}"]),
                        "address already in use")


def test_data_dir_held_by_another_broker_is_one_line(broker):
    proc = _run(["serve", "--data-dir", str(broker.data_dir), "--listen", f"127.0.0.1:{free_port()}"])
    _one_line_error(proc, "in use by another broker")
    assert broker.proc.poll() is None


def _serves(bootstrap: str) -> None:
    c = RawClient(bootstrap)
    try:
        create_topic(c, "cli")
        assert produce(c, "cli", make_batch([b"hello"]))["error_code"] == 0
        assert end_offset(c, "cli") == 1
    finally:
        c.close()


def test_options_from_environment(tmp_path):
    port = free_port()
    data_dir = tmp_path / "envdata"
    env = dict(os.environ, CANOPY_LISTEN=f"127.0.0.1:{port}", CANOPY_NODE_ID="7",
               CANOPY_DATA_DIR=str(data_dir), CANOPY_FLUSH="interval")
    proc = subprocess.Popen([str(CANOPY), "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_port(port, proc)
        _serves(f"127.0.0.1:{port}")
        c = RawClient(f"127.0.0.1:{port}")
        md = c.request(3, 12, {"topics": None})
        c.close()
        assert md["brokers"][0]["node_id"] == 7
        assert (data_dir / "topics" / "cli").is_dir()
    finally:
        proc.terminate()
        out = proc.communicate(timeout=10)[0].decode()
    assert "flush=interval" in out


def test_options_from_toml_and_flags_win(tmp_path):
    port, other = free_port(), free_port()
    cfg = tmp_path / "canopy.toml"
    cfg.write_text(f'listen = "127.0.0.1:{other}"\nnode_id = 3\ndata-dir = "{tmp_path / "tomldata"}"\n'
                   f'advertise = "localhost:{port}"\n')
    proc = subprocess.Popen([str(CANOPY), "serve", "--config", str(cfg), "--listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_port(port, proc)
        c = RawClient(f"127.0.0.1:{port}")
        md = c.request(3, 12, {"topics": None})
        c.close()
        assert md["brokers"][0]["node_id"] == 3
        assert (md["brokers"][0]["host"], md["brokers"][0]["port"]) == ("localhost", port)
        assert (tmp_path / "tomldata").is_dir()
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def test_python_dash_m_broker(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "broker", "serve", "--data-dir", str(tmp_path / "m"),
                             "--listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_port(port, proc)
        _serves(f"127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    assert proc.returncode == 0


def _wait_port(port: int, proc, timeout: float = 20.0) -> None:
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}: {proc.stdout.read().decode()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("did not listen")
