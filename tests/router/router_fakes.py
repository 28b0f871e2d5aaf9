"""A fake vLLM replica for router tests: streams tokens with set delays, fails or dies on request."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web

from builders.router.config import RouterConfig, config_from_mapping

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 20.0) -> T:
    """Run one async test body with a hard ceiling, so a hang fails instead of blocking the suite."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def dead_url() -> str:
    """A loopback URL where nothing listens: connecting to it is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def router_config(pools: dict[str, list[str]], **overrides: Any) -> RouterConfig:
    data: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "pools": pools, "default_pool": next(iter(pools))}
    data.update(overrides)
    return config_from_mapping(data, source="test")


@dataclass
class Behavior:
    tokens: int = 5
    first_delay_s: float = 0.0
    delay_s: float = 0.0
    fail_status: int | None = None
    """Answer with this status (and a JSON error) before any byte of a result."""
    die_after: int | None = None
    """Reset the connection after this many tokens (stream) or mid-body (non-stream)."""
    endless: bool = False
    pad_bytes: int = 0
    """Extra bytes in every chunk, to fill buffers quickly."""
    health_status: int = 200


@dataclass
class FakeReplica:
    behavior: Behavior = field(default_factory=Behavior)
    name: str = "replica"
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    aborted: int = 0
    completed: int = 0
    bytes_sent: int = 0
    url: str = ""
    abort_seen: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None

    async def start(self) -> FakeReplica:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        # Like vLLM, a replica learns of a vanished client by its handler being cancelled.
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(status=self.behavior.health_status, text="")

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": f"model-{self.name}", "object": "model"}]})

    def _chunk(self, chat: bool, i: int) -> bytes:
        text = f"t{i} " + "x" * self.behavior.pad_bytes
        choice: dict[str, Any] = {"index": 0}
        if chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        return b"data: " + json.dumps({"id": "fake", "choices": [choice]}).encode() + b"\n\n"

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._answer(request)
        except asyncio.CancelledError:
            self.aborted += 1
            self.abort_seen.set()
            raise

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        b = self.behavior
        if b.first_delay_s:
            await asyncio.sleep(b.first_delay_s)
        if b.fail_status is not None:
            return web.json_response({"error": {"message": "fake failure"}}, status=b.fail_status)
        chat = request.path.endswith("/chat/completions")
        if not body.get("stream"):
            return await self._unary(request, chat)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        i = 0
        try:
            while b.endless or i < b.tokens:
                if b.die_after is not None and i >= b.die_after:
                    assert request.transport is not None
                    request.transport.abort()
                    return resp
                chunk = self._chunk(chat, i)
                await resp.write(chunk)
                self.bytes_sent += len(chunk)
                i += 1
                await asyncio.sleep(b.delay_s)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionError:
            self.aborted += 1
            self.abort_seen.set()
            return resp
        self.completed += 1
        return resp

    async def _unary(self, request: web.Request, chat: bool) -> web.StreamResponse:
        text = "".join(f"t{i} " for i in range(self.behavior.tokens))
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        payload = json.dumps({"id": "fake", "choices": [choice]}).encode()
        if self.behavior.die_after is not None:
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.content_length = len(payload) + 1000
            await resp.prepare(request)
            await resp.write(payload[: len(payload) // 2])
            assert request.transport is not None
            request.transport.abort()
            return resp
        self.completed += 1
        return web.Response(body=payload, content_type="application/json")


def chat_body(text: str = "hello", *, stream: bool = False, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": text}], "stream": stream}
    body.update(extra)
    return body


def sse_data(raw: bytes) -> list[str]:
    """The data fields of whole SSE events in a response body."""
    events = []
    for block in raw.decode().split("\n\n"):
        lines = [line[len("data: ") :] for line in block.split("\n") if line.startswith("data: ")]
        if lines:
            events.append("\n".join(lines))
    return events
