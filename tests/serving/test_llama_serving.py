"""llama.cpp's real llama-server behind the router: its loading 503, its SSE stream, usage and errors, and
`forge smoke --profile ci-llama`.

The server is the llama-cpp image Forge builds (smoke_helpers.llama_image(), once per session), or with
FORGE_LOCAL_LLAMA_SERVER set, a llama-server binary on this host (built from the same llama.cpp source).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests

from builders.container import connect
from builders.container.select import chosen
from builders.engines import serving_engine
from builders.router import start_router
from builders.router.config import config_from_mapping
from builders.smoke.plan import plan_stack
from builders.smoke.profile import profile_from_mapping
from builders.smoke.runtimes import ContainerReplicas, Launched, LocalReplicas, ReplicaRuntime
from builders.smoke.stack import _with_env

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "smoke"))
from smoke_helpers import ROOT, llama_image

pytestmark = [pytest.mark.server, pytest.mark.engine, pytest.mark.image("docker:llama-cpp")]

LLAMA = serving_engine("llama-cpp")
KEY = "upstream-key"
# This work's loopback range: other sessions on the machine use theirs.
PORTS = range(25500, 26000)


def free_base(count: int) -> int:
    for _ in range(50):
        base = random.randrange(PORTS.start, PORTS.stop - count - 1)
        try:
            for port in range(base, base + count + 1):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free loopback port range found")


def runtime(model_dir: Path, logs_dir: Path) -> tuple[ReplicaRuntime, list[str]]:
    """The llama-server to test and the `forge smoke` options that select the same one."""
    local = os.environ.get("FORGE_LOCAL_LLAMA_SERVER")
    if local:
        return LocalReplicas(Path(local), model_dir=model_dir, log_dir=logs_dir, serving=LLAMA), [
            "--local-llama-server",
            local,
        ]
    image = llama_image()
    return ContainerReplicas(connect(chosen()), image, model_dir=model_dir, serving=LLAMA), [
        "--llama-image",
        image,
    ]


TINY = {
    "model": {"max_model_len": 256, "max_position_embeddings": 1024, "hidden_size": 64, "num_hidden_layers": 2},
    "pools": {"pool": {"engine": "llama-cpp", "llama_cpp": {"slots": 2}}},
    "classes": {c: "pool" for c in ("interactive", "rag", "long_prefill", "agent", "batch", "slow_stream")},
}


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[tuple[str, Launched, list[int]]]:
    """One llama-server replica of a two-slot pool, started with the upstream key; yields its URL, its handle
    and the HTTP statuses its /health answered while it started."""
    profile = profile_from_mapping(TINY, source="test", name="tiny")
    plan = plan_stack(profile, run_id="llamatest", base_port=free_base(2))
    model_dir = tmp_path / "model"
    LLAMA.write_model(model_dir, profile, dtype="float32")
    for path in (tmp_path, model_dir, *model_dir.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    logs = tmp_path / "logs"
    logs.mkdir()
    server, _ = runtime(model_dir, logs)
    probe = server.probe(timeout_s=60)
    assert LLAMA.check(plan.pool_argvs(), probe) == []
    plan_replica = plan.replicas[0]
    launched = server.start(_with_env(plan_replica, LLAMA.api_key_env(KEY)), probe, run_id="llamatest")
    statuses: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                answer = requests.get(f"{plan_replica.url}/health", timeout=1)
                statuses.append(answer.status_code)
                if answer.status_code == 503:
                    # llama.cpp's own loading answer (tools/server/server-http.cpp, middleware_server_state).
                    assert answer.json()["error"]["message"] == "Loading model"
                if answer.status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert launched.alive(), launched.logs()
            time.sleep(0.05)
        assert statuses and statuses[-1] == 200, launched.logs()
        yield plan_replica.url, launched, statuses
    finally:
        launched.stop()
        server.sweep("llamatest")
        assert server.leftovers("llamatest") == []


def events(raw: bytes) -> list[str]:
    return [b[len("data: ") :] for b in raw.decode().split("\n\n") if b.startswith("data: ")]


def test_the_router_serves_a_real_llama_server(replica: tuple[str, Launched, list[int]]) -> None:
    url, _, _ = replica
    config = config_from_mapping(
        {
            "host": "127.0.0.1",
            "port": 0,
            "pools": {"pool": [url]},
            "default_pool": "pool",
            "upstream_api_key": KEY,
            "health_interval_s": 0.2,
        },
        source="test",
    )

    async def body() -> None:
        router = await start_router(config)
        try:
            async with aiohttp.ClientSession() as s:
                # The replica refuses a request without the key; through the router it needs none.
                async with s.get(f"{url}/v1/models") as resp:
                    assert resp.status == 401
                for _ in range(50):
                    async with s.get(f"{router.url}/health") as resp:
                        if resp.status == 200:
                            break
                    await asyncio.sleep(0.1)
                assert resp.status == 200

                chat = {
                    "model": "forge-tiny",
                    "messages": [{"role": "user", "content": "hello the world"}],
                    "max_tokens": 8,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                    "ignore_eos": True,
                }
                async with s.post(f"{router.url}/v1/chat/completions", json=chat) as resp:
                    assert resp.status == 200
                    assert resp.headers["Content-Type"].startswith("text/event-stream")
                    assert resp.headers["x-forge-replica"] == url
                    raw = await resp.read()
                stream = events(raw)
                assert stream[-1] == "[DONE]"
                chunks = [json.loads(e) for e in stream[:-1]]
                # The first chunk names the role and comes with the first token, as vLLM's does, so the
                # router's TTFT (first byte out) is the time to the first token for both engines.
                assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
                content = [c for c in chunks if c.get("choices") and c["choices"][0]["delta"].get("content")]
                assert 1 <= len(content) <= 8
                usage = next(c["usage"] for c in chunks if c.get("usage"))
                assert usage["completion_tokens"] == 8 and usage["prompt_tokens"] > 3

                # A prompt beyond a slot's context (256 tokens here) is llama-server's 400, passed on as is.
                long = {"model": "forge-tiny", "prompt": " the" * 600, "max_tokens": 4}
                async with s.post(f"{router.url}/v1/completions", json=long) as resp:
                    assert resp.status == 400
                    error = await resp.json()
                assert "context" in json.dumps(error).lower()

                async with s.get(f"{router.url}/metrics") as resp:
                    metrics = await resp.text()
                ttft = [line for line in metrics.splitlines() if line.startswith("forge_router_ttft_seconds_count")]
                assert any(float(line.rsplit(" ", 1)[1]) >= 1 for line in ttft), ttft
        finally:
            await router.stop()

    asyncio.run(asyncio.wait_for(body(), 60))


@pytest.mark.timeout(600)
def test_forge_smoke_passes_the_ci_llama_profile(tmp_path: Path) -> None:
    _, options = runtime(tmp_path, tmp_path)
    report_dir = tmp_path / "report"
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "builders.cli",
            "smoke",
            "--profile",
            "ci-llama",
            *options,
            "--base-port",
            str(free_base(3)),
            "--report",
            str(report_dir),
            "--check-kill-replica",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (path,) = report_dir.glob("smoke-ci-llama-*.json")
    report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    assert report["result"] == "passed"
    assert report["servers"]["llama-cpp"]["argument_problems"] == []
    assert report["teardown"]["clean"] is True
    assert report["checks"]["kill_replica"]["passed"] is True
    classes = report["traffic"]["main"]["classes"]
    assert set(classes) == {"interactive", "rag", "long_prefill", "agent", "batch", "slow_stream"}
    assert all(row["gate_passed"] for row in classes.values())
    print(f"forge smoke ci-llama: {time.monotonic() - started:.1f}s, phases {report['phases']}")
