"""The router's HTTP/1.1 client for streamed requests: pooled keep-alive connections, a C parser, and body
bytes handed to a callback inside data_received.

aiohttp's client hands each body chunk through a StreamReader to a coroutine that awaits it: a future,
a task step and several Python calls per streamed event, which on a 32-event stream was the largest
part of the router's own CPU. Here httptools parses in C and `Exchange.sink` runs synchronously for
every body chunk, so a relay can write the chunk to its client and count it without waking a coroutine;
flow control is the transport's own pause_reading()/resume_reading().
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

import httptools

from builders.router.write_flow import WriteFlow


class UpstreamFailed(Exception):
    """The exchange ended before its message was complete: connection lost, closed, or bytes not HTTP."""


class ConnectFailed(UpstreamFailed):
    """No connection could be opened (refused, unreachable, or not within the connect timeout)."""


class Exchange:
    """One request and its response on one pooled connection.

    The owner reads `status` once `head()` returns, then either collects the body (`read_body`) or
    sets `sink` to receive every later body chunk as it arrives. `close()` aborts the connection unless
    the exchange was complete and handed back to the pool, so a late close never touches a reused one.
    """

    def __init__(self, connection: Connection, loop: asyncio.AbstractEventLoop) -> None:
        self._connection: Connection | None = connection
        self._loop = loop
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        """Dropped once the exchange is released or closed: parser and exchange refer to each other, and a
        cycle per request would be left for the cyclic collector, whose pauses land on every stream."""
        self.status = 0
        self.content_type: str | None = None
        self.complete = False
        self.error: UpstreamFailed | None = None
        self.sink: Callable[[bytes], None] | None = None
        """Called with each body chunk inside data_received; until set, chunks are buffered."""
        self.on_end: Callable[[], None] | None = None
        """Called once when the message completes or the exchange fails, after `sink` is set."""
        self.buffered: list[bytes] = []
        self.buffered_bytes = 0
        self._head_seen = False
        self.keep_alive = False
        self._waiter: asyncio.Future[None] | None = None
        self.at_chunk_boundary = False
        """The parser stopped between two chunks of a chunked body (kept by BoundaryTrackingExchange only)."""

    # --- httptools callbacks ----------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.content_type = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert parser is not None, "a dropped parser is never fed"
        self.status = parser.get_status_code()
        # Asked here: once the message is complete the parser has moved on and answers False.
        self.keep_alive = parser.should_keep_alive()
        self._head_seen = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        sink = self.sink
        if sink is not None:
            sink(body)
            return
        self.buffered.append(body)
        self.buffered_bytes += len(body)
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()
        if self.on_end is not None:
            self.on_end()

    # --- fed by the connection --------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(UpstreamFailed(f"the replica sent bytes that are not HTTP ({exc})"))
            self.close()

    def fail(self, error: UpstreamFailed) -> None:
        if self.complete or self.error is not None:
            return
        self.error = error
        self._wake()
        if self.on_end is not None:
            self.on_end()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- for the owner ----------------------------------------------------------------------------

    async def _news(self) -> None:
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def head(self) -> int:
        """Wait for the response head; its status code."""
        while not self._head_seen:
            if self.error is not None:
                raise self.error
            await self._news()
        return self.status

    def take(self) -> bytes:
        """What is buffered of the body, without waiting."""
        data = b"".join(self.buffered)
        self.buffered.clear()
        self.buffered_bytes = 0
        return data

    async def body_chunk(self) -> bytes:
        """What is buffered of the body, waiting for some if none is; b"" at the end of the message."""
        while not self.buffered:
            if self.error is not None:
                raise self.error
            if self.complete:
                return b""
            await self._news()
        return self.take()

    async def read_body(self, limit: int) -> bytes | None:
        """The whole body, or None once it passes `limit` bytes (the connection is then closed)."""
        while not self.complete:
            if self.error is not None:
                raise self.error
            if self.buffered_bytes > limit:
                self.close()
                return None
            await self._news()
        if self.buffered_bytes > limit:
            self.close()
            return None
        return b"".join(self.buffered)

    @property
    def closed(self) -> bool:
        return self._connection is None

    @property
    def connection(self) -> Connection | None:
        """The pooled connection, until the exchange is released or closed."""
        return self._connection

    def pause_reading(self) -> None:
        if self._connection is not None:
            self._connection.pause_reading()

    def resume_reading(self) -> None:
        if self._connection is not None:
            self._connection.resume_reading()

    def release(self) -> None:
        """Hand a complete exchange's connection back to its pool (closing it if it cannot be reused)."""
        connection, self._connection = self._connection, None
        self._parser = None
        if connection is None:
            return
        connection.undivert()
        if self.complete and self.keep_alive:
            connection.pool.put_back(connection)
        else:
            connection.abort()

    def close(self) -> None:
        """Abort the connection, which is how a replica learns to stop generating for this request."""
        connection, self._connection = self._connection, None
        self._parser = None
        if connection is None:
            return
        self.fail(UpstreamFailed("closed by the router"))
        connection.abort()


