"""run_traffic against a fake OpenAI-compatible server over loopback: shapes on the wire, timing, bounds."""

from __future__ import annotations

import json
import socket
import time
from collections import Counter
from typing import Any

from aiohttp import web
from traffic_fakes import FakeOpenAI, run

from builders.router.classes import RequestClass
from builders.traffic import ClassSLO, TrafficPlan, run_traffic
from builders.traffic.runner import arrival_times


def plan_with(**classes: Any) -> TrafficPlan:
    return TrafficPlan.model_validate(
        {"model": "tiny", "max_model_len": 1024, "deadline_s": 20, "request_timeout_s": 10, **classes}
    )


def test_every_class_arrives_in_its_intended_shape() -> None:
    async def body() -> None:
        server = await FakeOpenAI().start()
        try:
            plan = plan_with(
                interactive={"count": 3, "concurrency": 2, "send_class_header": True},
                rag={"count": 4, "concurrency": 2, "documents": 2, "send_class_header": True},
                long_prefill={"count": 1, "send_class_header": True},
                agent={"count": 2, "concurrency": 2, "turns": 3, "send_class_header": True},
                batch={"count": 2, "max_tokens": 256, "send_class_header": True},
                slow_stream={"count": 1, "send_class_header": True},
            )
            result = await run_traffic(server.url, plan, api_key="k1")
        finally:
            await server.stop()
        assert result.stopped_by == "completed"
        assert {c: s.requests for c, s in result.summaries.items()} == {
            RequestClass.INTERACTIVE: 3,
            RequestClass.RAG: 4,
            RequestClass.LONG_PREFILL: 1,
            RequestClass.AGENT: 6,
            RequestClass.BATCH: 2,
            RequestClass.SLOW_STREAM: 1,
        }
        assert all(s.errors == 0 for s in result.summaries.values()), result.summary_json()
        assert all(r.headers["Authorization"] == "Bearer k1" for r in server.received)

        rag = server.by_class("rag")
        documents = Counter(r.body["messages"][0]["content"] for r in rag)
        assert sorted(documents.values()) == [2, 2] and all(len(doc) > 1000 for doc in documents)
        assert len({r.body["messages"][1]["content"] for r in rag}) == 4

        (long_prefill,) = server.by_class("long_prefill")
        assert long_prefill.path == "/v1/completions" and long_prefill.body["stream"] is True
        assert len(long_prefill.body["prompt"].split()) > 0.75 * (1024 - 16 - 64)

        batch = server.by_class("batch")
        assert all(not r.body["stream"] and r.body["max_tokens"] == 256 for r in batch)

        agent = server.by_class("agent")
        for conversation in {r.body["messages"][1]["content"] for r in agent}:
            turns = sorted(
                (r for r in agent if r.body["messages"][1]["content"] == conversation),
                key=lambda r: len(r.body["messages"]),
            )
            assert [len(t.body["messages"]) for t in turns] == [2, 4, 6]
            assert all(t.body["tools"] for t in turns)
            # The model's streamed reply of turn 1 became the assistant turn sent in turn 2.
            assert turns[1].body["messages"][2]["content"] == "w0 w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 "
            assert turns[2].body["messages"][5]["role"] == "tool"

        interactive = [r for r in result.records if r.request_class is RequestClass.INTERACTIVE]
        # 16 content chunks each; the role-only chunk that opens a chat stream is not content.
        assert all(r.output_chunks == 16 for r in interactive)
        assert all(r.sent_class_header for r in result.records)

    run(body())


