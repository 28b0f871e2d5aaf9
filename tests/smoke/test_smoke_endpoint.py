"""`forge smoke --endpoint`: the six classes and their gates against a router stack the test started, not Forge;
and a dead URL fails in seconds."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from builders.cli import main
from builders.router import start_router
from builders.router.config import config_from_mapping
from builders.smoke.report import EndpointReport

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
from router_fakes import Behavior, FakeReplica, dead_url

ROOT = Path(__file__).resolve().parents[2]
KEY = "endpoint-test-key"
CLASSES = ("interactive", "rag", "agent", "long_prefill", "batch", "slow_stream")

PROFILE = {
    "description": "Two pools of fake replicas behind a router the test starts.",
    # ci's context: rag prompts (~350 tokens) stay under long_prefill_tokens, long_prefill ones (~800) above it.
    "model": {"max_model_len": 1024, "max_position_embeddings": 2048},
    "pools": {"fast": {"replicas": 2}, "bulk": {"replicas": 1}},
    "classes": {c: "fast" if c in ("interactive", "rag", "agent") else "bulk" for c in CLASSES},
    "router": {"long_prefill_tokens": 600, "batch_max_tokens": 64},
    "traffic": {
        "deadline_s": 20,
        "max_total_requests": 40,
        "request_timeout_s": 10,
        "interactive": {"count": 8, "concurrency": 2, "max_tokens": 8, "slo": {"max_error_rate": 0.0}},
        "rag": {"count": 3, "concurrency": 1, "max_tokens": 8, "slo": {"max_error_rate": 0.0}},
        "agent": {"count": 2, "concurrency": 1, "turns": 2, "max_tokens": 8, "slo": {"max_error_rate": 0.0}},
        "long_prefill": {"count": 2, "concurrency": 1, "max_tokens": 8, "slo": {"max_error_rate": 0.0}},
        "batch": {"count": 2, "concurrency": 1, "max_tokens": 64, "slo": {"max_error_rate": 0.0}},
        "slow_stream": {"count": 2, "concurrency": 1, "max_tokens": 8, "slo": {"max_error_rate": 0.0}},
    },
}


class Stack:
    """Fake replicas and a real router on a loop in a thread of their own: the stack Forge did not start."""

    def __init__(self, healthy_bulk: bool = True) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.healthy_bulk = healthy_bulk
        self.url = ""
        self.replicas: dict[str, list[FakeReplica]] = {}

    def __enter__(self) -> Stack:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(20)
        return self

    async def _start(self) -> None:
        behavior = Behavior(tokens=6, delay_s=0.005)
        self.replicas = {
            "fast": [await FakeReplica(behavior, name="tiny", models=("model-tiny",)).start() for _ in range(2)],
            "bulk": [
                await FakeReplica(
                    Behavior(tokens=6, fail_status=None if self.healthy_bulk else 500),
                    name="tiny",
                    models=("model-tiny",),
                ).start()
            ],
        }
        config = config_from_mapping(
            {
                "host": "127.0.0.1",
                "port": 0,
                "pools": {name: [r.url for r in rs] for name, rs in self.replicas.items()},
                "class_pools": PROFILE["classes"],
                "api_key": KEY,
                **PROFILE["router"],  # type: ignore[dict-item]
            },
            source="test",
        )
        self.router = await start_router(config)
        self.url = self.router.url

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            await self.router.stop()
            for replicas in self.replicas.values():
                for r in replicas:
                    await r.stop()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def profile_path(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "fakes.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    yield path


def endpoint_argv(url: str, profile: Path, report: Path, *extra: str) -> list[str]:
    return ["--root", str(ROOT), "smoke", "--endpoint", url, "--profile", str(profile), "--report", str(report), *extra]


def test_the_six_classes_pass_against_a_stack_forge_did_not_start_and_say_where_they_were_served(
    tmp_path: Path, profile_path: Path
) -> None:
    with Stack() as stack:
        rc = main(endpoint_argv(stack.url, profile_path, tmp_path / "r", "--api-key", KEY, "--model", "model-tiny"))
        served = {name: sum(r.completed for r in rs) for name, rs in stack.replicas.items()}
        fast_urls = {r.url for r in stack.replicas["fast"]}
    assert rc == 0
    path = next((tmp_path / "r").glob("smoke-endpoint-*.json"))
    report = json.loads(path.read_text())
    # The file reads back through its model unchanged.
    assert EndpointReport.read(path).as_json() == report
    assert report["gates"] == {"passed": True, "failures": []}
    classes = report["traffic"]["main"]["classes"]
    assert sorted(classes) == sorted(CLASSES)
    for name, row in classes.items():
        assert row["requests"] > 0 and row["errors"] == 0
        pools = {where.split("/", 1)[0] for where in row["served_where"]}
        assert pools == {PROFILE["classes"][name]}, f"{name} served by {row['served_where']}"  # type: ignore[index]
    interactive = {where.split("/", 1)[1] for where in classes["interactive"]["served_where"]}
    assert interactive == fast_urls, "both replicas of the fast pool are named"
    assert sum(sum(r["served_where"].values()) for r in classes.values()) == sum(served.values())
    assert set(report["endpoint_info"]["pools"]) == {"fast", "bulk"}


def test_a_failing_pool_fails_its_classes_gates_and_nothing_else(tmp_path: Path, profile_path: Path) -> None:
    with Stack(healthy_bulk=False) as stack:
        rc = main(endpoint_argv(stack.url, profile_path, tmp_path / "r", "--api-key", KEY, "--model", "model-tiny"))
    assert rc == 8
    report = json.loads(next((tmp_path / "r").glob("smoke-endpoint-*.json")).read_text())
    failed = sorted(f.split(":", 1)[0] for f in report["gates"]["failures"])
    assert failed == ["batch", "long_prefill", "slow_stream"]


def test_wrong_key_and_wrong_model_are_named_before_any_traffic(
    tmp_path: Path, profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Stack() as stack:
        assert main(endpoint_argv(stack.url, profile_path, tmp_path / "r", "--api-key", "nope")) == 8
        assert "refused the API key (HTTP 401" in capsys.readouterr().err
        assert main(endpoint_argv(stack.url, profile_path, tmp_path / "r", "--api-key", KEY)) == 8
        assert "does not serve model 'forge-tiny' (it lists model-tiny)" in capsys.readouterr().err
        sent = sum(len(r.requests) for rs in stack.replicas.values() for r in rs)
    assert sent == 0


def test_a_dead_endpoint_fails_in_seconds_with_a_clear_error(
    tmp_path: Path, profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = dead_url()
    started = time.monotonic()
    assert main(endpoint_argv(url, profile_path, tmp_path / "r")) == 8
    assert time.monotonic() - started < 5
    err = capsys.readouterr().err
    assert f"endpoint {url} cannot be reached: [Errno 111] Connection refused" in err


def test_endpoint_refuses_what_would_start_a_stack(profile_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--root", str(ROOT), "smoke", "forge/x:latest", "--endpoint", "http://127.0.0.1:9", "--check-kill-replica"]
    assert main(argv) == 2
    assert "IMAGE, --check-kill-replica cannot go with it" in capsys.readouterr().err
