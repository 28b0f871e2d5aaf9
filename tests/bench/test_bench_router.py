"""bench-router's own parts: the fake upstream, the load generator's checks, /proc CPU time, the report."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

import pytest
from bench_scripts import load_bench

from builders.router.native import NativeRelay

ROOT = Path(__file__).resolve().parents[2]


def short_run(tmp_path: Path, **settings: object) -> argparse.Namespace:
    """bench-router's arguments for a run of seconds on this machine's cores, nothing installed."""
    usable = sorted(os.sched_getaffinity(0))
    defaults: dict[str, object] = {
        "concurrency": 4,
        "rounds": 2,
        "router_cpu": usable[0],
        "client_cpu": usable[-1],
        "policy": "round_robin",
        "forge_ref": [],
        "routers_dir": str(tmp_path),
        "no_install": True,
        "start_timeout": 10.0,
    }
    return argparse.Namespace(**{**defaults, **settings})


def test_load_generator_counts_only_whole_streams() -> None:
    bench = load_bench("bench_router")

    async def body() -> None:
        events = [bench._chunk_event(i) for i in range(4)]
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: bench._UpstreamProtocol(events, 0.001), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        try:
            windows: list[bool] = []
            good = await bench._drive(
                url, concurrency=2, warmup_s=0.2, duration_s=0.5, chunks=4, on_window=windows.append
            )
            assert windows == [True, False]
            assert good.completed > 0 and good.failed == 0, good.errors
            assert all(0 < t < 0.5 for t in good.ttft_s)
            # A router that loses an event must show up as failures, never as a measured request.
            short = await bench._drive(
                url, concurrency=1, warmup_s=0.0, duration_s=0.3, chunks=5, on_window=lambda _opening: None
            )
            assert short.completed == 0 and short.failed > 0
            assert "got 5 SSE events, expected 6" in short.errors[0]
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(asyncio.wait_for(body(), 20))


def test_tree_cpu_time_grows_with_work_done() -> None:
    bench = load_bench("bench_router")
    cpu0, user0, sys0 = bench.tree_cpu_s(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    cpu1, user1, sys1 = bench.tree_cpu_s(os.getpid())
    # The exact clock counts the 0.3 s spun (and a little more); the tick samples roughly agree.
    assert 0.3 <= cpu1 - cpu0 < 0.6
    assert (user1 + sys1) - (user0 + sys0) >= 0.2


def test_direct_connection_is_measured_over_interleaved_rounds(tmp_path: Path) -> None:
    bench = load_bench("bench_router")
    args = short_run(tmp_path, only=["direct"], chunks=4, interval_ms=1.0, duration=1.0, warmup=0.3)
    rows = asyncio.run(asyncio.wait_for(bench.run(args), 30))
    assert [r.name for r in rows] == ["direct"]
    (direct,) = rows
    assert direct.measured and direct.failed == 0 and direct.cpu_ms_per_req is None
    # Two windows of 0.5 s: a request takes about 5 ms, so each of 4 streams completes dozens.
    assert direct.completed >= 40 and direct.req_s > 0


def test_report_names_what_was_not_measured_and_compares_in_one_run() -> None:
    bench = load_bench("bench_router")
    args = argparse.Namespace(
        concurrency=32,
        chunks=32,
        interval_ms=10.0,
        duration=10.0,
        rounds=4,
        warmup=3.0,
        router_cpu=0,
        client_cpu=1,
        policy="x",
    )
    rows = [
        bench.Row(name="direct", measured=True, req_s=100.0, ttft_p50_ms=1.0, ttft_p99_ms=2.0),
        bench.Row(
            name="forge",
            measured=True,
            req_s=99.0,
            ttft_p50_ms=1.5,
            ttft_p99_ms=4.0,
            cpu_ms_per_req=1.2,
            sys_ms_per_req=0.4,
        ),
        bench.Row(
            name="vllm-router",
            measured=True,
            req_s=100.0,
            ttft_p50_ms=1.2,
            ttft_p99_ms=2.5,
            cpu_ms_per_req=0.6,
            sys_ms_per_req=0.3,
        ),
        bench.Row(name="sglang-router", measured=False, note="`pip install` failed: no network"),
    ]
    text = bench.render(rows, args)
    assert "sglang-router  NOT MEASURED: `pip install` failed: no network" in text
    forge_line = next(line for line in text.splitlines() if line.startswith("forge "))
    assert "+0.50" in forge_line and "+2.00" in forge_line and "1.200" in forge_line
    assert "forge CPU/request ÷ vllm-router: 2.00x" in text
    # Nothing is compared with a router that was not measured.
    assert "÷ sglang-router" not in text


def test_forge_at_a_ref_runs_that_commit_s_router_and_an_unknown_ref_is_reported() -> None:
    bench = load_bench("bench_router")
    spec = bench.forge_at("HEAD")
    assert spec.name == "forge@HEAD" and spec.unavailable is None
    argv = spec.command("http://127.0.0.1:1", 2)
    # The exported tree, not this checkout, is first on the router's sys.path.
    code = argv[argv.index("-c") + 1]
    tree = Path(code.split("sys.path.insert(0, '", 1)[1].split("'", 1)[0])
    assert tree != bench.ROOT and (tree / "builders" / "router" / "__main__.py").is_file()
    assert argv[-2] == "--config" and '"port": 2' in Path(argv[-1]).read_text()
    missing = bench.forge_at("no-such-ref-anywhere")
    assert missing.command is None and missing.unavailable is not None
    assert "git archive no-such-ref-anywhere" in missing.unavailable


@pytest.mark.skipif(NativeRelay is None, reason="the C relay is not built in this checkout")
def test_forge_is_measured_with_each_relay_in_the_same_run(tmp_path: Path) -> None:
    bench = load_bench("bench_router")
    args = short_run(
        tmp_path,
        only=["forge", "forge-python"],
        chunks=8,
        interval_ms=2.0,
        duration=2.0,
        warmup=0.5,
        start_timeout=20.0,
    )
    rows = {r.name: r for r in asyncio.run(asyncio.wait_for(bench.run(args), 90))}
    native, python = rows["forge"], rows["forge-python"]
    # Each says which relay ran (from the router's own start-up line), so a ratio names what it compares.
    assert native.note.endswith("relay: native") and python.note.endswith("relay: python")
    for row in (native, python):
        assert row.measured and row.failed == 0 and row.completed > 0 and row.cpu_ms_per_req > 0
    assert "forge CPU/request ÷ forge-python" in bench.render(list(rows.values()), args)