def test_slow_stream_really_reads_slowly() -> None:
    async def body() -> None:
        server = await FakeOpenAI().start()
        try:
            plan = plan_with(
                interactive={"count": 1},
                slow_stream={"count": 1, "read_bytes": 32, "read_delay_s": 0.02},
            )
            result = await run_traffic(server.url, plan)
        finally:
            await server.stop()
        (slow,) = [r for r in result.records if r.request_class is RequestClass.SLOW_STREAM]
        (fast,) = [r for r in result.records if r.request_class is RequestClass.INTERACTIVE]
        assert slow.ok and fast.ok and slow.output_chunks == fast.output_chunks == 16
        # Each event is ~70 bytes: at 32 bytes a read every 20 ms, 17 events take well over 0.5 s.
        assert slow.e2e_s is not None and fast.e2e_s is not None
        assert slow.e2e_s > 0.5 and fast.e2e_s < slow.e2e_s / 3
        assert min(slow.itl_gaps_s) >= 0.02

    run(body())


def test_ttft_and_itl_reflect_server_timing() -> None:
    async def body() -> None:
        server = await FakeOpenAI(first_delay_s=0.2, token_delay_s=0.03, max_tokens_cap=6).start()
        try:
            result = await run_traffic(server.url, plan_with(interactive={"count": 2, "concurrency": 2}))
        finally:
            await server.stop()
        summary = result.summaries[RequestClass.INTERACTIVE]
        assert summary.ttft_ms.p50 is not None and 200 <= summary.ttft_ms.p50 < 1000
        assert summary.itl_ms.p50 is not None and 25 <= summary.itl_ms.p50 < 200
        assert summary.tpot_ms.p50 is not None and 25 <= summary.tpot_ms.p50 < 200

    run(body())


def test_run_stops_at_the_request_cap() -> None:
    async def body() -> None:
        server = await FakeOpenAI().start()
        try:
            plan = plan_with(interactive={"count": 50, "concurrency": 4}, max_total_requests=7)
            result = await run_traffic(server.url, plan)
        finally:
            await server.stop()
        assert result.stopped_by == "budget"
        assert len(result.records) == 7 == len(server.received)

    run(body())


def test_run_stops_at_the_deadline_and_cuts_in_flight_requests() -> None:
    async def body() -> None:
        server = await FakeOpenAI(first_delay_s=5.0).start()
        try:
            plan = plan_with(interactive={"count": 10, "concurrency": 2}, deadline_s=0.5)
            began = time.monotonic()
            result = await run_traffic(server.url, plan)
            assert time.monotonic() - began < 2.5
        finally:
            await server.stop()
        assert result.stopped_by == "deadline"
        assert len(result.records) == 2
        assert all("within" in (r.error or "") for r in result.records)
        assert not result.passed

    run(body())


def test_drain_lets_requests_in_flight_at_the_deadline_finish_and_sends_no_more() -> None:
    async def body() -> None:
        server = await FakeOpenAI(first_delay_s=1.0).start()
        try:
            plan = plan_with(interactive={"count": 10, "concurrency": 2}, deadline_s=0.5, drain_s=3.0)
            began = time.monotonic()
            result = await run_traffic(server.url, plan)
            took = time.monotonic() - began
        finally:
            await server.stop()
        # The two sent before the deadline answer after 1 s, inside the drain; nothing starts after it.
        assert result.stopped_by == "deadline" and 1.0 <= took < 2.5
        assert len(result.records) == 2 and all(r.ok for r in result.records), [r.error for r in result.records]

    run(body())


def test_gate_fails_for_a_class_the_server_refuses() -> None:
    async def body() -> None:
        server = await FakeOpenAI(fail_status_for={"batch": 503}).start()
        try:
            plan = plan_with(
                interactive={"count": 2, "send_class_header": True, "slo": ClassSLO(ttft_p99_ms=5000).model_dump()},
                batch={"count": 2, "max_tokens": 128, "send_class_header": True},
            )
            result = await run_traffic(server.url, plan)
        finally:
            await server.stop()
        summary = result.summary_json()
        assert summary["interactive"]["gate_passed"] is True and summary["interactive"]["goodput"] == 1.0
        assert summary["batch"]["gate_passed"] is False and summary["batch"]["errors"] == 2
        assert "HTTP 503" in str(summary["batch"]["error_samples"])
        assert not result.passed

    run(body())