class BoundaryTrackingExchange(Exchange):
    """An Exchange that knows when its parser stands between two chunks, so that the C relay may take whole
    chunks off the transport itself (builders/router/_fastrelay.c) without the parser losing its place.

    A class of its own because httptools calls these two only where they exist: the Python relay does not
    need them and would pay two calls per event.
    """

    def on_chunk_header(self) -> None:
        self.at_chunk_boundary = False

    def on_chunk_complete(self) -> None:
        # After the CRLF that ends the chunk's data, so the next byte starts a chunk-size line.
        self.at_chunk_boundary = True


class Connection(WriteFlow):
    def __init__(self, pool: UpstreamPool, key: tuple[str, int]) -> None:
        super().__init__()
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self._paused = False
        self.idle_since = 0.0
        """When it was last put back in the pool (the loop's clock): the idle sweep closes it idle_timeout_s later."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None:
            # Bytes on an idle connection belong to no request: the connection cannot be trusted.
            self.abort()
            return
        exchange.feed(data)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.pool.lost(self)
        exchange, self.exchange = self.exchange, None
        why = f"{type(exc).__name__}: {exc}" if exc is not None else "the replica closed the connection"
        self._fail_drain(why)
        if exchange is not None:
            exchange.fail(UpstreamFailed(why))

    def _closed_error(self, why: str | None) -> Exception:
        return UpstreamFailed(why or "the replica closed the connection")

    def pause_reading(self) -> None:
        if self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and self._paused:
            self._paused = False
            self.transport.resume_reading()

    def abort(self) -> None:
        self.exchange = None
        if self.transport is not None:
            self.transport.abort()

    def divert(self, protocol: asyncio.Protocol) -> None:
        """Let protocol receive this connection's events (it hands what it does not handle back to this one)."""
        if self.transport is not None:
            self.transport.set_protocol(protocol)

    def undivert(self) -> None:
        if self.transport is not None and self.transport.get_protocol() is not self:
            self.transport.set_protocol(self)


@functools.lru_cache(maxsize=1024)
def _address(base_url: str) -> tuple[tuple[str, int], str]:
    """(host, port) and the Host header of a replica URL, parsed once: replica URLs are few and fixed."""
    parts = urlsplit(base_url)
    return (parts.hostname or "127.0.0.1", parts.port or 80), parts.netloc


