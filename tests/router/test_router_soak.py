"""A short soak of the real router process: thousands of mixed requests, then RSS, fds and in-flight counts.

Kept to a few thousand requests so it runs in CI in well under a minute on 2 cores. A leak of one fd,
one in-flight count or a few KiB per request shows up as hundreds.

File descriptors are not compared with a guessed tolerance: how many connections the upstream keep-alive
pools hold after a burst depends on how many requests overlapped, which a busy host raises. The router
says what its pools and clients hold (/metrics), every fd beyond its idle baseline must be one of those,
and once the pools' idle timeout has passed with no traffic the count must come back to the baseline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from router_fakes import (
    Behavior,
    FakeReplica,
    RouterProcess,
    chat_body,
    metric,
    process_config,
    run,
    start_router_process,
)

MiB = 1024 * 1024
IDLE_S = 2.0
"""The pools' idle timeout here: short, so the return to baseline is seen within the test."""
CONCURRENCY = 24
SLACK_FDS = CONCURRENCY
"""fds beyond what the router's own counts explain, allowed while load runs: sockets that exist but are in no
count yet, or no longer. The loop accepts a client's connection (or opens one to a replica) a callback before
the protocol's connection_made runs and is counted; under asyncio (not uvloop) a closed aiohttp connection
leaves its pool's count at once and its socket one turn of the loop later. Either is a socket of a request
in progress, and this test has at most CONCURRENCY of those at once (its request slots). Seen with both
cores loaded: up to 4. A leak of one fd per request would pass it within the first hundred requests, and
the return to the exact baseline after the idle timeout catches any leak however small."""
CLASSES = ("interactive", "rag", "long_prefill", "batch", "agent", "slow_stream")


async def unary(s: aiohttp.ClientSession, url: str) -> str:
    async with s.post(f"{url}/v1/chat/completions", json=chat_body("hi")) as resp:
        await resp.read()
        assert resp.status == 200
    return "unary"


async def stream(s: aiohttp.ClientSession, url: str) -> str:
    async with s.post(f"{url}/v1/chat/completions", json=chat_body("hi", stream=True)) as resp:
        raw = await resp.read()
        assert resp.status == 200 and raw.endswith(b"data: [DONE]\n\n")
    return "stream"


async def bad(s: aiohttp.ClientSession, url: str) -> str:
    async with s.post(f"{url}/v1/chat/completions", data=b'{"messages": "no"}') as resp:
        assert resp.status == 400
    return "bad"


async def abort_stream(_s: aiohttp.ClientSession, url: str) -> str:
    # A session of its own, closed at once: the router sees the client vanish mid-stream.
    headers = {"x-request-class": "agent"}
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{url}/v1/chat/completions", json=chat_body("hi", stream=True), headers=headers) as resp,
    ):
        await resp.content.readany()
    return "abort_stream"


async def abort_waiting(s: aiohttp.ClientSession, url: str, delayed: FakeReplica, tag: str) -> str:
    """Leave once the request is known to wait on the replica, so the router has an upstream request to abort
    (leaving on a client timeout instead could, on a loaded box, leave before the router routed it)."""
    headers = {"x-request-class": "batch"}
    task = asyncio.create_task(s.post(f"{url}/v1/chat/completions", json=chat_body("hi", user=tag), headers=headers))
    deadline = time.monotonic() + 20
    while not any(r.get("user") == tag for r in delayed.requests):
        assert not task.done() and time.monotonic() < deadline, "the request never reached the delayed replica"
        await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return "abort_waiting"


async def slow_reader(_s: aiohttp.ClientSession, url: str) -> str:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, (host, int(port)))
        payload = json.dumps(chat_body("hi", stream=True)).encode()
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nx-request-class: slow_stream\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        )
        await loop.sock_sendall(sock, head.encode() + payload)
        received = b""
        while not received.endswith(b"0\r\n\r\n"):
            await asyncio.sleep(0.005)
            chunk = await asyncio.wait_for(loop.sock_recv(sock, 2048), timeout=10)
            assert chunk, received[-200:]
            received += chunk
        assert b"data: [DONE]" in received
    finally:
        sock.close()
    return "slow_reader"


