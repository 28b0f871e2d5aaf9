"""Streaming through the router: failures after the first byte, bounded buffers, slow and vanished clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time

import aiohttp
import pytest
from router_fakes import Behavior, FakeReplica, chat_body, router_config, run, sse_data

from builders.router import start_router
from builders.router.front import FastStream

# Every promise here is kept by both relays: the C one where it is built, and Python's.
pytestmark = pytest.mark.usefixtures("each_relay")


async def read_stream(url: str, body: dict[str, object], headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{url}/v1/chat/completions", json=body, headers=headers or {}) as resp,
    ):
        return resp.status, await resp.read()


async def raw_request(url: str, body: dict[str, object], *, rcvbuf: int, headers: str = "") -> socket.socket:
    """Send a request on a socket with a tiny receive buffer and return it unread."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n{headers}\r\n"
    )
    await loop.sock_sendall(sock, head.encode() + payload)
    return sock


def test_failure_after_first_byte_ends_with_an_error_event() -> None:
    async def body() -> None:
        dying = await FakeReplica(Behavior(tokens=10, die_after=3), name="dying").start()
        spare = await FakeReplica(name="spare").start()
        router = await start_router(router_config({"p": [dying.url, spare.url]}))
        try:
            status, raw = await read_stream(router.url, chat_body("x", stream=True))
            assert status == 200
            events = sse_data(raw)
            contents = [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:3]]
            assert contents == ["t0 ", "t1 ", "t2 "]
            error = json.loads(events[3])["error"]
            assert error["type"] == "upstream_died" and error["replica"] == dying.url
            assert events[4:] == ["[DONE]"]
            # After the first byte there is no failover: the spare never saw the request.
            assert spare.requests == []
            errors = router.router.metrics.errors
            assert errors.value({"class": "interactive", "pool": "p", "kind": "upstream_died"}) == 1
        finally:
            await router.stop()
            await dying.stop()
            await spare.stop()

    run(body())


def test_silent_upstream_mid_stream_ends_with_an_error_event_not_a_hang() -> None:
    async def body() -> None:
        stalled = await FakeReplica(Behavior(tokens=3, delay_s=30)).start()
        router = await start_router(router_config({"p": [stalled.url]}, upstream_idle_timeout_s=0.3))
        try:
            began = time.monotonic()
            status, raw = await read_stream(router.url, chat_body("x", stream=True))
            assert time.monotonic() - began < 5
            events = sse_data(raw)
            assert status == 200 and len(events) == 3
            assert "sent nothing" in json.loads(events[1])["error"]["message"]
            assert events[2] == "[DONE]"
        finally:
            await router.stop()
            await stalled.stop()

    run(body())


def test_non_streamed_upstream_death_is_502() -> None:
    async def body() -> None:
        dying = await FakeReplica(Behavior(die_after=0)).start()
        router = await start_router(router_config({"p": [dying.url]}))
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.post(f"{router.url}/v1/chat/completions", json=chat_body("x")) as resp,
            ):
                assert resp.status == 502
                error = (await resp.json())["error"]
            assert error["type"] == "upstream_died" and error["class"] == "interactive"
        finally:
            await router.stop()
            await dying.stop()

    run(body())


def test_client_that_never_reads_is_cut_and_upstream_aborted_with_bounded_buffer() -> None:
    async def body() -> None:
        # An endless stream of 2 KiB chunks fills any buffer quickly.
        flood = await FakeReplica(Behavior(endless=True, pad_bytes=2048)).start()
        limit = 32 * 1024
        router = await start_router(
            router_config(
                {"p": [flood.url]},
                stream_buffer_bytes=limit,
                stream_cut_timeout_s=0.5,
                client_sndbuf_bytes=4096,
            )
        )
        sock = await raw_request(router.url, chat_body("x", stream=True), rcvbuf=4096, headers="x-client-id: c9\r\n")
        try:
            began = time.monotonic()
            await asyncio.wait_for(flood.abort_seen.wait(), timeout=10)
            assert time.monotonic() - began < 5
            metrics = router.router.metrics
            assert metrics.stream_cuts.value({"class": "interactive", "reason": "stalled"}) == 1
            assert metrics.upstream_aborts.value({"class": "interactive", "pool": "p"}) == 1
            assert 0 < router.router.stats.stream_buffer_peak <= limit
            assert router.router.stats.streams_active == 0
            assert flood.aborted == 1 and flood.completed == 0
            # The stall taught the router that this client reads slowly.
            assert router.router.classifier.slow_clients.contains("c9")
            # The replica is free again: a normal request still gets served at once.
            flood.behavior = Behavior()
            status, raw = await read_stream(router.url, chat_body("y", stream=True), {"x-client-id": "c9"})
            assert status == 200 and sse_data(raw)[-1] == "[DONE]"
            replica = router.router.pools["p"].replicas[0]
            assert replica.in_flight == 0
        finally:
            sock.close()
            await router.stop()
            await flood.stop()

    run(body())


