"""The generator's shapes, sent without class headers, classified by the real router by content."""

from __future__ import annotations

from traffic_fakes import FakeOpenAI, run

from builders.router import config_from_mapping, start_router
from builders.router.classes import RequestClass
from builders.traffic import TrafficPlan, run_traffic


def test_router_classifies_generated_traffic_by_content() -> None:
    async def body() -> None:
        chat_a, chat_b, bulk = [await FakeOpenAI().start() for _ in range(3)]
        config = config_from_mapping(
            {
                "port": 0,
                "pools": {"chat": [chat_a.url, chat_b.url], "bulk": [bulk.url]},
                "class_pools": {"long_prefill": "bulk", "batch": "bulk"},
                "default_pool": "chat",
                # Between rag (~410 estimated tokens) and long_prefill (~1000) for max_model_len 1024.
                "long_prefill_tokens": 600,
                "batch_max_tokens": 100,
                "api_key": "secret",
            }
        )
        router = await start_router(config)
        try:
            plan = TrafficPlan.model_validate(
                {
                    "model": "tiny",
                    "max_model_len": 1024,
                    "deadline_s": 20,
                    "interactive": {"count": 3, "concurrency": 3},
                    "rag": {"count": 6, "documents": 2},
                    "long_prefill": {"count": 2},
                    "agent": {"count": 2, "turns": 2, "concurrency": 2},
                    "batch": {"count": 2, "max_tokens": 128},
                    "slow_stream": {"count": 2, "concurrency": 2, "read_delay_s": 0.001},
                }
            )
            result = await run_traffic(router.url, plan, api_key="secret")
        finally:
            await router.stop()
            for server in (chat_a, chat_b, bulk):
                await server.stop()
        assert not any(r.sent_class_header for r in result.records)
        routed = {c: s.routed_as for c, s in result.summaries.items()}
        assert routed == {
            RequestClass.INTERACTIVE: {"interactive": 3},
            # The first question on each document has no prefix seen before: it is interactive.
            RequestClass.RAG: {"interactive": 2, "rag": 4},
            RequestClass.LONG_PREFILL: {"long_prefill": 2},
            RequestClass.AGENT: {"agent": 4},
            RequestClass.BATCH: {"batch": 2},
            RequestClass.SLOW_STREAM: {"slow_stream": 2},
        }
        assert all(s.errors == 0 for s in result.summaries.values()), result.summary_json()
        served = {c: s.served_by for c, s in result.summaries.items()}
        assert served[RequestClass.BATCH] == {"bulk": 2} and served[RequestClass.LONG_PREFILL] == {"bulk": 2}
        assert served[RequestClass.AGENT] == {"chat": 4}
        pools = {(r.request_class, r.pool) for r in result.records}
        assert (RequestClass.LONG_PREFILL, "bulk") in pools and (RequestClass.BATCH, "bulk") in pools
        assert {p for c, p in pools if c not in (RequestClass.LONG_PREFILL, RequestClass.BATCH)} == {"chat"}
        # Affinity: every question on one document went to the replica that first served it.
        rag_replicas: dict[int, set[str | None]] = {}
        for r in result.records:
            if r.request_class is RequestClass.RAG:
                rag_replicas.setdefault(r.index % 2, set()).add(r.replica)
        assert all(len(replicas) == 1 for replicas in rag_replicas.values())
        assert len(bulk.received) == 4

    run(body())
