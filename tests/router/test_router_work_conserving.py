"""Work-conserving routing over real sockets: bulk borrows an idle latency replica only, priorities are set."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from router_fakes import Behavior, FakeReplica, chat_body, router_config, run

from builders.errors import ConfigError
from builders.router import start_router
from builders.router.config import config_from_mapping


async def ask(session: aiohttp.ClientSession, url: str, request_class: str, words: int | None = None) -> str:
    headers = {"x-request-class": request_class}
    payload = chat_body() if words is None else chat_body(" ".join(["word"] * words))
    async with session.post(f"{url}/v1/chat/completions", json=payload, headers=headers) as resp:
        await resp.read()
        assert resp.status == 200
        return resp.headers["x-forge-pool"]


async def pools_chosen(sends: list[tuple[str, int]], **router: Any) -> list[str]:
    """Send (class, prompt words) requests 0.2 s apart to a latency and a bulk replica that each take 0.6 s to
    answer, with bulk spilling onto latency; the pool that answered each."""
    slow = Behavior(first_delay_s=0.6)
    latency = await FakeReplica(name="latency", behavior=slow).start()
    bulk = await FakeReplica(name="bulk", behavior=slow).start()
    config = router_config(
        {"interactive": [latency.url], "bulk": [bulk.url]},
        class_pools={"batch": "bulk", "long_prefill": "bulk"},
        default_pool="interactive",
        spill={"bulk": "interactive"},
        **router,
    )
    running = await start_router(config)
    try:
        async with aiohttp.ClientSession() as s:
            tasks = []
            for request_class, words in sends:
                tasks.append(asyncio.create_task(ask(s, running.url, request_class, words)))
                await asyncio.sleep(0.2)
            return list(await asyncio.gather(*tasks))
    finally:
        await running.stop()
        await latency.stop()
        await bulk.stop()


def test_bulk_spills_onto_the_latency_pool_only_while_it_is_idle_and_bulk_is_busy() -> None:
    # Bulk idle: the first stays on its own pool. Bulk busy, latency idle: the second borrows the latency
    # replica. Both busy: the third waits its turn on bulk rather than queueing on the latency replica.
    chosen = run(pools_chosen([("batch", 1), ("batch", 1), ("long_prefill", 1)]))
    assert chosen == ["bulk", "interactive", "bulk"]


def test_only_short_prompts_spill_when_a_prompt_bound_is_set() -> None:
    # Bulk busy and latency idle for the second and the third, but the second is ~500 estimated tokens:
    # it waits on bulk, and the short third borrows the idle latency replica.
    chosen = run(pools_chosen([("batch", 5), ("batch", 400), ("batch", 5)], spill_max_prompt_tokens=100))
    assert chosen == ["bulk", "bulk", "interactive"]


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
