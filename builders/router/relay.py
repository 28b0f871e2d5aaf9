"""The relay: a stream's events from its replica to its client, after dispatch has opened the stream.

`Pump` owns the client side of one stream (the response, the write buffer, the cut timeout, how the stream
ends); `Relay` moves each event inside the replica connection's data_received, or hands the C relay
(builders/router/_fastrelay.c) the reads it can take; `EventFramer` passes on whole SSE events only.
This module does not import the app (builders/router/app.py): what it needs is handed to `Pump`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import time
from bisect import bisect_left
from typing import Any

from aiohttp import web

from builders.router.call import Call, abort_upstream
from builders.router.classify import Classifier
from builders.router.config import RouterConfig
from builders.router.front import FastRequest, FastStream
from builders.router.native import NativeRelay
from builders.router.openai_request import Endpoint
from builders.router.prometheus import HistogramSeries
from builders.router.replicas import Replica
from builders.router.router_metrics import RouterMetrics
from builders.router.stats import StreamStats
from builders.router.upstream import Exchange

_RESPONSES = Endpoint.RESPONSES
"""A module constant: an enum member looked up on its class is a Python call in 3.11, and this runs per stream."""


class StreamCut(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ClientGone(Exception):
    pass


class InvalidStream(Exception):
    pass


class Pump:
    """Moves a stream's events from its replica to its client once dispatch has opened it: the response, the
    client's write buffer and its flow control, the relay, and how the stream ends (whole, cut, or with an
    SSE error event).

    What it needs of the router is handed in, not looked up: the relay runs per event, and this module must
    not import the app.
    """

    def __init__(
        self,
        config: RouterConfig,
        metrics: RouterMetrics,
        classifier: Classifier,
        stats: StreamStats,
        native: type[NativeRelay] | None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.classifier = classifier
        self.stats = stats
        self.native_relay = native
        """The C relay's type (builders/router/_fastrelay.c), or None where it is not built or switched off."""
        self.write_low = config.stream_buffer_bytes // 8
        """The client transport's low-water mark: writes that stay under it never wait (send)."""
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the router's event loop is known only while the app runs")
        return self._loop

    def prepare_transport(self, request: web.Request | FastRequest) -> asyncio.Transport:
        transport = request.transport
        if transport is None:
            raise ClientGone
        if isinstance(request, FastRequest):
            # A fast connection stays with the front end, so what is set here holds for all its streams:
            # once per connection saves a setsockopt and a socket object per request.
            if request.connection.streams_prepared:
                return transport
            request.connection.streams_prepared = True
        limit = self.config.stream_buffer_bytes
        # Pausing at half the limit and never accepting a chunk over the other half keeps the buffer
        # under the limit: each write starts from at most `high` bytes.
        transport.set_write_buffer_limits(high=limit // 2, low=self.write_low)
        sndbuf = self.config.client_sndbuf_bytes
        sock = transport.get_extra_info("socket")
        if sndbuf is not None and sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        return transport

    async def send(
        self, call: Call, resp: web.StreamResponse | FastStream, transport: asyncio.Transport, data: bytes
    ) -> None:
        """Write data in slices, each followed by a wait until the client drains below the low-water mark.

        Slices of a quarter of the limit, written onto at most half of it, keep the buffer under the limit
        however much the replica sent at once.
        """
        cfg = self.config
        piece = max(1, cfg.stream_buffer_bytes // 4)
        for start in range(0, len(data), piece):
            chunk = data[start : start + piece]
            if transport.is_closing():
                raise ClientGone
            buffered = transport.get_write_buffer_size()
            if buffered + len(chunk) > cfg.stream_buffer_bytes:
                raise StreamCut("overflow")
            if buffered + len(chunk) <= self.write_low:
                # A client that keeps up: after this write the buffer is still at or under the low-water
                # mark, so the transport is not paused, neither the write nor a drain can wait, and no
                # timer is needed. Nearly every event of a healthy stream takes this path.
                if call.head_sent:
                    # The same chunk framing aiohttp's writer would produce, without its coroutine and
                    # bookkeeping: on a 32-event stream that was a third of the router's own CPU.
                    transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                else:
                    # The first write goes through aiohttp, which sends the response head with it.
                    try:
                        await resp.write(chunk)
                    except ConnectionError:
                        raise ClientGone from None
                    call.head_sent = True
                buffered = transport.get_write_buffer_size()
                if buffered > self.stats.stream_buffer_peak:
                    self.stats.stream_buffer_peak = buffered
                continue
            began = time.monotonic()
            try:
                await asyncio.wait_for(resp.write(chunk), timeout=cfg.stream_cut_timeout_s)
                call.head_sent = True
                buffered = transport.get_write_buffer_size()
                self.stats.stream_buffer_peak = max(self.stats.stream_buffer_peak, buffered)
                remaining = cfg.stream_cut_timeout_s - (time.monotonic() - began)
                request = call.request
                drain = request.drain() if isinstance(request, FastRequest) else request.writer.drain()
                await asyncio.wait_for(drain, timeout=max(0.001, remaining))
            except TimeoutError:
                self.classifier.mark_slow(call.client_id)
                raise StreamCut("stalled") from None
            except ConnectionError:
                raise ClientGone from None
            if time.monotonic() - began > cfg.slow_client.stall_s:
                self.classifier.mark_slow(call.client_id)

    async def pump(
        self, call: Call, replica: Replica, upstream: Exchange, first: bytes
    ) -> web.StreamResponse | FastStream:
        request = call.request
        headers = call.headers(replica)
        headers.update({"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        resp: web.StreamResponse | FastStream
        if isinstance(request, FastRequest):
            resp = FastStream(request, 200, headers)
        else:
            resp = web.StreamResponse(status=200, headers=headers)
        events = EventFramer(max_pending=self.config.stream_buffer_bytes // 2, itl=call.series.itl)
        relay: Relay | None = None
        try:
            transport = self.prepare_transport(request)
            if isinstance(resp, web.StreamResponse) and isinstance(request, web.Request):
                # A FastStream needs no preparing: its head goes out with its first write, as aiohttp's does.
                await resp.prepare(request)
            call.series.ttft.observe(time.monotonic() - call.started)
            failure: tuple[str, int, str] | None = None
            call.last_upstream = now = time.monotonic()
            try:
                complete = events.feed(first, now)
            except InvalidStream as exc:
                failure = ("upstream_error", 502, f"replica {replica.url} sent {exc}")
            else:
                if complete:
                    # Through aiohttp, which sends the response head with it.
                    await self.send(call, resp, transport, complete)
                    call.delivered = events.done
            if failure is None:
                relay = Relay(self, call, replica, upstream, events, transport, hold_done=isinstance(resp, FastStream))
                while True:
                    if relay.gone:
                        raise ClientGone
                    if relay.backlog:
                        # The client fell behind: the replica is paused while this waits for it.
                        data = b"".join(relay.backlog)
                        relay.backlog.clear()
                        await self.send(call, resp, transport, data)
                        call.delivered = events.done
                        relay.resume()
                        continue
                    if relay.failure is not None or relay.ended:
                        break
                    await relay.news()
                # Before the exchange is released or aborted: the connection must have its transport back.
                relay.close()
                failure = relay.failure
                if failure is None and upstream.error is not None:
                    if call.stop_kind is not None:
                        failure = (call.stop_kind, 503, call.stop_reason or "interrupted")
                    else:
                        failure = ("upstream_died", 502, f"replica {replica.url} failed mid-stream ({upstream.error})")
            if failure is None:
                rest = events.flush()
                if call.parsed.endpoint is _RESPONSES:
                    # vLLM's Responses API sends no [DONE]: the relay loop ended on the replica's complete message.
                    if rest:
                        failure = ("upstream_error", 502, f"replica {replica.url} ended the stream mid-event")
                    else:
                        call.delivered = True
                elif rest or not events.done:
                    failure = ("upstream_error", 502, f"replica {replica.url} ended the stream without data: [DONE]")
            if failure is not None and call.delivered:
                # The replica failed after its [DONE]: the client's answer is whole, an error would only confuse.
                failure = None
            if failure is None:
                upstream.release()
            else:
                # A partial event is dropped so the client's parser sees only whole events.
                kind, code, message = failure
                self.metrics.errors.inc({**call.labels, "kind": kind})
                abort_upstream(self.metrics, call, upstream)
                error = {
                    "message": message,
                    "type": kind,
                    "code": code,
                    "class": call.decision.request_class.value,
                    "pool": call.pool.name,
                    "replica": replica.url,
                }
                await self.send(call, resp, transport, sse_event({"error": error}) + b"data: [DONE]\n\n")
            try:
                held = relay.take_held() if relay is not None else b""
                if held and isinstance(resp, FastStream):
                    await resp.write_eof(last=held)
                else:
                    await resp.write_eof()
            except ConnectionError:
                # Many SSE clients close as soon as they read [DONE]; the answer was complete.
                if not call.delivered:
                    raise ClientGone from None
        except StreamCut as cut:
            self.metrics.stream_cuts.inc({"class": call.decision.request_class.value, "reason": cut.reason})
            self.metrics.errors.inc({**call.labels, "kind": "stream_cut"})
            abort_upstream(self.metrics, call, upstream)
            if request.transport is not None:
                request.transport.abort()
        except ClientGone:
            self.metrics.errors.inc({**call.labels, "kind": "client_gone"})
            abort_upstream(self.metrics, call, upstream)
        finally:
            if relay is not None:
                relay.close()
        return resp


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


_SSE_FIELD = re.compile(rb"(?:data|event|id|retry)(?::|$)|:|$")
DONE_EVENTS = (b"data: [DONE]\n\n", b"data:[DONE]\n\n", b"data: [DONE]\r\n\r\n", b"data:[DONE]\r\n\r\n")


def is_sse(complete: bytes, events: int) -> bool:
    """Whether whole events are Server-Sent Events: every line a field (data, event, id, retry) or a comment."""
    # vLLM sends one 'data:' line per event: two byte counts settle those without a split.
    if (
        complete.startswith(b"data:")
        and complete.count(b"\n") == 2 * events
        and complete.count(b"\n\ndata:") == events - 1
    ):
        return True
    return all(_SSE_FIELD.match(line) for line in complete.splitlines())


class Relay:
    """A stream's events from its replica to its client, moved inside the upstream's data_received.

    While the client keeps up (its write buffer stays under the low-water mark) each chunk is framed,
    timed and written synchronously, so the handler sleeps through the whole stream. Otherwise the
    replica's connection is paused and the chunk left in `backlog` for the handler, which sends it
    with the cut timeout (Pump.send) and resumes the replica: a slow reader holds a bounded buffer
    and blocks nobody else. The upstream idle timeout is one timer per idle period, re-armed from the
    last byte, and counts only while the replica is being read.

    on_body runs once per streamed token, so it is kept to the few operations each event needs: one clock
    read, the framer's one-event check, one write. Each Python operation here costs the router about a
    microsecond per event once the stream's objects compete for cache with 31 others (bench-router).

    Where the C relay is built (builders/router/native.py) it becomes the replica transport's protocol for
    the stream and does what on_body's one-event path does without running Python; any other read comes
    back here through the connection, unchanged. It may only take a read while `_fast_ok()` says nothing
    is held here, so this object tells it whenever that changes outside a read.
    """

    def __init__(
        self,
        pump: Pump,
        call: Call,
        replica: Replica,
        exchange: Exchange,
        events: EventFramer,
        transport: asyncio.Transport,
        *,
        hold_done: bool = False,
    ) -> None:
        loop = pump.loop
        self._loop = loop
        self._stats = pump.stats
        self._call = call
        self._replica = replica
        self._exchange = exchange
        self._events = events
        self._transport = transport
        self._itl = events.itl
        self._write_low = pump.write_low
        self._idle_s = pump.config.upstream_idle_timeout_s
        self.backlog: list[bytes] = []
        self.failure: tuple[str, int, str] | None = None
        self.ended = False
        self.gone = False
        self._stopped = False
        """failure or gone: the one test on_body makes before doing anything."""
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        """The replica is paused for the client: its silence does not count."""
        self._last_byte = time.monotonic()
        """When the replica last sent something or was resumed (time.monotonic)."""
        self._timer = loop.call_later(self._idle_s, self._check_silence)
        self._hold_done = hold_done
        """The response can send a held [DONE] with its terminating chunk (FastStream.write_eof(last=...))."""
        self.held = b""
        """The framed [DONE] event, held for one turn of the loop (on_body says why); the handler sends it."""
        self._flush_handle: asyncio.Handle | None = None
        exchange.sink = self.on_body
        exchange.on_end = self.on_end
        early = exchange.take()
        if early:
            self.on_body(early)
        if exchange.complete or exchange.error is not None:
            self.ended = True
        self._connection = exchange.connection
        self._native: NativeRelay | None = None
        native = pump.native_relay
        if native is not None and self._connection is not None:
            self._native = native(
                connection=self._connection,
                owner=self,
                call=call,
                events=events,
                transport=transport,
                itl=self._itl,
                router=pump.stats,
                write_low=self._write_low,
            )
            self._native.enabled = self._fast_ok()
            self._connection.divert(self._native)

    def _fast_ok(self) -> bool:
        """Whether the C relay may take the next read: nothing held or pending here, the stream not over,
        and the parser between two chunks (the C relay takes whole chunks only)."""
        events = self._events
        return (
            not (self._stopped or self.backlog or self._paused or self.ended or events.pending or events.done)
            and self._exchange.at_chunk_boundary
        )

    def on_body(self, data: bytes) -> None:
        if self._stopped:
            return
        if self.held:
            self._flush_held()  # bytes after [DONE] in the same read: [DONE] keeps its place before them
        self._call.last_upstream = now = time.monotonic()
        events = self._events
        transport = self._transport
        buffered = transport.get_write_buffer_size()
        if (
            # vLLM's usual chunk: one event of one data line, nothing held before it, a client keeping up.
            # Each Python operation here runs once per streamed token, so this path does only what such
            # an event needs: the framer's checks and ITL bookkeeping inline, one write.
            data.find(b"\n") == len(data) - 2
            and data.endswith(b"\n")
            and data.startswith(b"data:")
            and not events.pending
            and not self.backlog
            and buffered + len(data) <= self._write_low
            and not transport.is_closing()
        ):
            last = events.last_event
            events.last_event = now
            if last is not None:
                itl = self._itl
                itl.counts[bisect_left(itl.bounds, now - last)] += 1
                itl.total += now - last
            if len(data) < 16 and (data == b"data: [DONE]\n\n" or data == b"data:[DONE]\n\n"):
                events.done = True
                # From here a client that closes has its whole answer (SDK clients close on [DONE]); a held
                # [DONE] is written by the flush or by the handler, whichever comes first.
                self._call.delivered = True
                if self._hold_done:
                    # A replica's terminating chunk usually arrives in the same read as [DONE]: held for one
                    # turn of the loop, both go out in one write (the handler's write_eof), one system call
                    # per request fewer, as hyper does. If it does not arrive, _flush_held sends [DONE] at once.
                    self.held = b"%x\r\n%b\r\n" % (len(data), data)
                    self._flush_handle = self._loop.call_soon(self._flush_held)
                    return
            elif events.done:
                events.done = False  # an event after [DONE]: the last event decides, as in the framer
            # The chunk framing aiohttp's writer would produce; the response head went out with the first event.
            transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            self._relay_any(data, now)
        if buffered > self._stats.stream_buffer_peak:
            # Read before this write, so a peak shows at the next chunk: the buffer only drains meanwhile.
            self._stats.stream_buffer_peak = buffered

    def _relay_any(self, data: bytes, now: float) -> None:
        """on_body for anything but one whole event to a client that keeps up."""
        try:
            complete = self._events.feed(data, now)
        except InvalidStream as exc:
            self._fail(("upstream_error", 502, f"replica {self._replica.url} sent {exc}"))
            return
        if not complete:
            return
        transport = self._transport
        size = len(complete)
        if self.backlog or size + transport.get_write_buffer_size() > self._write_low:
            self.backlog.append(complete)
            self._exchange.pause_reading()
            self._paused = True
            self._wake()
        elif transport.is_closing():
            self.gone = self._stopped = True
            self._wake()
        else:
            transport.write(b"%x\r\n%b\r\n" % (size, complete))
            buffered = transport.get_write_buffer_size()
            if buffered > self._stats.stream_buffer_peak:
                self._stats.stream_buffer_peak = buffered
            if self._events.done:
                self._call.delivered = True

    def on_end(self) -> None:
        self.ended = True
        if self._flush_handle is not None:
            # The message ended in the read that brought [DONE]: the handler sends both in one write.
            self._flush_handle.cancel()
            self._flush_handle = None
        self._wake()

    def _flush_held(self) -> None:
        self._flush_handle = None
        held, self.held = self.held, b""
        if held and not self._transport.is_closing():
            self._transport.write(held)

    def take_held(self) -> bytes:
        """The held [DONE], for the handler to send with the terminating chunk (b"" if none is held)."""
        held, self.held = self.held, b""
        return held

    def resume(self) -> None:
        self._last_byte = time.monotonic()
        self._paused = False
        if self._native is not None:
            self._native.enabled = self._fast_ok()
        self._exchange.resume_reading()

    def _fail(self, failure: tuple[str, int, str]) -> None:
        self.failure = failure
        self._stopped = True
        if self._native is not None:
            self._native.enabled = False
        self._exchange.pause_reading()
        self._wake()

    def _check_silence(self) -> None:
        # The last byte's time lives on the call (on_body's one clock store); a resume counts as a byte.
        quiet = time.monotonic() - max(self._last_byte, self._call.last_upstream)
        # The tolerance absorbs a timer that fires a clock tick early; it is not part of the limit.
        if not self._paused and quiet >= self._idle_s - 0.001 and self.failure is None:
            self._fail(("upstream_died", 502, f"replica {self._replica.url} sent nothing for {self._idle_s}s"))
            return
        wait = self._idle_s if self._paused else self._idle_s - quiet
        self._timer = self._loop.call_later(max(0.001, wait), self._check_silence)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def news(self) -> None:
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def close(self) -> None:
        """Stop relaying; called once the stream is over (again in _pump's finally, where it does nothing)."""
        self._timer.cancel()
        self._exchange.sink = None
        self._exchange.on_end = None
        native, self._native = self._native, None
        if native is not None:
            assert self._connection is not None, "a native relay is made only for a live connection"
            # The connection gets its transport back before the exchange hands it to the pool or aborts it.
            self._connection.undivert()
            native.detach()
            self._stats.events_relayed_natively += native.relayed


class EventFramer:
    """Passes on whole SSE events only, and times them: each event's gap since the previous one goes to `itl`.

    Holding back a partial event costs nothing in latency (the client could not use it either) and
    lets a mid-stream failure append a clean error event. Bytes that are not SSE raise InvalidStream,
    so the client gets an error event instead of a 200 it cannot parse.
    """

    def __init__(self, *, max_pending: int, itl: HistogramSeries) -> None:
        self._max_pending = max_pending
        self.itl = itl
        self.pending = b""
        """Bytes of an event not complete yet."""
        self.last_event: float | None = None
        """When the last whole event was passed on (time.monotonic)."""
        self.done = False
        """The last whole event was data: [DONE]."""

    def feed(self, chunk: bytes, now: float) -> bytes:
        """The whole events that chunk completes (b"" if none). Relay.on_body does the same inline for a
        chunk of exactly one event."""
        data = self.pending + chunk if self.pending else chunk
        if data.endswith(b"\n\n"):
            end = len(data)
        else:
            found = ((data.rfind(b"\n\n"), 2), (data.rfind(b"\r\n\r\n"), 4))
            end = max((at + size for at, size in found if at >= 0), default=0)
        if end == 0 and len(data) > self._max_pending:
            raise InvalidStream(f"over {self._max_pending} bytes without an SSE event boundary")
        complete, self.pending = data[:end], data[end:]
        if not complete:
            return complete
        count = complete.count(b"\n\n") + complete.count(b"\r\n\r\n")
        if not is_sse(complete, count):
            raise InvalidStream("bytes that are not Server-Sent Events")
        self.done = complete.endswith(DONE_EVENTS)
        if self.last_event is not None:
            self.itl.observe(now - self.last_event)
        if count > 1:
            # Events read together reached the client together: their gap really is zero.
            self.itl.observe_repeated(0.0, count - 1)
        self.last_event = now
        return complete

    def flush(self) -> bytes:
        rest, self.pending = self.pending, b""
        return rest