def test_client_that_never_reads_pauses_its_replica_and_delays_no_other_stream() -> None:
    async def body() -> None:
        flood = await FakeReplica(Behavior(endless=True, pad_bytes=2048), name="flood").start()
        normal = await FakeReplica(Behavior(tokens=20, delay_s=0.005), name="normal").start()
        limit = 32 * 1024
        router = await start_router(
            router_config(
                {"fast": [normal.url], "bulk": [flood.url]},
                class_pools={"batch": "bulk"},
                stream_buffer_bytes=limit,
                stream_cut_timeout_s=3.0,
                client_sndbuf_bytes=4096,
            )
        )
        sock = await raw_request(
            router.url, chat_body("x", stream=True), rcvbuf=4096, headers="x-request-class: batch\r\n"
        )
        try:
            # Once the buffers between them are full the router stops reading the replica (pause_reading),
            # so the replica cannot send more however long the client stalls: the router holds a bounded amount.
            await asyncio.sleep(0.5)
            sent = flood.bytes_sent
            assert sent > 0
            ttfts = []
            async with aiohttp.ClientSession() as session:
                for _ in range(5):
                    began = time.monotonic()
                    async with session.post(f"{router.url}/v1/chat/completions", json=chat_body("y", stream=True)) as r:
                        assert r.status == 200
                        await r.content.readuntil(b"\n\n")
                        ttfts.append(time.monotonic() - began)
                        assert sse_data(await r.read())[-1] == "[DONE]"
            assert flood.bytes_sent == sent
            assert 0 < router.router.stats.stream_buffer_peak <= limit
            # Each of the other streams got its first event at once; the replica waits 0 s before it.
            assert max(ttfts) < 0.5, ttfts
            assert flood.aborted == 0
            await asyncio.wait_for(flood.abort_seen.wait(), timeout=10)
            metrics = router.router.metrics
            assert metrics.stream_cuts.value({"class": "batch", "reason": "stalled"}) == 1
            assert normal.completed == 5
        finally:
            sock.close()
            await router.stop()
            await flood.stop()
            await normal.stop()

    run(body())


def test_streams_one_after_another_reuse_one_upstream_connection() -> None:
    async def body() -> None:
        replica = await FakeReplica(Behavior(tokens=3)).start()
        router = await start_router(router_config({"p": [replica.url]}))
        try:
            for i in range(5):
                status, raw = await read_stream(router.url, chat_body(f"x{i}", stream=True))
                assert status == 200 and sse_data(raw)[-1] == "[DONE]"
            # A connection per stream would cost a handshake per request and leave TIME_WAIT sockets behind.
            assert router.router.upstream.open_connections == 1
            assert replica.completed == 5
        finally:
            await router.stop()
            await replica.stop()

    run(body())


def test_idle_connections_to_one_replica_do_not_starve_another_under_a_small_limit() -> None:
    """upstream_connection_limit bounds connections in use: with a limit of 1, a kept-alive idle connection
    to replica a must not hold the only slot while a request for replica b waits out its connect timeout."""

    async def body() -> None:
        a = await FakeReplica(Behavior(tokens=3), name="a").start()
        b = await FakeReplica(Behavior(tokens=3), name="b").start()
        router = await start_router(
            router_config(
                {"a": [a.url], "b": [b.url]},
                class_pools={"batch": "b"},
                default_pool="a",
                upstream_connection_limit=1,
                connect_timeout_s=1.0,
            )
        )
        try:
            status, raw = await read_stream(router.url, chat_body("x", stream=True))
            assert status == 200 and sse_data(raw)[-1] == "[DONE]"
            began = time.monotonic()
            status, raw = await read_stream(
                router.url, chat_body("y", stream=True), headers={"x-request-class": "batch"}
            )
            assert status == 200 and sse_data(raw)[-1] == "[DONE]", raw[:300]
            assert time.monotonic() - began < 0.5
            assert a.completed == 1 and b.completed == 1
        finally:
            await router.stop()
            await a.stop()
            await b.stop()

    run(body())


def test_known_slow_client_goes_to_the_slow_pool() -> None:
    async def body() -> None:
        flood = await FakeReplica(Behavior(tokens=60, pad_bytes=2048), name="main").start()
        slow_pool = await FakeReplica(name="slow").start()
        router = await start_router(
            router_config(
                {"main": [flood.url], "slow": [slow_pool.url]},
                class_pools={"slow_stream": "slow"},
                default_pool="main",
                stream_buffer_bytes=32 * 1024,
                stream_cut_timeout_s=5,
                client_sndbuf_bytes=4096,
                slow_client={"stall_s": 0.1},
            )
        )
        sock = await raw_request(router.url, chat_body("x", stream=True), rcvbuf=4096, headers="x-client-id: s1\r\n")
        loop = asyncio.get_running_loop()
        try:
            # Read slowly but completely: the stream finishes, yet the router had to wait for this reader.
            received = b""
            while not received.endswith(b"0\r\n\r\n"):
                await asyncio.sleep(0.05)
                received += await asyncio.wait_for(loop.sock_recv(sock, 4096), timeout=5)
            assert b"data: [DONE]" in received
            assert flood.completed == 1
            status, _ = await read_stream(router.url, chat_body("y", stream=True), {"x-client-id": "s1"})
            assert status == 200 and len(slow_pool.requests) == 1
            status, _ = await read_stream(router.url, chat_body("y", stream=True), {"x-client-id": "fast"})
            assert status == 200 and len(flood.requests) == 2
        finally:
            sock.close()
            await router.stop()
            await flood.stop()
            await slow_pool.stop()

    run(body())


