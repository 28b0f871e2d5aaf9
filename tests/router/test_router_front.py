"""The router's front end (builders/router/front.py): which requests stay on the fast path, and that a hand-off
to aiohttp mid-connection, pipelining and bytes sent during a response all end in whole answers, in order.

Every other router test runs through the front end too; these pin what is specific to it, over raw sockets so
that connection reuse and pipelining are exactly what the test writes.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from router_fakes import Behavior, FakeReplica, chat_body, metric, router_config, run, sse_data

from builders.router import start_router


def post(body: dict[str, Any], *, extra_headers: bytes = b"") -> bytes:
    payload = json.dumps(body).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
        + extra_headers
        + b"Content-Length: "
        + str(len(payload)).encode()
        + b"\r\n\r\n"
        + payload
    )


GET_HEALTH = b"GET /health HTTP/1.1\r\nHost: r\r\n\r\n"


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response off a kept-alive connection: status, headers (lower-cased names), whole body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    else:
        body = await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split()[1]), headers, body


async def handoffs(url: str) -> dict[str, float]:
    """forge_router_handoffs_total by reason, read on a connection of its own (itself a hand-off)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n")
    _, _, body = await read_response(reader)
    writer.close()
    text = body.decode()
    reasons = ("another_request", "connection_handling", "request_headers", "large_body", "not_http", "pipelined")
    return {r: metric(text, f'forge_router_handoffs_total{{reason="{r}"}}') for r in reasons}


def assert_whole_stream(status: int, body: bytes, tokens: int) -> None:
    assert status == 200, body
    events = sse_data(body)
    assert events[-1] == "[DONE]" and len(events) == tokens + 1, events


def test_streamed_requests_reusing_a_connection_stay_on_the_fast_path() -> None:
    async def body() -> None:
        replica = await FakeReplica(Behavior(tokens=4)).start()
        router = await start_router(router_config({"p": [replica.url]}))
        try:
            host, port = router.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            for _ in range(3):
                writer.write(post(chat_body("hi", stream=True)))
                status, headers, answer = await read_response(reader)
                assert_whole_stream(status, answer, 4)
                assert headers["content-type"] == "text/event-stream" and headers["x-forge-pool"] == "p"
                assert "date" in headers
            writer.write(post(chat_body("hi")))
            status, headers, answer = await read_response(reader)
            assert status == 200 and json.loads(answer)["choices"][0]["message"]["content"].startswith("t0")
            writer.close()
            # Only the /metrics request that reads the counter went to aiohttp.
            assert await handoffs(router.url) == {
                "another_request": 1,
                "connection_handling": 0,
                "request_headers": 0,
                "large_body": 0,
                "not_http": 0,
                "pipelined": 0,
            }
            assert len(replica.requests) == 4
        finally:
            await router.stop()
            await replica.stop()

    run(body())


def test_a_connection_handed_to_aiohttp_midway_goes_on_serving() -> None:
    async def body() -> None:
        replica = await FakeReplica(Behavior(tokens=3)).start()
        router = await start_router(router_config({"p": [replica.url]}))
        try:
            host, port = router.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(post(chat_body("a", stream=True)))
            status, _, answer = await read_response(reader)
            assert_whole_stream(status, answer, 3)
            writer.write(GET_HEALTH)
            status, _, answer = await read_response(reader)
            assert status == 200 and json.loads(answer)["status"] == "ok", answer
            # The connection now belongs to aiohttp, which serves the next stream the same way.
            writer.write(post(chat_body("b", stream=True)))
            status, _, answer = await read_response(reader)
            assert_whole_stream(status, answer, 3)
            writer.close()
            counts = await handoffs(router.url)
            assert counts["another_request"] == 2 and counts["pipelined"] == 0
        finally:
            await router.stop()
            await replica.stop()

    run(body())