class UpstreamPool:
    """Keep-alive connections per replica; at most `limit` in use at once over all replicas. Idle ones do not
    count (as with aiohttp's connector): counted, the idle connections to one replica would hold every slot
    and starve requests to the others.

    An idle connection is closed `idle_timeout_s` after it was put back. Without that, the pool kept as many
    connections as the busiest moment had overlapping streams (up to max_idle_per_replica each) for as long
    as the replica let it, and the router's fds followed the load's history instead of its present.
    The most recently used connection is reused first, so a quieter load lets the older ones expire.
    """

    def __init__(
        self,
        *,
        limit: int,
        max_idle_per_replica: int = 64,
        track_chunks: bool = False,
        keep_alive: bool = True,
        idle_timeout_s: float = 30.0,
    ) -> None:
        self._slots = asyncio.Semaphore(limit)
        self._exchange_type = BoundaryTrackingExchange if track_chunks else Exchange
        """track_chunks: the C relay will read the connections, and must know where chunks end."""
        self._loop = asyncio.get_running_loop()
        """Kept, not asked for: asyncio.get_running_loop() makes a getpid() system call each time (Python 3.11)."""
        # Without keep-alive no connection is kept idle: each request opens its own.
        self._max_idle = max_idle_per_replica if keep_alive else 0
        self._idle: dict[tuple[str, int], list[Connection]] = {}
        self._open: set[Connection] = set()
        self._in_use: set[Connection] = set()
        self._connecting: dict[tuple[str, int], int] = {}
        """Connections being opened, per replica: each has a socket already, and /metrics counts it."""
        self.idle_timeout_s = idle_timeout_s
        self._sweep: asyncio.TimerHandle | None = None
        """One timer for the whole pool, at the oldest idle connection's expiry (none while nothing is idle):
        put_back only stores a time, so a request costs no timer of its own."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    async def send(
        self, base_url: str, path: str, body: bytes | None, headers: dict[str, str], connect_timeout_s: float
    ) -> Exchange:
        """Send one POST to a replica on a pooled connection (or a new one); the exchange to read the answer on.
        Waiting for a free slot counts against connect_timeout_s, as connecting does.

        body None: only the head goes out, and the caller writes the body on `exchange.connection` (an upload
        relayed as it arrives); its headers then carry the framing (Content-Length or Transfer-Encoding)."""
        key, netloc = _address(base_url)
        began = time.monotonic()
        if not self._slots.locked():
            # A free slot is taken without suspending: no timer to arm for the common case.
            await self._slots.acquire()
        else:
            try:
                async with asyncio.timeout(connect_timeout_s):
                    await self._slots.acquire()
            except TimeoutError:
                raise ConnectFailed(
                    f"no upstream connection free within {connect_timeout_s}s (upstream_connection_limit)"
                ) from None
        try:
            connection = None
            idle = self._idle.get(key)
            while idle:
                candidate = idle.pop()
                if candidate.transport is not None and not candidate.transport.is_closing():
                    connection = candidate
                    break
            if connection is None:
                left = max(0.001, connect_timeout_s - (time.monotonic() - began))
                connection = await self._connect(key, left)
        except BaseException:
            self._slots.release()
            raise
        self._in_use.add(connection)
        exchange = self._exchange_type(connection, self._loop)
        connection.exchange = exchange
        connection.resume_reading()
        head = [f"POST {path} HTTP/1.1", f"Host: {netloc}"]
        if body is not None:
            head.append(f"Content-Length: {len(body)}")
        head.extend(f"{name}: {value}" for name, value in headers.items())
        assert connection.transport is not None
        connection.transport.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b""))
        return exchange

    async def _connect(self, key: tuple[str, int], timeout_s: float) -> Connection:
        loop = asyncio.get_running_loop()
        self._connecting[key] = self._connecting.get(key, 0) + 1
        try:
            async with asyncio.timeout(timeout_s):
                _, connection = await loop.create_connection(lambda: Connection(self, key), key[0], key[1])
        except TimeoutError:
            raise ConnectFailed(f"no connection within {timeout_s:.3g}s") from None
        except OSError as exc:
            raise ConnectFailed(f"{type(exc).__name__}: {exc}") from None
        finally:
            self._connecting[key] -= 1
        self._open.add(connection)
        return connection

    def _free(self, connection: Connection) -> None:
        if connection in self._in_use:
            self._in_use.discard(connection)
            self._slots.release()

    def put_back(self, connection: Connection) -> None:
        connection.exchange = None
        self._free(connection)
        idle = self._idle.setdefault(connection.key, [])
        if len(idle) >= self._max_idle or connection.transport is None or connection.transport.is_closing():
            connection.abort()
            return
        connection.idle_since = self._loop.time()
        idle.append(connection)
        if self._sweep is None:
            self._sweep = self._loop.call_at(connection.idle_since + self.idle_timeout_s, self._close_expired)

    def _close_expired(self) -> None:
        self._sweep = None
        # The tolerance absorbs a timer that fires a clock tick early; it is not part of the timeout.
        deadline = self._loop.time() - self.idle_timeout_s + 0.001
        next_expiry: float | None = None
        for idle in self._idle.values():
            # Oldest first: put_back appends and send() takes from the end.
            expired = 0
            while expired < len(idle) and idle[expired].idle_since <= deadline:
                expired += 1
            stale, idle[:] = idle[:expired], idle[expired:]
            for connection in stale:
                connection.abort()
            if idle and (next_expiry is None or idle[0].idle_since < next_expiry):
                next_expiry = idle[0].idle_since
        if next_expiry is not None:
            self._sweep = self._loop.call_at(next_expiry + self.idle_timeout_s, self._close_expired)

    def lost(self, connection: Connection) -> None:
        self._free(connection)
        self._open.discard(connection)
        idle = self._idle.get(connection.key)
        if idle and connection in idle:
            idle.remove(connection)

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def connections(self) -> dict[tuple[str, int], tuple[int, int, int]]:
        """(idle, in use, being opened) per replica address: every socket the pool holds."""
        open_: dict[tuple[str, int], int] = {}
        for connection in self._open:
            open_[connection.key] = open_.get(connection.key, 0) + 1
        counts: dict[tuple[str, int], tuple[int, int, int]] = {}
        for key in open_.keys() | self._connecting.keys():
            idle = sum(1 for c in self._idle.get(key, ()) if c in self._open)
            counts[key] = (idle, open_.get(key, 0) - idle, self._connecting.get(key, 0))
        return counts

    def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for connection in list(self._open):
            connection.abort()
        self._idle.clear()
