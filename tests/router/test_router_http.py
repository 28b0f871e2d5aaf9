"""The router over real loopback sockets against fake replicas: routing, errors, auth, health, metrics."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
from router_fakes import Behavior, FakeReplica, chat_body, dead_url, router_config, run, sse_data

from builders.router import start_router
from builders.router.classes import ALL_CLASSES


async def post(
    session: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    kwargs: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
    async with session.post(f"{url}/v1/chat/completions", headers=headers or {}, **kwargs) as resp:
        raw = await resp.read()
        payload: Any = raw
        if resp.content_type == "application/json":
            payload = await resp.json()
        return resp.status, dict(resp.headers), payload


def test_routes_by_class_to_its_pool_with_forge_headers() -> None:
    async def body() -> None:
        fast, slow = await FakeReplica(name="fast").start(), await FakeReplica(name="slow").start()
        config = router_config(
            {"fast": [fast.url], "slow": [slow.url]},
            class_pools={"slow_stream": "slow", "batch": "slow"},
            default_pool="fast",
            batch_max_tokens=100,
        )
        router = await start_router(config)
        try:
            async with aiohttp.ClientSession() as s:
                status, headers, payload = await post(s, router.url, chat_body("hi"))
                assert status == 200
                assert payload["choices"][0]["message"]["content"].startswith("t0 ")
                assert headers["x-forge-class"] == "interactive"
                assert headers["x-forge-pool"] == "fast"
                assert headers["x-forge-replica"] == fast.url

                status, headers, _ = await post(s, router.url, chat_body("sum", max_tokens=200))
                assert (status, headers["x-forge-class"], headers["x-forge-pool"]) == (200, "batch", "slow")

                status, headers, raw = await post(s, router.url, chat_body("hi", stream=True), {"x-client-slow": "1"})
                assert (status, headers["x-forge-class"], headers["x-forge-pool"]) == (200, "slow_stream", "slow")
                assert headers["Content-Type"].startswith("text/event-stream")
                events = sse_data(raw)
                assert events[-1] == "[DONE]" and len(events) == 6
            assert len(fast.requests) == 1 and len(slow.requests) == 2
            # The client's body reaches the replica unchanged.
            assert slow.requests[0]["max_tokens"] == 200
        finally:
            await router.stop()
            await fast.stop()
            await slow.stop()

    run(body())


def test_bad_requests_name_the_field_or_header() -> None:
    async def body() -> None:
        replica = await FakeReplica().start()
        router = await start_router(router_config({"p": [replica.url]}))
        try:
            async with aiohttp.ClientSession() as s:
                cases: list[tuple[Any, dict[str, str], str]] = [
                    (b"{oops", {}, "body"),
                    ({"messages": "hello"}, {}, "messages"),
                    (chat_body("x", max_tokens="many"), {}, "max_tokens"),
                    ({**chat_body("x"), "stream": "yes"}, {}, "stream"),
                    (chat_body("x"), {"x-request-class": "vip"}, "x-request-class"),
                ]
                for payload, headers, param in cases:
                    status, _, error = await post(s, router.url, payload, headers)
                    assert status == 400, param
                    assert error["error"]["param"] == param
                    assert param in error["error"]["message"] or param == "body"
            assert replica.requests == []
        finally:
            await router.stop()
            await replica.stop()

    run(body())


def test_api_key_guards_v1_but_not_health_or_metrics() -> None:
    async def body() -> None:
        replica = await FakeReplica().start()
        router = await start_router(router_config({"p": [replica.url]}, api_key="sesame"))
        try:
            async with aiohttp.ClientSession() as s:
                for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"}):
                    status, _, error = await post(s, router.url, chat_body("x"), headers)
                    assert status == 401
                    assert error["error"]["type"] == "authentication_error"
                async with s.get(f"{router.url}/v1/models") as resp:
                    assert resp.status == 401
                status, _, _ = await post(s, router.url, chat_body("x"), {"Authorization": "Bearer sesame"})
                assert status == 200
                for path in ("/health", "/metrics"):
                    async with s.get(f"{router.url}{path}") as resp:
                        assert resp.status == 200, path
            # The client's key is the router's, never forwarded to replicas.
            assert "Authorization" not in replica.headers[0]
        finally:
            await router.stop()
            await replica.stop()

    run(body())


def test_models_union_and_health_json() -> None:
    async def body() -> None:
        a, b = await FakeReplica(name="a").start(), await FakeReplica(name="b").start()
        down = dead_url()
        router = await start_router(router_config({"pa": [down, a.url], "pb": [b.url]}))
        try:
            await router.router.health.check_all()
            async with aiohttp.ClientSession() as s:
                async with s.get(f"{router.url}/v1/models") as resp:
                    assert resp.status == 200
                    ids = sorted(m["id"] for m in (await resp.json())["data"])
                # "m" is served by both pools and listed once.
                assert ids == ["m", "model-a", "model-b"]
                async with s.get(f"{router.url}/health") as resp:
                    health = await resp.json()
            assert health["status"] == "ok"
            by_url = {r["url"]: r for r in health["pools"]["pa"]}
            assert by_url[down]["healthy"] is False and "GET /health failed" in by_url[down]["last_error"]
            assert by_url[a.url]["healthy"] is True
        finally:
            await router.stop()
            await a.stop()
            await b.stop()

    run(body())


def test_503_at_once_when_nothing_can_serve() -> None:
    async def body() -> None:
        router = await start_router(
            router_config({"p": [dead_url(), dead_url()]}, class_pools={"batch": "p"}, first_byte_timeout_s=30)
        )
        try:
            async with aiohttp.ClientSession() as s:
                for _ in range(2):
                    began = time.monotonic()
                    status, headers, error = await post(s, router.url, chat_body("x"))
                    assert time.monotonic() - began < 2.0
                    assert status == 503
                    assert error["error"]["class"] == "interactive" and error["error"]["pool"] == "p"
                    assert error["error"]["type"] == "no_replica_available"
                    assert headers["x-forge-pool"] == "p"
                # Streaming requests get the same JSON answer, not a hanging stream.
                status, _, error = await post(s, router.url, chat_body("x", stream=True))
                assert status == 503 and error["error"]["pool"] == "p"
            errors = router.router.metrics.errors
            assert errors.value({"class": "interactive", "pool": "p", "kind": "no_replica_available"}) == 3
        finally:
            await router.stop()

    run(body())


def test_unhealthy_replica_is_skipped_after_health_check() -> None:
    async def body() -> None:
        sick = await FakeReplica(Behavior(health_status=503), name="sick").start()
        well = await FakeReplica(name="well").start()
        router = await start_router(router_config({"p": [sick.url, well.url]}))
        try:
            await router.router.health.check_all()
            async with aiohttp.ClientSession() as s:
                for _ in range(3):
                    status, headers, _ = await post(s, router.url, chat_body("x"))
                    assert status == 200 and headers["x-forge-replica"] == well.url
            assert sick.requests == []
        finally:
            await router.stop()
            await sick.stop()
            await well.stop()

    run(body())


def test_failover_before_first_byte() -> None:
    async def body() -> None:
        gone = await FakeReplica(name="gone").start()
        failing = await FakeReplica(Behavior(fail_status=500), name="failing").start()
        good = await FakeReplica(name="good").start()
        router = await start_router(router_config({"p": [gone.url, failing.url, good.url]}, health_interval_s=600))
        try:
            await router.router.health.check_all()
            # Healthy at the last check, refusing connections now: only a request can find out.
            await gone.stop()
            async with aiohttp.ClientSession() as s:
                for stream in (False, True):
                    status, headers, _ = await post(s, router.url, chat_body("x", stream=stream))
                    assert status == 200 and headers["x-forge-replica"] == good.url
            assert len(failing.requests) == 2 and len(good.requests) == 2
            labels = {"class": "interactive", "pool": "p"}
            # First request: refused + 500; second: the refused one is already marked down.
            assert router.router.metrics.failovers.value(labels) == 3
            health = {r.url: r.healthy for r in router.router.pools["p"].replicas}
            assert health == {gone.url: False, failing.url: True, good.url: True}
        finally:
            await router.stop()
            await failing.stop()
            await good.stop()

    run(body())


def test_upstream_4xx_is_passed_through_without_failover() -> None:
    async def body() -> None:
        picky = await FakeReplica(Behavior(fail_status=400), name="picky").start()
        other = await FakeReplica(name="other").start()
        router = await start_router(router_config({"p": [picky.url, other.url]}))
        try:
            async with aiohttp.ClientSession() as s:
                status, headers, error = await post(s, router.url, chat_body("x", stream=True))
            assert status == 400 and error["error"]["message"] == "fake failure"
            assert headers["x-forge-replica"] == picky.url
            assert other.requests == []
        finally:
            await router.stop()
            await picky.stop()
            await other.stop()

    run(body())


def test_prefix_affinity_until_the_replica_is_much_busier() -> None:
    async def body() -> None:
        a = await FakeReplica(name="a").start()
        b = await FakeReplica(name="b").start()
        router = await start_router(
            router_config({"p": [a.url, b.url]}, prefix_chars=32, affinity_max_extra_in_flight=1)
        )
        doc = "alpha beta gamma delta epsilon zeta eta theta " * 2

        def ask(question: str) -> dict[str, Any]:
            return chat_body(doc + question)

        try:
            async with aiohttp.ClientSession() as s:
                _, h1, _ = await post(s, router.url, ask("one?"))
                assert h1["x-forge-replica"] == a.url
                # Without affinity the tie-break (fewest served) would pick b now.
                _, h2, _ = await post(s, router.url, ask("two?"))
                assert h2["x-forge-replica"] == a.url and h2["x-forge-class"] == "rag"
                _, other, _ = await post(s, router.url, chat_body("z" * 80))
                assert other["x-forge-replica"] == b.url

                # a now answers slowly, so requests pile up on it while b stays idle.
                a.behavior = Behavior(first_delay_s=1.0)
                replica_a = router.router.pools["p"].replicas[0]
                first = asyncio.create_task(post(s, router.url, ask("three?")))
                second = asyncio.create_task(post(s, router.url, ask("four?")))
                for _ in range(100):
                    if replica_a.in_flight == 2:
                        break
                    await asyncio.sleep(0.01)
                # a now has 2 in flight, b none: more than 1 above the least loaded, so b serves.
                _, h5, _ = await post(s, router.url, ask("five?"))
                assert h5["x-forge-replica"] == b.url
                results = await asyncio.gather(first, second)
                assert [r[1]["x-forge-replica"] for r in results] == [a.url, a.url]
        finally:
            await router.stop()
            await a.stop()
            await b.stop()

    run(body())


def test_metrics_have_per_class_series() -> None:
    async def body() -> None:
        replica = await FakeReplica().start()
        router = await start_router(router_config({"p": [replica.url]}))
        try:
            async with aiohttp.ClientSession() as s:
                await post(s, router.url, chat_body("x", stream=True))
                await post(s, router.url, chat_body("x"), {"x-request-class": "agent"})
                async with s.get(f"{router.url}/metrics") as resp:
                    assert resp.headers["Content-Type"].startswith("text/plain")
                    text = await resp.text()
            for request_class in ALL_CLASSES:
                name = request_class.value
                assert f'forge_router_ttft_seconds_count{{class="{name}"}}' in text
                assert f'forge_router_in_flight{{class="{name}"}} 0' in text
            samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
            assert samples['forge_router_requests_total{class="interactive",pool="p"}'] == "1"
            assert samples['forge_router_requests_total{class="agent",pool="p"}'] == "1"
            assert samples['forge_router_e2e_seconds_count{class="agent"}'] == "1"
            # 5 token events and [DONE]: 5 gaps after the first event.
            assert samples['forge_router_itl_seconds_count{class="interactive"}'] == "5"
            assert samples['forge_router_itl_seconds_bucket{class="interactive",le="+Inf"}'] == "5"
            assert samples[f'forge_router_replica_healthy{{pool="p",replica="{replica.url}"}}'] == "1"
        finally:
            await router.stop()
            await replica.stop()

    run(body())