def test_client_disconnect_mid_stream_aborts_upstream() -> None:
    async def body() -> None:
        slow = await FakeReplica(Behavior(tokens=100, delay_s=0.05)).start()
        router = await start_router(router_config({"p": [slow.url]}))
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.post(f"{router.url}/v1/chat/completions", json=chat_body("x", stream=True)) as resp,
            ):
                await resp.content.readany()
            await asyncio.wait_for(slow.abort_seen.wait(), timeout=5)
            assert slow.completed == 0
            labels = {"class": "interactive", "pool": "p"}
            for _ in range(50):
                if router.router.metrics.upstream_aborts.value(labels) == 1:
                    break
                await asyncio.sleep(0.02)
            assert router.router.metrics.upstream_aborts.value(labels) == 1
            assert router.router.pools["p"].replicas[0].in_flight == 0
        finally:
            await router.stop()
            await slow.stop()

    run(body())


def test_client_leaving_a_non_streamed_request_frees_the_replica() -> None:
    async def body() -> None:
        slow = await FakeReplica(Behavior(first_delay_s=10)).start()
        router = await start_router(router_config({"p": [slow.url]}))
        try:
            async with aiohttp.ClientSession() as s:
                with contextlib.suppress(TimeoutError):
                    await s.post(
                        f"{router.url}/v1/chat/completions",
                        json=chat_body("x", max_tokens=900),
                        timeout=aiohttp.ClientTimeout(total=0.3),
                    )
            began = time.monotonic()
            await asyncio.wait_for(slow.abort_seen.wait(), timeout=5)
            assert time.monotonic() - began < 2 and slow.completed == 0
            labels = {"class": "batch", "pool": "p", "kind": "client_gone"}
            replica = router.router.pools["p"].replicas[0]
            for _ in range(50):
                if replica.in_flight == 0:
                    break
                await asyncio.sleep(0.02)
            assert replica.in_flight == 0
            assert router.router.metrics.errors.value(labels) == 1
            assert router.router.metrics.in_flight.value({"class": "batch"}) == 0
        finally:
            await router.stop()
            await slow.stop()

    run(body())


async def _raw_replica(events: list[bytes], interval_s: float) -> tuple[asyncio.Server, str]:
    """A replica that sends its last event and the terminating chunk in one write, as the bench's does and
    uvicorn often does: the two reach the router in one read."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"GET "):  # the router's health checks
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    continue
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                )
                for event in events[:-1]:
                    writer.write(b"%x\r\n%b\r\n" % (len(event), event))
                    await asyncio.sleep(interval_s)
                writer.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(events[-1]), events[-1]))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def test_done_read_with_the_terminating_chunk_goes_out_with_it_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    ends: list[bytes] = []
    write_eof = FastStream.write_eof

    async def recording_write_eof(self: FastStream, last: bytes = b"") -> None:
        ends.append(last)
        await write_eof(self, last)

    monkeypatch.setattr(FastStream, "write_eof", recording_write_eof)
    events = [b'data: {"choices":[{"delta":{"content":"t%d "}}]}\n\n' % i for i in range(4)] + [b"data: [DONE]\n\n"]

    async def body() -> None:
        server, url = await _raw_replica(events, interval_s=0.005)
        router = await start_router(router_config({"p": [url]}))
        try:
            for _ in range(2):
                status, raw = await read_stream(router.url, chat_body("x", stream=True))
                assert status == 200 and raw == b"".join(events)
        finally:
            await router.stop()
            server.close()

    run(body())
    # Each stream's [DONE] went out in the write that ended the body, not in a write of its own.
    assert ends == [b"e\r\ndata: [DONE]\n\n\r\n"] * 2


def test_done_is_not_held_back_when_the_replica_ends_its_stream_later() -> None:
    async def body() -> None:
        lingering = await FakeReplica(Behavior(tokens=3, done_linger_s=2.0)).start()
        router = await start_router(router_config({"p": [lingering.url]}))
        try:
            host, port = router.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            payload = json.dumps(chat_body("x", stream=True)).encode()
            began = time.monotonic()
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: %d\r\n\r\n%b"
                % (len(payload), payload)
            )
            received = b""
            while b"data: [DONE]" not in received:
                chunk = await asyncio.wait_for(reader.read(65536), timeout=5)
                assert chunk, received
                received += chunk
            # [DONE] came when the replica sent it, not with the terminating chunk two seconds later.
            assert time.monotonic() - began < 1.0
            assert not received.endswith(b"0\r\n\r\n")
            writer.transport.abort()
        finally:
            await router.stop()
            await lingering.stop()

    run(body())
