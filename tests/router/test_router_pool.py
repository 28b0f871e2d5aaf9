"""The router's upstream keep-alive pools: /metrics counts what they hold, and idle connections close on time.

The counts are checked against the sockets the replica's own server sees, so a count read from the wrong
place (or from an aiohttp whose internals moved) fails here instead of reporting zero.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
from router_fakes import Behavior, FakeReplica, chat_body, metric, router_config, run

from builders.router import start_router

IDLE_S = 3.0
"""Long enough that no connection expires while the load that fills the pools is still running on a busy
host (aiohttp's keep theirs for at least half of it), short enough to wait out in a test."""


async def scrape(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as resp:
        return await resp.text()


def pooled(text: str, client: str, upstream: str, state: str) -> float:
    return metric(text, f'forge_router_upstream_connections{{client="{client}",upstream="{upstream}",state="{state}"}}')


async def load(url: str, streams: int, unary: int) -> None:
    """Requests that overlap, so each needs a connection of its own to the replica."""

    async def one(stream: bool, i: int) -> None:
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{url}/v1/chat/completions", json=chat_body(f"q{i}", stream=stream)) as resp,
        ):
            await resp.read()
            assert resp.status == 200

    await asyncio.gather(*(one(True, i) for i in range(streams)), *(one(False, i) for i in range(unary)))


def test_metrics_count_the_pooled_connections_the_replica_sees() -> None:
    async def body() -> None:
        replica = await FakeReplica(Behavior(tokens=20, delay_s=0.01)).start()
        # Health checked once, at start: its connection is then idle like the others.
        router = await start_router(router_config({"p": [replica.url]}, health_interval_s=60))
        upstream = replica.url.removeprefix("http://")
        try:
            await load(router.url, streams=4, unary=3)
            text = await scrape(router.url)
            assert pooled(text, "stream", upstream, "idle") == 4
            assert pooled(text, "unary", upstream, "idle") == 3
            assert pooled(text, "health", upstream, "idle") == 1
            assert metric(text, "forge_router_upstream_connections_open") == 8
            assert metric(text, "forge_router_upstream_pool_idle_timeout_seconds") == 30
            # The replica closes nothing on its own here: what the router counts is what is open.
            assert replica.open_connections() == 8
            assert metric(text, "process_open_fds") > 8
        finally:
            await router.stop()
            await replica.stop()

    run(body())


def test_idle_pooled_connections_close_within_the_idle_timeout() -> None:
    async def body() -> None:
        replica = await FakeReplica(Behavior(tokens=20, delay_s=0.01)).start()
        config = router_config({"p": [replica.url]}, health_interval_s=60, upstream_pool_idle_timeout_s=IDLE_S)
        router = await start_router(config)
        try:
            await load(router.url, streams=4, unary=3)
            ended = time.monotonic()
            text = await scrape(router.url)
            assert metric(text, "forge_router_upstream_connections_open") == replica.open_connections() >= 7
            assert metric(text, "forge_router_upstream_pool_idle_timeout_seconds") == IDLE_S
            while replica.open_connections() > 0:
                # The replica sees a close a moment after the router makes it; a loaded host adds a little more.
                assert time.monotonic() - ended < IDLE_S + 1.5, f"{replica.open_connections()} still open"
                await asyncio.sleep(0.02)
            text = await scrape(router.url)
            assert metric(text, "forge_router_upstream_connections_open") == 0
            # A request after the sweep opens a new connection: an expired one is never handed out.
            await load(router.url, streams=1, unary=1)
            assert replica.completed == 9
        finally:
            await router.stop()
            await replica.stop()

    run(body())


def test_a_connection_in_use_is_not_closed_by_the_idle_sweep() -> None:
    async def body() -> None:
        # Streams that each outlast the idle timeout; the second round's runs while the first round's
        # spare connections expire around it.
        replica = await FakeReplica(Behavior(tokens=8, delay_s=IDLE_S / 6)).start()
        config = router_config({"p": [replica.url]}, health_interval_s=60, upstream_pool_idle_timeout_s=IDLE_S)
        router = await start_router(config)
        try:
            await load(router.url, streams=3, unary=0)
            await load(router.url, streams=1, unary=0)
            assert replica.completed == 4 and replica.aborted == 0
        finally:
            await router.stop()
            await replica.stop()

    run(body())
