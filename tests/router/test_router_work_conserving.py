"""Work-conserving routing over real sockets: bulk borrows an idle latency replica only, priorities are set."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from router_fakes import Behavior, FakeReplica, chat_body, router_config, run

from builders.errors import ConfigError
from builders.router import start_router
from builders.router.config import config_from_mapping


async def ask(session: aiohttp.ClientSession, url: str, request_class: str) -> str:
    headers = {"x-request-class": request_class}
    async with session.post(f"{url}/v1/chat/completions", json=chat_body(), headers=headers) as resp:
        await resp.read()
        assert resp.status == 200
        return resp.headers["x-forge-pool"]


def test_bulk_spills_onto_the_latency_pool_only_while_it_is_idle_and_bulk_is_busy() -> None:
    async def body() -> None:
        slow = Behavior(first_delay_s=0.6)
        latency, bulk = (
            await FakeReplica(name="latency", behavior=slow).start(),
            await FakeReplica(name="bulk", behavior=slow).start(),
        )
        config = router_config(
            {"interactive": [latency.url], "bulk": [bulk.url]},
            class_pools={"batch": "bulk", "long_prefill": "bulk"},
            default_pool="interactive",
            spill={"bulk": "interactive"},
        )
        router = await start_router(config)
        try:
            async with aiohttp.ClientSession() as s:
                # Bulk idle: a bulk request stays on its own pool.
                first = asyncio.create_task(ask(s, router.url, "batch"))
                await asyncio.sleep(0.2)
                # Bulk busy, latency idle: the next one borrows the latency replica.
                second = asyncio.create_task(ask(s, router.url, "batch"))
                await asyncio.sleep(0.2)
                # Both busy: the third waits its turn on bulk rather than queueing on the latency replica.
                third = asyncio.create_task(ask(s, router.url, "long_prefill"))
                assert list(await asyncio.gather(first, second, third)) == ["bulk", "interactive", "bulk"]
        finally:
            await router.stop()
            await latency.stop()
            await bulk.stop()

    run(body())


def test_only_short_prompts_spill_when_a_prompt_bound_is_set() -> None:
    async def body() -> None:
        slow = Behavior(first_delay_s=0.6)
        latency, bulk = (
            await FakeReplica(name="latency", behavior=slow).start(),
            await FakeReplica(name="bulk", behavior=slow).start(),
        )
        config = router_config(
            {"interactive": [latency.url], "bulk": [bulk.url]},
            class_pools={"batch": "bulk", "long_prefill": "bulk"},
            default_pool="interactive",
            spill={"bulk": "interactive"},
            spill_max_prompt_tokens=100,
        )
        router = await start_router(config)

        async def send(s: aiohttp.ClientSession, words: int) -> str:
            payload = chat_body(" ".join(["word"] * words))
            headers = {"x-request-class": "batch"}
            async with s.post(f"{router.url}/v1/chat/completions", json=payload, headers=headers) as resp:
                assert resp.status == 200
                return resp.headers["x-forge-pool"]

        try:
            async with aiohttp.ClientSession() as s:
                first = asyncio.create_task(send(s, 5))
                await asyncio.sleep(0.2)
                # Bulk busy, latency idle, but ~500 estimated tokens: it waits on bulk.
                long = asyncio.create_task(send(s, 400))
                await asyncio.sleep(0.2)
                # A short prompt in the same situation borrows the idle latency replica.
                short = asyncio.create_task(send(s, 5))
                assert list(await asyncio.gather(first, long, short)) == ["bulk", "bulk", "interactive"]
        finally:
            await router.stop()
            await latency.stop()
            await bulk.stop()

    run(body())


def test_the_router_writes_each_classs_priority_into_the_request() -> None:
    async def body() -> None:
        replica = await FakeReplica().start()
        config = router_config(
            {"main": [replica.url]}, default_pool="main", class_priority={"interactive": 0, "batch": 4}
        )
        router = await start_router(config)
        try:
            async with aiohttp.ClientSession() as s:
                await ask(s, router.url, "interactive")
                await ask(s, router.url, "batch")
                await ask(s, router.url, "rag")
        finally:
            await router.stop()
            await replica.stop()
        assert [r.get("priority") for r in replica.requests] == [0, 4, None]
        assert all(r["messages"] == chat_body()["messages"] for r in replica.requests)

    run(body())


def test_a_spill_rule_naming_an_unknown_pool_is_refused_with_a_suggestion() -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_mapping(
            {
                "pools": {"interactive": ["http://127.0.0.1:1"], "bulk": ["http://127.0.0.1:2"]},
                "default_pool": "bulk",
                "spill": {"bulk": "interactiv"},
            },
            source="router.yaml",
        )
    assert "spill.bulk: unknown pool 'interactiv' (did you mean 'interactive'?)" in caught.value.message
