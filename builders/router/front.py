"""The router's client side: HTTP/1.1 connections, with routed POSTs served without aiohttp's server.

aiohttp's server builds a Request, resolves a route, formats its headers and runs its writer for every
request; on a streamed completion that was the largest share of the router's own CPU that was left
(bench-router). Here each connection is parsed with httptools, and a request the fast path can take
whole goes straight to Router.route_fast: a complete POST to a path whose body is JSON (chat, completions,
responses, embeddings, tokenize, score, rerank: builders/router/openai_request.py Endpoint), HTTP/1.1 with
keep-alive, no Expect, Upgrade or Content-Encoding, a body under offload_parse_bytes.

Anything else (another path or method, a body too large, bytes that are not HTTP, pipelined requests)
hands the connection to aiohttp's own handler for the rest of its life, with every byte read of the
request so far: aiohttp then parses it from its first byte, and every rule it enforces still applies.
The fast path keeps aiohttp's timing rules itself: the idle timer runs from connect and from each
response until the next request head is complete, and a body that does not arrive within
body_timeout_s gets a 408 and the connection is closed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Protocol, cast

import httptools
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from builders.router.config import RouterConfig
from builders.router.openai_request import UPLOADS, Endpoint
from builders.router.router_metrics import RouterMetrics
from builders.router.write_flow import WriteFlow

log = logging.getLogger("forge.router")

# Uploads go to aiohttp, whose reader streams their body (builders/router/uploads.py).
FAST_PATHS = {endpoint.value.encode(): endpoint for endpoint in Endpoint if endpoint not in UPLOADS}
MAX_HEAD_BYTES = 16 * 1024
"""A head still incomplete past this goes to aiohttp, which refuses over-long lines and fields."""
MAX_LATER_BYTES = 64 * 1024
"""Bytes a client may send while its request is being served before the connection stops being read."""


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class _Clock:
    """The Date header, formatted once a second."""

    second = -1
    value = b""

    @classmethod
    def date(cls) -> bytes:
        now = int(time.time())
        if now != cls.second:
            cls.second, cls.value = now, formatdate(now, usegmt=True).encode()
        return cls.value


_HEADS: dict[tuple[int, bytes, tuple[tuple[str, str], ...]], tuple[bytes, bytes]] = {}
"""Response heads without their Date, by status, framing and headers: a router sends few distinct ones (a
stream's differ only by class, pool and replica), so each is encoded once."""
_HEADS_MAX = 4096


def _head(status: int, headers: Mapping[str, str], framing: bytes) -> bytes:
    key = (status, framing, tuple(headers.items()))
    parts = _HEADS.get(key)
    if parts is None:
        lines = [b"HTTP/1.1 %d %s" % (status, _reason(status).encode())]
        lines.extend(
            f"{name}: {value}".encode("latin-1")
            for name, value in headers.items()
            if name.lower() not in ("content-length", "transfer-encoding", "date", "connection")
        )
        parts = (b"\r\n".join(lines) + b"\r\nDate: ", b"\r\n" + framing + b"\r\n\r\n")
        if len(_HEADS) >= _HEADS_MAX:
            # Only reachable with thousands of replicas or error texts: start over rather than grow.
            _HEADS.clear()
        _HEADS[key] = parts
    return parts[0] + _Clock.date() + parts[1]


def response_bytes(response: web.Response) -> bytes:
    """A whole aiohttp Response as bytes on the wire (the router's JSON answers and errors)."""
    body = response.body
    if not isinstance(body, bytes | bytearray):
        raise TypeError(f"the fast path sends bytes bodies only, not {type(body).__name__}")
    return _head(response.status, response.headers, b"Content-Length: %d" % len(body)) + bytes(body)


class Router(Protocol):
    """What the front end needs of builders.router.app.Router (named here so the two modules do not
    import each other)."""

    config: RouterConfig
    metrics: RouterMetrics

    async def route_fast(self, request: FastRequest, endpoint: Endpoint, raw: bytes) -> web.Response | FastStream: ...

    def reject(self, status: int, message: str, param: str) -> web.Response: ...


class FastRequest:
    """What Router needs of a request served on the fast path: its headers and its client's transport."""

    __slots__ = ("_connection", "head_sent", "headers")

    def __init__(self, connection: FrontConnection, headers: CIMultiDictProxy[str]) -> None:
        self._connection = connection
        self.headers = headers
        self.head_sent = False
        """The response head is on the wire: an error can no longer be answered, only cut."""

    @property
    def connection(self) -> FrontConnection:
        return self._connection

    @property
    def transport(self) -> asyncio.Transport | None:
        """None once the client has gone, as aiohttp's request.transport."""
        return self._connection.transport

    async def drain(self) -> None:
        await self._connection.drain()


class FastStream:
    """The part of aiohttp's StreamResponse that relay.Pump.pump uses, written straight to the transport.

    The head goes out with the first write, as aiohttp's does; the body is chunked.
    """

    def __init__(self, request: FastRequest, status: int, headers: Mapping[str, str]) -> None:
        self._request = request
        self._head: bytes | None = _head(status, headers, b"Transfer-Encoding: chunked")
        self.ended = False

    def _transport(self) -> asyncio.Transport:
        transport = self._request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("Cannot write to closing transport")
        return transport

    async def write(self, data: bytes) -> None:
        transport = self._transport()
        framed = b"%x\r\n%b\r\n" % (len(data), data) if data else b""
        if self._head is not None:
            framed, self._head = self._head + framed, None
            self._request.head_sent = True
        transport.write(framed)
        await self._request.drain()

    async def write_eof(self, last: bytes = b"") -> None:
        """End the body; `last`, already chunk-framed, goes out in the same write (the relay's held [DONE])."""
        if self.ended:
            return
        transport = self._transport()
        tail = last + b"0\r\n\r\n"
        if self._head is not None:
            tail, self._head = self._head + tail, None
            self._request.head_sent = True
        self.ended = True
        transport.write(tail)


class Front:
    """The listening socket's protocol factory, and the fast connections alive, for drain and shutdown."""

    def __init__(self, router: Router, aiohttp_server: web.Server) -> None:
        self.router = router
        self.aiohttp_server = aiohttp_server
        self.connections: set[FrontConnection] = set()
        self.loop = asyncio.get_running_loop()
        """Kept, not asked for: asyncio.get_running_loop() makes a getpid() system call each time (Python 3.11)."""

    def __call__(self) -> FrontConnection:
        return FrontConnection(self)

    def close_idle(self) -> None:
        for connection in list(self.connections):
            if connection.task is None:
                connection.close()

    async def shutdown(self, timeout_s: float) -> None:
        """Close idle connections, give requests being served timeout_s, then cancel them."""
        self.close_idle()
        tasks = [c.task for c in self.connections if c.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        for connection in list(self.connections):
            if connection.task is not None:
                connection.task.cancel()
            connection.close()


class FrontConnection(WriteFlow):
    """One client connection while it is on the fast path."""

    def __init__(self, front: Front) -> None:
        super().__init__()
        self._front = front
        self._router = front.router
        self._loop = front.loop
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._buffer = bytearray()
        """Every byte of the request being parsed, so a hand-off can give aiohttp the request from its start."""
        self._later = bytearray()
        """Bytes that arrived while a request was being served."""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        """When the pending timer fires (time.monotonic)."""
        self._deadline = 0.0
        self._on_deadline: Callable[[], None] | None = None
        """What happens at _deadline (idle close or 408), or None: nothing is timed now."""
        self._reset()
        self.streams_prepared = False
        """Router._prepare_transport has set this connection's write buffer limits and send buffer."""

    def _reset(self) -> None:
        self._url = b""
        self._headers: CIMultiDict[str] = CIMultiDict()
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._head_done = False
        self._complete = False
        self._pipelined = False
        self._hand_off_reason: str | None = None
        self._buffer.clear()

    # --- asyncio.Protocol ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self._front.connections.add(self)
        self._arm(self._router.config.idle_timeout_s, self._on_idle)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._front.connections.discard(self)
        self._cancel_timer()
        if self.task is not None and not self.task.done():
            # As aiohttp's handler_cancellation: the client left, so its request stops and frees its replica.
            self.task.cancel()
        self._fail_drain(None)

    def _closed_error(self, why: str | None) -> Exception:
        # A ConnectionError, as aiohttp's writer raises, so the relay handles a client gone on either front alike.
        return ConnectionResetError("the client closed the connection")

    def data_received(self, data: bytes) -> None:
        if self.task is not None:
            # The request being served is answered first (HTTP/1.1 answers in order); a client that sends
            # more than a little meanwhile is no longer read until then.
            self._later += data
            if len(self._later) > MAX_LATER_BYTES and self.transport is not None:
                self.transport.pause_reading()
            return
        self._buffer += data
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            # aiohttp answers malformed requests (400) in its own words.
            self._hand_off_reason = "not_http"
        if self._pipelined:
            self._hand_off_reason = "pipelined"
        if self._hand_off_reason is None and not self._head_done and len(self._buffer) > MAX_HEAD_BYTES:
            self._hand_off_reason = "long_head"
        if self._hand_off_reason is not None:
            self._hand_off(self._hand_off_reason)
        elif self._complete:
            self._start()

    # --- httptools callbacks -------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._complete:
            self._pipelined = True

    def on_url(self, url: bytes) -> None:
        if not self._complete:
            self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        # As aiohttp decodes them: UTF-8, with bytes that are not kept as surrogate escapes.
        self._headers.add(name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))

    def on_headers_complete(self) -> None:
        if self._complete:
            return  # a pipelined request's: the connection goes to aiohttp
        self._head_done = True
        self._hand_off_reason = self._not_fast()
        if self._hand_off_reason is None:
            self._arm(self._router.config.body_timeout_s, self._on_body_timeout)

    def on_body(self, body: bytes) -> None:
        if self._complete:
            return
        self._body.append(body)
        self._body_bytes += len(body)
        if self._too_large(self._body_bytes):
            self._hand_off_reason = "large_body"

    def on_message_complete(self) -> None:
        if not self._complete:
            self._complete = True
            self._disarm()

    def _not_fast(self) -> str | None:
        """Why the request whose head is complete is not for the fast path; None if it is."""
        parser = self._parser
        if parser.get_method() != b"POST" or self._url not in FAST_PATHS:
            return "another_request"
        if parser.get_http_version() != "1.1" or not parser.should_keep_alive() or parser.should_upgrade():
            return "connection_handling"
        headers = self._headers
        if "Expect" in headers or headers.get("Content-Encoding", "identity").strip().lower() != "identity":
            return "request_headers"
        length = headers.get("Content-Length")
        if length is not None and (not length.isdigit() or self._too_large(int(length))):
            return "large_body"
        return None

    def _too_large(self, size: int) -> bool:
        # Bodies over max_request_bytes get their 413 from aiohttp, large ones their worker-thread parse.
        cfg = self._router.config
        return size >= cfg.offload_parse_bytes or size > cfg.max_request_bytes

    # --- serving -------------------------------------------------------------------------------------

    def _start(self) -> None:
        endpoint = FAST_PATHS[self._url]
        raw = b"".join(self._body)
        request = FastRequest(self, CIMultiDictProxy(self._headers))
        self._reset()
        self.task = self._loop.create_task(self._serve(request, endpoint, raw))

    async def _serve(self, request: FastRequest, endpoint: Endpoint, raw: bytes) -> None:
        try:
            answer = await self._router.route_fast(request, endpoint, raw)
            if isinstance(answer, FastStream):
                if not answer.ended and self.transport is not None and not self.transport.is_closing():
                    await answer.write_eof()
            elif self.transport is not None:
                self.transport.write(response_bytes(answer))
        except Exception:
            # aiohttp's server does the same for a handler that raises: log it, answer 500 if it still can.
            log.exception("the router failed serving a request")
            if self.transport is not None:
                if request.head_sent:
                    self.transport.abort()
                else:
                    error = {"error": {"message": "internal error", "type": "internal_error", "code": 500}}
                    self.transport.write(response_bytes(web.json_response(error, status=500)))
        self.task = None
        if self.transport is None or self.transport.is_closing():
            return
        self._arm(self._router.config.idle_timeout_s, self._on_idle)
        if self._later:
            later = bytes(self._later)
            self._later.clear()
            self.transport.resume_reading()
            self.data_received(later)

    # --- hand-off, timers, close -------------------------------------------------------------------------

    def _hand_off(self, reason: str) -> None:
        """Give the connection, with the request read so far, to aiohttp's handler for the rest of its life."""
        self._router.metrics.handoffs.inc({"reason": reason})
        self._cancel_timer()
        self._front.connections.discard(self)
        transport = self.transport
        if transport is None:
            return
        self.transport = None
        handler = self._front.aiohttp_server()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        data = bytes(self._buffer)
        self._buffer.clear()
        if data:
            handler.data_received(data)

    def _arm(self, delay_s: float, callback: Callable[[], None]) -> None:
        """Time one thing (the idle wait or the body), replacing what was timed before.

        One timer per connection, moved lazily: arming for a later moment than the pending timer's only
        records the deadline, and the timer, when it fires early, waits again for the rest. Every request
        arms and disarms twice, and a timer handle made and cancelled each time was a measurable part of
        the router's own CPU per request.
        """
        now = time.monotonic()
        self._deadline = now + delay_s
        self._on_deadline = callback
        if self._timer is not None and self._timer_at <= self._deadline:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = self._deadline
        self._timer = self._loop.call_later(delay_s, self._fire)

    def _disarm(self) -> None:
        # The pending timer finds nothing to do when it fires; a hand-off or a lost connection cancels it.
        self._on_deadline = None

    def _cancel_timer(self) -> None:
        self._on_deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        callback = self._on_deadline
        if callback is None:
            return
        left = self._deadline - time.monotonic()
        # The tolerance absorbs a timer that fires a clock tick early; it is not part of the limit.
        if left > 0.001:
            self._timer_at = self._deadline
            self._timer = self._loop.call_later(left, self._fire)
            return
        self._on_deadline = None
        callback()

    def _on_idle(self) -> None:
        # No request head within idle_timeout_s of connecting or of the last response.
        if self.task is None:
            self.close()

    def _on_body_timeout(self) -> None:
        transport = self.transport
        if transport is None or self.task is not None:
            return
        cfg = self._router.config
        answer = self._router.reject(408, f"request body did not arrive within {cfg.body_timeout_s}s", "body")
        transport.write(response_bytes(answer))
        self.close()

    def close(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.close()


__all__ = ["FastRequest", "FastStream", "Front", "FrontConnection", "response_bytes"]
