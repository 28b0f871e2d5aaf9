"""A fake vLLM replica for router tests: streams tokens with set delays, fails or dies on request."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from fake_servers import serve

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
    fail_message: str = "fake failure"
    hang_after: int | None = None
    """Stop answering after this many tokens (0: before any byte, streamed or not); /health hangs from then on."""
    raw_stream: bytes | None = None
    """Send these bytes as the whole body of a streamed answer (to play a replica that breaks SSE)."""
    done_linger_s: float = 0.0
    """Keep the stream open this long after data: [DONE], as a replica may before its final chunk."""


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
    hung: bool = False
    host: str = "127.0.0.1"
    port: int = 0
    """Where to listen: a DNS discovery test puts replicas at the same port on different loopback addresses."""
    models: tuple[str, ...] = ()
    """What GET /v1/models lists; default "m" (what chat_body asks for) and model-NAME, its own."""
    _runner: web.AppRunner | None = None

    async def start(self) -> FakeReplica:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/completions", self._generate)
        # Only with raw_stream: the bytes of a Responses API stream, whatever they are.
        app.router.add_post("/v1/responses", self._generate)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        self._runner, self.url = await serve(app, self.host, self.port)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def open_connections(self) -> int:
        """Connections open to this replica, as its own server counts them (the router's pool seen from outside)."""
        server = self._runner.server if self._runner is not None else None
        return len(server.connections) if server is not None else 0

    async def _health(self, _request: web.Request) -> web.Response:
        if self.hung:
            await asyncio.Event().wait()
        return web.Response(status=self.behavior.health_status, text="")

    async def _models(self, _request: web.Request) -> web.Response:
        models = self.models or ("m", f"model-{self.name}")
        return web.json_response({"object": "list", "data": [{"id": m, "object": "model"} for m in models]})

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
            return web.json_response({"error": {"message": b.fail_message}}, status=b.fail_status)
        chat = request.path.endswith("/chat/completions")
        if b.hang_after == 0:
            await self._hang()
        if not body.get("stream"):
            return await self._unary(request, chat)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if b.raw_stream is not None:
            await resp.write(b.raw_stream)
            await resp.write_eof()
            return resp
        i = 0
        try:
            while b.endless or i < b.tokens:
                if b.hang_after is not None and i >= b.hang_after:
                    await self._hang()
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
            if b.done_linger_s:
                await asyncio.sleep(b.done_linger_s)
            await resp.write_eof()
        except ConnectionError:
            self.aborted += 1
            self.abort_seen.set()
            return resp
        self.completed += 1
        return resp

    async def _hang(self) -> None:
        self.hung = True
        await asyncio.Event().wait()

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


@dataclass
class RouterProcess:
    """`python -m builders.router` in a child process: the real entry point, with its own RSS, fds and stderr."""

    proc: asyncio.subprocess.Process
    url: str
    stderr_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS in /proc status")

    def fds(self) -> int:
        return sum(1 for _ in Path(f"/proc/{self.pid}/fd").iterdir())

    def cpu_s(self) -> float:
        # Fields 14 and 15 of /proc/PID/stat (after the parenthesised name) are user and system ticks.
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    async def wait(self, timeout: float) -> int:
        return await asyncio.wait_for(self.proc.wait(), timeout)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


async def start_router_process(tmp_path: Path, config: dict[str, Any]) -> RouterProcess:
    """Start the router CLI on a JSON config (port 0 unless given) and wait for its listening line."""
    path = tmp_path / f"router-{len(list(tmp_path.glob('router-*.json')))}.json"
    path.write_text(json.dumps({"host": "127.0.0.1", "port": 0, **config}))
    stderr_path = path.with_suffix(".stderr")
    with stderr_path.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "builders.router", "--config", str(path), stdout=asyncio.subprocess.PIPE, stderr=err
        )
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
    if "listening on " not in line:
        await proc.wait()
        raise AssertionError(f"router did not start: {line!r} {stderr_path.read_text()}")
    return RouterProcess(proc=proc, url=line.split("listening on ", 1)[1].strip(), stderr_path=stderr_path)


def process_config(pools: dict[str, list[str]], **overrides: Any) -> dict[str, Any]:
    return {"pools": pools, "default_pool": next(iter(pools)), **overrides}


def metric(text: str, name: str) -> float:
    """One sample's value from a /metrics page (0 when the series is absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