def test_pipelined_requests_are_answered_in_order() -> None:
    async def body() -> None:
        replica = await FakeReplica(Behavior(tokens=2)).start()
        router = await start_router(router_config({"p": [replica.url]}))
        try:
            host, port = router.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            # Two requests in one write: the front end hands both, unread, to aiohttp.
            writer.write(post(chat_body("first", stream=True)) + post(chat_body("second")))
            status, _, first = await read_response(reader)
            assert_whole_stream(status, first, 2)
            status, _, second = await read_response(reader)
            assert status == 200 and "choices" in json.loads(second)
            writer.close()
            assert (await handoffs(router.url))["pipelined"] == 1
            assert [r["messages"][0]["content"] for r in replica.requests] == ["first", "second"]
        finally:
            await router.stop()
            await replica.stop()

    run(body())


def test_a_request_sent_while_one_is_answered_waits_its_turn_on_the_fast_path() -> None:
    async def body() -> None:
        replica = await FakeReplica(Behavior(tokens=3, first_delay_s=0.3)).start()
        router = await start_router(router_config({"p": [replica.url]}))
        try:
            host, port = router.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(post(chat_body("first", stream=True)))
            await asyncio.sleep(0.1)
            # Sent while the first is still waiting on its replica: held, then served after it.
            writer.write(post(chat_body("second", stream=True)))
            for _ in range(2):
                status, _, answer = await read_response(reader)
                assert_whole_stream(status, answer, 3)
            writer.close()
            assert [r["messages"][0]["content"] for r in replica.requests] == ["first", "second"]
            counts = await handoffs(router.url)
            assert counts["pipelined"] == 0 and counts["another_request"] == 1
        finally:
            await router.stop()
            await replica.stop()

    run(body())


def test_requests_the_fast_path_does_not_take_are_answered_by_aiohttp() -> None:
    async def body() -> None:
        replica = await FakeReplica(Behavior(tokens=2)).start()
        router = await start_router(router_config({"p": [replica.url]}, offload_parse_bytes=4096))
        try:
            host, port = router.url.removeprefix("http://").split(":")
            cases = {
                "large_body": (post(chat_body("y" * 5000, stream=True)), b"HTTP/1.1 200 OK"),
                "request_headers": (
                    post(chat_body("x", stream=True), extra_headers=b"Expect: 100-continue\r\n"),
                    b"HTTP/1.1 100 Continue",
                ),
                "connection_handling": (
                    post(chat_body("x", stream=True)).replace(b"HTTP/1.1", b"HTTP/1.0", 1),
                    b"HTTP/1.0 200 OK",
                ),
                "not_http": (
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: x\r\n\r\n",
                    b"HTTP/1.0 400 Bad Request",
                ),
            }
            for reason, (request, answer) in cases.items():
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(request)
                head = await asyncio.wait_for(reader.read(65536), timeout=5)
                writer.close()
                assert head.startswith(answer), (reason, head)
                assert (await handoffs(router.url))[reason] == 1, reason
        finally:
            await router.stop()
            await replica.stop()

    run(body())


def test_the_idle_timeout_counts_from_the_last_response_not_from_connecting() -> None:
    async def body() -> None:
        # The answer takes longer than half the idle timeout: a deadline still counting from the connect
        # would close the connection soon after the answer, one counting from the answer keeps it open.
        replica = await FakeReplica(Behavior(first_delay_s=0.8)).start()
        router = await start_router(router_config({"p": [replica.url]}, idle_timeout_s=1.0))
        try:
            host, port = router.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(post(chat_body("hi")))
            status, _, _ = await read_response(reader)
            answered = asyncio.get_running_loop().time()
            assert status == 200
            # 0.6 s after the answer (1.4 s after connecting, past a connect-based deadline) it still serves.
            await asyncio.sleep(0.6)
            writer.write(GET_HEALTH)
            status, _, _ = await read_response(reader)
            assert status == 200
            writer.close()
            # A second connection left idle after its answer is closed by the fast path's deadline.
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(post(chat_body("again")))
            status, _, _ = await read_response(reader)
            answered = asyncio.get_running_loop().time()
            assert status == 200
            assert await asyncio.wait_for(reader.read(), timeout=5) == b""
            closed_after = asyncio.get_running_loop().time() - answered
            assert 0.9 <= closed_after < 3.0, closed_after
            writer.close()
        finally:
            await router.stop()
            await replica.stop()

    run(body(), timeout=30)
