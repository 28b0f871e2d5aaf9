"""Several models behind one address: a pool's models come from its replicas' /v1/models (learnt again when a replica
comes back) or from the config, a request's model picks among the pools that serve it before its class does, and
a model no pool serves is a 404 naming those that are."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from router_fakes import Behavior, FakeReplica, chat_body, router_config, run

from builders.errors import ConfigError
from builders.router import RouterConfig, start_router
from builders.router.classes import RequestClass, ServiceClass
from builders.router.pool_choice import PoolChoice
from builders.router.replicas import Pool, Replica
from builders.router.served_models import ModelCatalog


def pools_of(**served: tuple[str, ...] | None) -> dict[str, Pool]:
    """Pools of one replica each, whose learnt models are `served` (None: not learnt yet)."""
    pools = {}
    for name, models in served.items():
        replica = Replica(pool=name, url=f"http://{name}:1", models=models)
        pools[name] = Pool(name=name, replicas=[replica], max_extra_in_flight=4, max_affinity_entries=10)
    return pools


def config(pools: dict[str, Pool], **overrides: Any) -> RouterConfig:
    return router_config({name: [p.replicas[0].url] for name, p in pools.items()}, **overrides)


def test_a_model_picks_its_pools_then_the_class_picks_among_them() -> None:
    pools = pools_of(fast=("chat",), bulk=("chat",), embed=("embedder",), starting=None)
    cfg = config(pools, default_pool="fast", class_pools={"batch": "bulk", "rag": "embed", "slow_stream": "starting"})
    choice = PoolChoice(cfg, pools, ModelCatalog(pools, cfg.models))
    # The class's own pool when it serves the model, else the first pool (config order) that does.
    assert choice.choose("chat", RequestClass.BATCH) is pools["bulk"]
    assert choice.choose("chat", RequestClass.INTERACTIVE) is pools["fast"]
    assert choice.choose("chat", RequestClass.RAG) is pools["fast"]
    assert choice.choose("embedder", RequestClass.INTERACTIVE) is pools["embed"]
    assert choice.choose("embedder", ServiceClass.EMBEDDINGS) is pools["embed"]
    # No model: the class decides, as before models were known; the non-generation ones go to default_pool.
    assert choice.choose(None, RequestClass.BATCH) is pools["bulk"]
    assert choice.choose(None, ServiceClass.TOKENIZE) is pools["fast"]
    # A pool not asked yet may serve any model: its own class still finds it (a router starting up routes as
    # before), and a model no known pool serves goes to it alone.
    assert choice.choose("chat", RequestClass.SLOW_STREAM) is pools["starting"]
    assert choice.choose("other", RequestClass.INTERACTIVE) is pools["starting"]
    pools["starting"].replicas[0].models = ("speech",)
    choice.catalog.rebuild()
    assert choice.choose("chat", RequestClass.SLOW_STREAM) is pools["fast"]
    assert choice.choose("other", RequestClass.INTERACTIVE) is None
    assert choice.catalog.served() == ["chat", "embedder", "speech"]
    assert choice.may_serve(pools["bulk"], "chat") and not choice.may_serve(pools["embed"], "chat")


def test_without_default_pool_the_non_generation_classes_follow_interactive() -> None:
    pools = pools_of(a=("m",), b=("m",))
    classes = {c.value: "b" for c in RequestClass}
    cfg = config(pools, default_pool=None, class_pools=classes)
    choice = PoolChoice(cfg, pools, ModelCatalog(pools, cfg.models))
    assert choice.home(ServiceClass.EMBEDDINGS) is pools["b"] and cfg.fallback_pool() == "b"


def test_configured_models_win_over_what_replicas_list_and_unknown_pools_are_named() -> None:
    with pytest.raises(ConfigError, match=r"models\.embd: unknown pool \(did you mean 'embed'\?\)"):
        router_config({"chat": ["http://127.0.0.1:1"], "embed": ["http://127.0.0.1:2"]}, models={"embd": ["e"]})
    with pytest.raises(ConfigError, match=r"models\.embed: list the model names"):
        router_config({"chat": ["http://127.0.0.1:1"], "embed": ["http://127.0.0.1:2"]}, models={"embed": []})

    async def body() -> None:
        replica = await FakeReplica().start()
        # The replica lists "m"; the config says its pool serves "named" only, and the router asks nobody.
        router = await start_router(router_config({"p": [replica.url]}, models={"p": ["named"]}))
        try:
            await router.router.health.check_all()
            assert router.router.pools["p"].replicas[0].models is None
            async with aiohttp.ClientSession() as s:
                async with s.post(f"{router.url}/v1/chat/completions", json=chat_body("x")) as resp:
                    assert resp.status == 404
                    error = (await resp.json())["error"]
                assert error["served_models"] == ["named"] and "'m' is not served" in error["message"]
                async with s.post(f"{router.url}/v1/chat/completions", json=chat_body("x", model="named")) as resp:
                    assert resp.status == 200
            assert router.router.metrics.rejected.value({"reason": "model_not_found"}) == 1
        finally:
            await router.stop()
            await replica.stop()

    run(body())


def test_a_replica_that_comes_back_serving_another_model_is_asked_again() -> None:
    async def body() -> None:
        behavior = Behavior()
        replica = await FakeReplica(behavior, models=("old",)).start()
        other = await FakeReplica(name="other", models=("m",)).start()
        router = await start_router(
            router_config(
                {"p": [replica.url], "q": [other.url]}, default_pool="q", health_interval_s=600, models_refresh_s=2.0
            )
        )
        health = router.router.health
        try:
            await health.check_all()
            async with aiohttp.ClientSession() as s:

                async def status(model: str) -> tuple[int, str | None]:
                    async with s.post(f"{router.url}/v1/chat/completions", json=chat_body("x", model=model)) as r:
                        return r.status, r.headers.get("x-forge-pool")

                assert await status("old") == (200, "p")
                # Down, then up again serving another model (a restart with new arguments).
                behavior.health_status = 503
                await health.check_all()
                replica.models = ("new",)
                behavior.health_status = 200
                await health.check_all()
                assert await status("new") == (200, "p")
                assert (await status("old"))[0] == 404
                # Healthy all along: asked again only once models_refresh_s has passed (a LoRA adapter loaded at run
                # time), not at every health check.
                other.models = ("m", "extra")
                await health.check_all()
                assert (await status("extra"))[0] == 404
                await asyncio.sleep(2.1)
                await health.check_all()
                assert await status("extra") == (200, "q")
        finally:
            await router.stop()
            await replica.stop()
            await other.stop()

    run(body())


def test_a_spill_never_sends_a_request_to_a_pool_that_does_not_serve_its_model() -> None:
    async def body() -> None:
        busy = await FakeReplica(Behavior(first_delay_s=0.5), name="busy", models=("chat",)).start()
        idle = await FakeReplica(name="idle", models=("embedder",)).start()
        router = await start_router(
            router_config({"chat": [busy.url], "embed": [idle.url]}, spill={"chat": "embed"}, health_interval_s=600)
        )
        try:
            await router.router.health.check_all()
            async with aiohttp.ClientSession() as s:

                async def send() -> str:
                    async with s.post(f"{router.url}/v1/chat/completions", json=chat_body("x", model="chat")) as r:
                        assert r.status == 200
                        return r.headers["x-forge-pool"]

                first = asyncio.create_task(send())
                await wait_busy(router.router.pools["chat"])
                # The chat pool is busy and the embed pool idle: the spill rule alone would move it there.
                assert await send() == "chat"
                assert await first == "chat"
            assert idle.requests == []
        finally:
            await router.stop()
            await busy.stop()
            await idle.stop()

    run(body())


async def wait_busy(pool: Pool) -> None:
    for _ in range(200):
        if any(r.in_flight for r in pool.replicas):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the first request never reached its replica")
