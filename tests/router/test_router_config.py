"""Router config files and the `python -m builders.router` entry point."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from builders.errors import ConfigError
from builders.router.classes import RequestClass
from builders.router.config import load_config

YAML = """
port: 0
pools:
  fast: [http://127.0.0.1:8101, "http://127.0.0.1:8102/"]
  bulk: [http://127.0.0.1:8103]
class_pools:
  batch: bulk
  long_prefill: bulk
default_pool: fast
slow_client:
  stall_s: 0.2
"""


def test_yaml_config_loads_with_defaults(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(YAML)
    config = load_config(path)
    assert config.host == "127.0.0.1"
    assert config.pools["fast"] == ["http://127.0.0.1:8101", "http://127.0.0.1:8102"]
    assert config.pool_for(RequestClass.BATCH) == "bulk"
    assert config.pool_for(RequestClass.RAG) == "fast"
    assert config.slow_client.stall_s == 0.2


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"pools": {"a": ["http://127.0.0.1:1"]}, "default_pool": "a", "stream_buffer": 1}, "stream_buffer_bytes"),
        ({"pools": {"a": ["http://127.0.0.1:1"]}}, "default_pool"),
        ({"pools": {"a": ["http://127.0.0.1:1"]}, "default_pool": "a", "class_pools": {"rag": "aa"}}, "unknown pool"),
        ({"pools": {"a": ["http://127.0.0.1:1"]}, "default_pool": "a", "class_pools": {"chat": "a"}}, "class_pools"),
        ({"pools": {"a": ["127.0.0.1:1"]}, "default_pool": "a"}, "base URL"),
        ({"pools": {"a": ["http://127.0.0.1:1/v1"]}, "default_pool": "a"}, "without /v1"),
        ({"pools": {"a": []}, "default_pool": "a"}, "no replicas"),
        (["not", "a", "mapping"], "mapping"),
    ],
)
def test_config_errors_say_what_and_where(tmp_path: Path, data: object, needle: str) -> None:
    path = tmp_path / "router.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert needle in err.value.message
    assert str(path) in err.value.message


def test_cli_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = tmp_path / "router.yaml"
    path.write_text(YAML)
    proc = subprocess.Popen(
        [sys.executable, "-m", "builders.router", "--config", str(path), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}" in line
        deadline = time.monotonic() + 10
        health = None
        while time.monotonic() < deadline:
            try:
                health = requests.get(f"http://127.0.0.1:{port}/health", timeout=2).json()
                break
            except requests.ConnectionError:
                time.sleep(0.1)
        assert health is not None and set(health["pools"]) == {"fast", "bulk"}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_bad_config_exits_with_config_error(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("pools: {a: [http://127.0.0.1:1]}\ndefault_pool: b\n")
    done = subprocess.run(
        [sys.executable, "-m", "builders.router", "--config", str(path)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == ConfigError.exit_code
    assert "default_pool 'b' is not a pool" in done.stderr
