"""Sends a traffic plan to an OpenAI-compatible endpoint and times every request; bounded and self-stopping."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from builders.router.classes import RequestClass
from builders.traffic.metrics import RequestRecord
from builders.traffic.plan import TrafficPlan
from builders.traffic.results import StopReason, TrafficResult
from builders.traffic.shapes import AgentConversation, RequestSpec, ShapeBuilder


class SSEParser:
    """Splits a byte stream into the data fields of whole server-sent events."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += chunk.replace(b"\r\n", b"\n")
        *blocks, self._buffer = self._buffer.split(b"\n\n")
        events = []
        for block in blocks:
            lines = [line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
            if lines:
                events.append(b"\n".join(lines).decode(errors="replace"))
        return events


def content_of(event: Mapping[str, object]) -> str | None:
    """The content a chunk carries (text, delta text or a tool call), or None for a content-free chunk."""
    choices = event.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    delta = choice.get("delta")
    if isinstance(delta, dict):
        if delta.get("content"):
            return str(delta["content"])
        if delta.get("tool_calls"):
            return json.dumps(delta["tool_calls"])
        return None
    text = choice.get("text")
    return str(text) if text else None


def _message_text(payload: Any) -> str:
    try:
        choice = payload["choices"][0]
    except (KeyError, IndexError, TypeError):
        return ""
    if isinstance(choice.get("message"), dict):
        return str(choice["message"].get("content") or "")
    return str(choice.get("text") or "")


@dataclass
class _Run:
    plan: TrafficPlan
    base_url: str
    session: aiohttp.ClientSession
    auth: dict[str, str]
    started: float
    deadline: float
    pushing_back: aiohttp.ClientSession | None = None
    """Session of the clients that push back (receive_buffer_bytes): its sockets have a small receive window."""
    records: list[RequestRecord] = field(default_factory=list)
    sent: int = 0
    budget_hit: bool = False
    deadline_hit: bool = False

    def take(self) -> bool:
        """Claim the right to send one more request, within the request cap and the deadline."""
        if time.monotonic() >= self.deadline:
            self.deadline_hit = True
            return False
        if self.sent >= self.plan.max_total_requests:
            self.budget_hit = True
            return False
        self.sent += 1
        return True

    async def send(self, spec: RequestSpec) -> RequestRecord:
        record = RequestRecord(
            request_class=spec.request_class,
            index=spec.index,
            turn=spec.turn,
            endpoint=spec.endpoint,
            stream=spec.stream,
            sent_class_header="x-request-class" in spec.headers,
            prompt_chars=spec.prompt_chars,
            max_tokens=int(spec.body.get("max_tokens") or 0),
        )
        self.records.append(record)
        limit = min(self.plan.request_timeout_s, self.deadline + self.plan.drain_s - time.monotonic())
        sent = time.monotonic()
        record.sent_at_s = sent - self.started
        try:
            async with asyncio.timeout(max(0.001, limit)):
                await self._exchange(spec, record, sent)
        except TimeoutError:
            record.error = f"no complete answer within {limit:.1f}s (request timeout or run deadline)"
        except (aiohttp.ClientError, OSError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        record.e2e_s = time.monotonic() - sent
        return record

    async def _exchange(self, spec: RequestSpec, record: RequestRecord, sent: float) -> None:
        headers = {**spec.headers, **self.auth}
        session, read_bufsize = self.session, None
        if spec.receive_buffer_bytes is not None and self.pushing_back is not None:
            # aiohttp stops reading its socket above twice read_bufsize: with half the window here the
            # library holds about as much as the kernel does, and the rest waits in the server.
            session, read_bufsize = self.pushing_back, max(1, spec.receive_buffer_bytes // 2)
        url = f"{self.base_url}{spec.path}"
        async with session.post(url, json=spec.body, headers=headers, read_bufsize=read_bufsize) as resp:
            record.status = resp.status
            record.routed_class = resp.headers.get("x-forge-class")
            record.pool = resp.headers.get("x-forge-pool")
            record.replica = resp.headers.get("x-forge-replica")
            if resp.status != 200:
                text = (await resp.read()).decode(errors="replace")
                record.error = f"HTTP {resp.status}: {text.strip()[:300]}"
                return
            if not spec.stream:
                payload = await resp.json(content_type=None)
                record.output_text = _message_text(payload)
                return
            await self._read_stream(spec, record, resp, sent)

    async def _read_stream(
        self, spec: RequestSpec, record: RequestRecord, resp: aiohttp.ClientResponse, sent: float
    ) -> None:
        parser = SSEParser()
        finished = False
        parts: list[str] = []
        while True:
            if spec.read_bytes is not None:
                data = await resp.content.read(spec.read_bytes)
            else:
                data = await resp.content.readany()
            if not data:
                break
            arrived = time.monotonic() - sent
            for event in parser.feed(data):
                if event.strip() == "[DONE]":
                    finished = True
                    continue
                try:
                    chunk = json.loads(event)
                except json.JSONDecodeError:
                    record.error = f"stream carried an event that is not JSON: {event[:120]!r}"
                    continue
                if isinstance(chunk, dict) and "error" in chunk:
                    record.error = f"error event: {json.dumps(chunk['error'])[:300]}"
                    continue
                text = content_of(chunk) if isinstance(chunk, dict) else None
                if text is not None:
                    record.content_times_s.append(arrived)
                    parts.append(text)
            if spec.read_bytes is not None and spec.read_delay_s:
                await asyncio.sleep(spec.read_delay_s)
        record.output_text = "".join(parts)
        if record.error is None and not finished:
            record.error = "stream ended without data: [DONE]"
        elif record.error is None and not record.content_times_s:
            record.error = "stream carried no content"


def _receive_window(size: int) -> Callable[[Any], socket.socket]:
    """A socket factory for aiohttp whose sockets advertise a small receive window. SO_RCVBUF is set before
    connect, because the window scale is agreed in the handshake and a later change would not shrink it."""

    def make(addr_info: Any) -> socket.socket:
        family, kind, proto, _canonical, _address = addr_info
        sock = socket.socket(family=family, type=kind, proto=proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
        return sock

    return make


def arrival_times(seed: int, request_class: RequestClass, rate_per_s: float, count: int) -> list[float]:
    """Seconds after the start at which an open-loop class sends its requests: a Poisson process, the same
    for the same seed, class and rate, so every profile of a sweep faces identical arrivals."""
    rng = random.Random(f"{seed}:{request_class.value}:arrivals")
    times: list[float] = []
    now = 0.0
    for _ in range(count):
        now += rng.expovariate(rate_per_s)
        times.append(now)
    return times


async def _open_loop(run: _Run, request_class: RequestClass, start: Callable[[int], Coroutine[Any, Any, None]]) -> None:
    """Start request (or conversation) i at its arrival time, however many are still running."""
    plan = run.plan.for_class(request_class)
    assert plan.rate_per_s is not None
    running: list[asyncio.Task[None]] = []
    for index, at in enumerate(arrival_times(run.plan.seed, request_class, plan.rate_per_s, plan.count)):
        if run.started + at >= run.deadline:
            # Not slept for: at a rate scaled far down the next arrival can be minutes past the deadline, and
            # the run would wait for a request it will never send.
            run.deadline_hit = True
            break
        delay = run.started + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if time.monotonic() >= run.deadline:
            run.deadline_hit = True
            break
        running.append(asyncio.create_task(start(index)))
    await asyncio.gather(*running)


async def _run_singles(run: _Run, request_class: RequestClass, builder: ShapeBuilder) -> None:
    plan = run.plan.for_class(request_class)
    if plan.rate_per_s is not None:

        async def one(index: int) -> None:
            if run.take():
                await run.send(builder.single(request_class, index))

        await _open_loop(run, request_class, one)
        return
    indices = iter(range(plan.count))

    async def worker() -> None:
        for index in indices:
            if not run.take():
                return
            await run.send(builder.single(request_class, index))

    await asyncio.gather(*(worker() for _ in range(min(plan.concurrency, plan.count))))


async def _run_agents(run: _Run, builder: ShapeBuilder) -> None:
    plan = run.plan.agent
    indices = iter(range(plan.count))

    async def converse(conversation: AgentConversation) -> None:
        while not conversation.done:
            if not run.take():
                return
            record = await run.send(conversation.next_request())
            if not record.ok:
                # An agent whose turn failed stops, as a real one would.
                return
            conversation.record_reply(record.output_text)

    async def worker() -> None:
        for index in indices:
            await converse(builder.agent(index))

    if plan.rate_per_s is not None:

        async def start(index: int) -> None:
            await converse(builder.agent(index))

        await _open_loop(run, RequestClass.AGENT, start)
        return

    await asyncio.gather(*(worker() for _ in range(min(plan.concurrency, plan.count))))


async def run_traffic(base_url: str, plan: TrafficPlan, *, api_key: str | None = None) -> TrafficResult:
    """Drive every class of the plan at once against base_url (no /v1 suffix) and summarise the run.

    Stops by itself: no request starts after max_total_requests or deadline_s, and requests still
    running drain_s after the deadline are cut and recorded as errors.
    """
    builder = ShapeBuilder(plan)
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    started = time.monotonic()
    # One connection per concurrent request: a shared pool limit would queue requests in the client
    # and count that wait as server latency.
    connector = aiohttp.TCPConnector(limit=0)
    window = plan.slow_stream.receive_buffer_bytes
    async with contextlib.AsyncExitStack() as stack:
        session = await stack.enter_async_context(aiohttp.ClientSession(connector=connector, auto_decompress=True))
        pushing_back = None
        if window is not None:
            narrow = aiohttp.TCPConnector(limit=0, socket_factory=_receive_window(window))
            pushing_back = await stack.enter_async_context(aiohttp.ClientSession(connector=narrow))
        run = _Run(
            plan=plan,
            base_url=base_url.rstrip("/"),
            session=session,
            auth=auth,
            started=started,
            deadline=started + plan.deadline_s,
            pushing_back=pushing_back,
        )
        tasks = []
        for request_class in RequestClass:
            if plan.for_class(request_class).count == 0:
                continue
            if request_class is RequestClass.AGENT:
                tasks.append(_run_agents(run, builder))
            else:
                tasks.append(_run_singles(run, request_class, builder))
        await asyncio.gather(*tasks)
    reason: StopReason = "deadline" if run.deadline_hit else "budget" if run.budget_hit else "completed"
    return TrafficResult.build(plan, run.records, wall_s=time.monotonic() - started, stopped_by=reason)
