"""A fake OpenAI-compatible server for traffic tests: logs what it receives, streams like vLLM does."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web
from fake_servers import serve

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


@dataclass
class Received:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    at: float


@dataclass
class FakeOpenAI:
    token_delay_s: float = 0.0
    first_delay_s: float = 0.0
    max_tokens_cap: int = 16
    """Tokens actually produced are min(max_tokens, this), to keep tests fast."""
    fail_status_for: dict[str, int] = field(default_factory=dict)
    """x-request-class value -> HTTP status to answer with instead."""
    received: list[Received] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> FakeOpenAI:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_get("/health", self._health)
        self._runner, self.url = await serve(app)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def by_class(self, name: str) -> list[Received]:
        return [r for r in self.received if r.headers.get("x-request-class") == name]

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(Received(request.path, body, dict(request.headers), time.monotonic()))
        status = self.fail_status_for.get(request.headers.get("x-request-class", ""))
        if status is not None:
            return web.json_response({"error": {"message": "fake refusal"}}, status=status)
        await asyncio.sleep(self.first_delay_s)
        chat = request.path.endswith("/chat/completions")
        tokens = min(int(body.get("max_tokens") or 16), self.max_tokens_cap)
        if not body.get("stream"):
            await asyncio.sleep(self.token_delay_s * tokens)
            text = "".join(f"w{i} " for i in range(tokens))
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            return web.json_response({"id": "x", "choices": [choice]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if chat:
            # vLLM opens a chat stream with a role-only chunk that carries no content.
            await resp.write(_event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
        for i in range(tokens):
            if i:
                await asyncio.sleep(self.token_delay_s)
            piece = {"delta": {"content": f"w{i} "}} if chat else {"text": f"w{i} "}
            await resp.write(_event({"choices": [{"index": 0, **piece}]}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
