"""The router's keys from the environment (how a Kubernetes Secret reaches it) replace the config file's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import requests


def test_keys_from_the_environment_replace_the_config_s(tmp_path: Path) -> None:
    # How a Kubernetes Secret reaches the router (builders/deploy renders it so): the config file holds no key.
    config = tmp_path / "router.json"
    config.write_text(
        json.dumps({"host": "127.0.0.1", "port": 0, "pools": {"p": ["http://127.0.0.1:9"]}, "default_pool": "p"})
    )
    env = {**os.environ, "FORGE_ROUTER_API_KEY": "from-secret"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "builders.router", "--config", str(config)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split("listening on ", 1)[1].strip()
        assert requests.get(f"{url}/v1/models", timeout=5).status_code == 401
        with_key = requests.get(f"{url}/v1/models", headers={"Authorization": "Bearer from-secret"}, timeout=5)
        assert with_key.status_code == 503  # admitted; its only replica is down
    finally:
        proc.kill()
        proc.wait()
    env["FORGE_ROUTER_API_KEY"] = "has a space"
    bad = subprocess.run(
        [sys.executable, "-m", "builders.router", "--config", str(config)], env=env, capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert f"{config} (and environment): api_key" in bad.stderr
