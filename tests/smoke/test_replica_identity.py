"""A replica port's /health is not proof that the replica answering is ours: another server held one once.

The servers here are real HTTP servers (the stand-in vLLM of fake_vllm.py, which keys /v1/* on VLLM_API_KEY and
lists its --served-model-name as vLLM does), each a process of its own on a free port.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from builders.engines.checks import free_port
from builders.errors import SmokeFailed
from builders.smoke.runtimes import LaunchedProcess
from builders.smoke.stack import not_our_replica, wait_healthy

FAKE = Path(__file__).resolve().parent / "fake_vllm.py"
OURS = "ours-secret"


def start(port: int, *, key: str | None, name: str, log: Path) -> LaunchedProcess:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"} | ({"VLLM_API_KEY": key} if key else {})
    handle = log.open("wb")
    process = subprocess.Popen(
        [sys.executable, str(FAKE), "serve", "m", "--port", str(port), "--served-model-name", name],
        env=env,
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return LaunchedProcess(process=process, name=log.stem, log_path=log, _log=handle)


def wait_up(url: str) -> None:
    for _ in range(100):
        try:
            if requests.get(f"{url}/health", timeout=0.5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} never came up")


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[LaunchedProcess]]:
    started: list[LaunchedProcess] = []
    yield started
    for server in started:
        server.stop()


@pytest.mark.parametrize(
    ("key", "name", "why"),
    [
        ("someone-elses", "forge-tiny", "/v1/models refused this run's API key (HTTP 401)"),
        (None, "their-model", "/v1/models serves their-model, not forge-tiny"),
        (OURS, "forge-tiny", None),
    ],
)
def test_only_a_server_with_our_key_and_our_model_is_ours(
    tmp_path: Path, servers: list[LaunchedProcess], key: str | None, name: str, why: str | None
) -> None:
    port = free_port()
    servers.append(start(port, key=key, name=name, log=tmp_path / "server.log"))
    url = f"http://127.0.0.1:{port}"
    wait_up(url)
    assert not_our_replica(url, api_key=OURS, model="forge-tiny") == why


def test_a_stranger_on_the_replica_port_is_never_counted_healthy(
    tmp_path: Path, servers: list[LaunchedProcess]
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    servers.append(start(port, key="someone-elses", name="forge-tiny", log=tmp_path / "stranger.log"))
    wait_up(url)
    # Ours, started on the same port, cannot bind and exits: the failure names both.
    ours = start(port, key=OURS, name="forge-tiny", log=tmp_path / "ours.log")
    servers.append(ours)
    with pytest.raises(SmokeFailed, match=r"exited before it answered .* not as ours: /v1/models refused"):
        wait_healthy(
            {"shared/0": (url, ours)},
            deadline_s=30,
            identify=lambda u: not_our_replica(u, api_key=OURS, model="forge-tiny"),
        )
    # Without the identity check, the stranger's /health passes for ours: the hole this closes.
    assert "shared/0" in wait_healthy({"shared/0": (url, ours)}, deadline_s=5)