def test_open_loop_arrivals_are_seeded_and_do_not_wait_for_answers() -> None:
    async def body() -> None:
        # Every answer takes 1 s: a closed loop at concurrency 1 would send 2 requests in 2 s, an open loop
        # at 10/s sends them all at their arrival times.
        server = await FakeOpenAI(first_delay_s=1.0, max_tokens_cap=2).start()
        try:
            plan = plan_with(interactive={"count": 8, "concurrency": 1, "rate_per_s": 10.0}, seed=3)
            result = await run_traffic(server.url, plan)
        finally:
            await server.stop()
        expected = arrival_times(3, RequestClass.INTERACTIVE, 10.0, 8)
        sent = sorted(r.sent_at_s for r in result.records)
        assert len(sent) == 8 and all(r.ok for r in result.records)
        assert all(abs(s - e) < 0.25 for s, e in zip(sent, expected, strict=True)), (sent, expected)
        assert sent[-1] < 1.0 + 0.25 * 8  # all sent before the first answers were back, not one by one

    run(body())
    assert arrival_times(3, RequestClass.INTERACTIVE, 10.0, 8) == arrival_times(3, RequestClass.INTERACTIVE, 10.0, 8)
    assert arrival_times(3, RequestClass.RAG, 10.0, 8) != arrival_times(3, RequestClass.INTERACTIVE, 10.0, 8)


def test_an_open_loop_whose_next_arrival_is_after_the_deadline_stops_at_the_deadline() -> None:
    """A sweep scaled far down (rates × 0.02 on a slow host) puts arrivals minutes apart: the run must end at
    its deadline, not sleep until an arrival it will never send (seen: a 20 s run outlived a 200 s bound)."""

    async def body() -> None:
        server = await FakeOpenAI(max_tokens_cap=2).start()
        try:
            plan = plan_with(interactive={"count": 8, "concurrency": 1, "rate_per_s": 0.01}, seed=3, deadline_s=1.0)
            started = time.monotonic()
            result = await run_traffic(server.url, plan)
            took = time.monotonic() - started
        finally:
            await server.stop()
        first = arrival_times(3, RequestClass.INTERACTIVE, 0.01, 8)[0]
        assert first > 5.0, first  # the seed's first arrival is well after the deadline
        assert took < 3.0, took
        assert result.stopped_by == "deadline" and not result.records

    run(body())


def _written_before_the_deadline(receive_buffer_bytes: int | None) -> int:
    """Bytes a server streaming a 4 MiB answer got written while one slow client read it for a second
    (about 50 KB read in that second, at 512 bytes every 10 ms)."""
    written = 0

    async def answer(request: web.Request) -> web.StreamResponse:
        nonlocal written
        # A small send buffer, as Forge's router sets for streaming clients (client_sndbuf_bytes): with the
        # autotuned default (up to 4 MiB) the server's own kernel would take in the whole answer.
        assert request.transport is not None
        request.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        event = b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "w" * 4000}}]}).encode()
        for _ in range(1024):
            await resp.write(event + b"\n\n")
            written += len(event) + 2
        return resp

    async def body() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", answer)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        slow = {"count": 1, "read_bytes": 512, "read_delay_s": 0.01, "receive_buffer_bytes": receive_buffer_bytes}
        plan = plan_with(interactive={"count": 0}, slow_stream=slow).model_copy(update={"deadline_s": 1.0})
        try:
            result = await run_traffic(f"http://127.0.0.1:{port}", plan)
        finally:
            await runner.cleanup()
        (record,) = result.records
        assert record.error is not None and "deadline" in record.error

    run(body())
    return written


def test_a_client_with_a_receive_window_makes_the_server_hold_its_answer() -> None:
    """receive_buffer_bytes is what makes a slow reader push back: without it aiohttp's buffer and the kernel's
    autotuned window take in much of the answer at once, and the server never notices the client is slow."""
    absorbing = _written_before_the_deadline(None)
    pushing_back = _written_before_the_deadline(4096)
    assert pushing_back < 256 * 1024 < absorbing