MIX = [(unary, 40), (stream, 35), (bad, 5), (abort_stream, 10), (abort_waiting, 5), (slow_reader, 5)]


async def drive(url: str, count: int, seed: int, delayed: FakeReplica) -> dict[str, int]:
    rng = random.Random(seed)
    kinds = rng.choices([k for k, _ in MIX], weights=[w for _, w in MIX], k=count)
    limit = asyncio.Semaphore(CONCURRENCY)
    done: dict[str, int] = {}

    async def one(i: int, kind: Any, s: aiohttp.ClientSession) -> None:
        async with limit:
            if kind is abort_waiting:
                name = await abort_waiting(s, url, delayed, f"{seed}-{i}")
            else:
                name = await kind(s, url)
        done[name] = done.get(name, 0) + 1

    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(one(i, kind, s) for i, kind in enumerate(kinds)))
    return done


async def scrape(router: RouterProcess) -> str:
    """GET /metrics on a connection the router closes itself (Connection: close), read to its end: once this
    returns the router's socket for it is closed, so it leaves nothing behind in a count of its fds."""
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n")
        raw = await asyncio.wait_for(reader.read(), timeout=20)
    finally:
        writer.close()
    head, _, text = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    return text.decode()


async def settled(router: RouterProcess, seconds: float = 15.0) -> str:
    """The /metrics page once nothing is in flight (or the last one seen when time runs out)."""
    deadline = time.monotonic() + seconds
    while True:
        text = await scrape(router)
        busy = sum(metric(text, f'forge_router_in_flight{{class="{c}"}}') for c in CLASSES)
        if (busy == 0 and metric(text, "forge_router_streams_active") == 0) or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.1)


async def pools_empty(router: RouterProcess, seconds: float) -> float:
    """Seconds until the router reports no open upstream connection; fails after `seconds`."""
    began = time.monotonic()
    while True:
        text = await scrape(router)
        if metric(text, "forge_router_upstream_connections_open") == 0:
            return time.monotonic() - began
        assert time.monotonic() - began < seconds, [line for line in text.splitlines() if "upstream_conn" in line]
        await asyncio.sleep(0.05)


@dataclass
class FdWatch:
    """fds the router reports while load runs, each set against what its own counts explain."""

    baseline: int
    peak_fds: int = 0
    peak_pool: int = 0
    peak_clients: int = 0
    worst_excess: int = -(10**9)
    samples: int = 0

    def take(self, text: str) -> None:
        fds = int(metric(text, "process_open_fds"))
        pool = int(metric(text, "forge_router_upstream_connections_open"))
        clients = int(metric(text, "forge_router_client_connections"))
        self.samples += 1
        self.peak_fds = max(self.peak_fds, fds)
        self.peak_pool = max(self.peak_pool, pool)
        self.peak_clients = max(self.peak_clients, clients)
        self.worst_excess = max(self.worst_excess, fds - (self.baseline + pool + clients))

    async def run(self, router: RouterProcess, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.take(await scrape(router))
            await asyncio.sleep(0.2)


def test_soak_returns_rss_fds_and_in_flight_to_baseline(tmp_path: Path) -> None:
    async def body() -> None:
        main = await FakeReplica(Behavior(tokens=6, pad_bytes=1024), name="main").start()
        # Long enough that no client that read the first event has the whole answer before it leaves.
        long = await FakeReplica(Behavior(tokens=500, delay_s=0.01), name="long").start()
        delayed = await FakeReplica(Behavior(first_delay_s=30.0), name="delayed").start()
        router = await start_router_process(
            tmp_path,
            process_config(
                {"main": [main.url], "long": [long.url], "delayed": [delayed.url]},
                class_pools={"agent": "long", "batch": "delayed"},
                default_pool="main",
                stream_buffer_bytes=32 * 1024,
                client_sndbuf_bytes=4096,
                slow_client={"enabled": False},
                # Health is not under test here: the fakes share this busy loop, and a late /health
                # would mark a replica down (and release its requests, as it should) mid-soak.
                health_interval_s=30,
                health_timeout_s=10,
                upstream_pool_idle_timeout_s=IDLE_S,
            ),
        )
        try:
            await drive(router.url, 400, seed=1, delayed=delayed)
            before = await settled(router)
            # The baseline: warmed up, nothing pooled, nobody connected.
            await pools_empty(router, IDLE_S + 10)
            rss, fds = router.rss_bytes(), router.fds()

            watch = FdWatch(baseline=fds)
            stop = asyncio.Event()
            watcher = asyncio.create_task(watch.run(router, stop))
            began = time.monotonic()
            try:
                done = await drive(router.url, 3000, seed=2, delayed=delayed)
            finally:
                stop.set()
                await watcher
            took = time.monotonic() - began
            after = await settled(router)
            watch.take(after)
            pooled = int(metric(after, "forge_router_upstream_connections_open"))
            idle_in = await pools_empty(router, IDLE_S + 10)
            fds_after = router.fds()
            returned = time.monotonic() + 10
            while fds_after != fds and time.monotonic() < returned:
                # A health check can open a connection between the scrape and the count: it expires too.
                await asyncio.sleep(0.1)
                fds_after = router.fds()
            print(f"soak: {sum(done.values())} requests in {took:.1f}s {done}")
            print(f"soak: rss {rss / MiB:.1f} -> {router.rss_bytes() / MiB:.1f} MiB")
            print(
                f"soak-fds: baseline={fds} peak={watch.peak_fds} peak_pool={watch.peak_pool} "
                f"peak_clients={watch.peak_clients} worst_excess={watch.worst_excess} samples={watch.samples} "
                f"pool_after_load={pooled} pools_empty_after={idle_in:.2f}s after_idle={fds_after}"
            )

            for request_class in CLASSES:
                assert metric(after, f'forge_router_in_flight{{class="{request_class}"}}') == 0, request_class
            assert metric(after, "forge_router_streams_active") == 0
            async with aiohttp.ClientSession() as s, s.get(f"{router.url}/health") as resp:
                health = await resp.json()
            assert all(r["in_flight"] == 0 for pool in health["pools"].values() for r in pool)
            # Every abort is counted exactly once, and nothing else in these classes was aborted.
            for request_class, pool, kind in (("agent", "long", "abort_stream"), ("batch", "delayed", "abort_waiting")):
                labels = f'class="{request_class}",pool="{pool}"'
                grew = metric(after, f"forge_router_upstream_aborts_total{{{labels}}}") - metric(
                    before, f"forge_router_upstream_aborts_total{{{labels}}}"
                )
                assert grew == done[kind], (kind, grew, done[kind])
            # Complete answers are not errors: only the aborts are.
            for request_class in ("interactive", "slow_stream"):
                labels = f'class="{request_class}",pool="main"'
                for kind in ("client_gone", "stream_cut", "upstream_died", "upstream_error"):
                    assert metric(after, f'forge_router_errors_total{{{labels},kind="{kind}"}}') == 0, kind
            # Every fd beyond the baseline was an upstream or client connection the router counted.
            assert watch.worst_excess <= SLACK_FDS, watch
            # Idle pooled connections close within the pools' idle timeout (its idle_s after the last request;
            # settled() already waited part of it), and then nothing is left above the baseline.
            assert idle_in <= IDLE_S + 1.0, idle_in
            assert fds_after == fds, (fds_after, fds)
            assert router.rss_bytes() - rss < 32 * MiB
            assert "Traceback" not in router.stderr()
        finally:
            await router.stop()
            for replica in (main, long, delayed):
                await replica.stop()

    # A ceiling for a hang, not a speed test: with both cores loaded the 3000 requests took up to 86 s, 12 s idle.
    run(body(), timeout=300)
