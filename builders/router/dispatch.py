"""Dispatch: a classified request to a replica of its pool, with failover before the first byte.

Choosing is the pool's (builders/router/replicas.py) and spilling to another pool the work-conserving rule's
(builders/router/work_conserving.py); this module tries the choice, retries on another replica while nothing
has reached the client, and answers: a whole response, or an opened stream handed to the relay
(builders/router/relay.py).
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web

from builders.router.call import (
    REPLICA_DOWN,
    SHUTTING_DOWN,
    Call,
    Opened,
    Waiting,
    abort_upstream,
    call_error,
    no_replica,
)
from builders.router.classify import Classifier, Decision
from builders.router.config import RouterConfig
from builders.router.front import FastRequest, FastStream
from builders.router.openai_request import ParsedRequest
from builders.router.relay import Pump
from builders.router.replicas import Pool, Replica
from builders.router.router_metrics import RouterMetrics
from builders.router.upstream import ConnectFailed, Exchange, UpstreamFailed, UpstreamPool
from builders.router.work_conserving import spill_target, with_priority


class Dispatcher:
    """Sends a classified request to its pool: chooses a replica, tries it, fails over before the first byte,
    and answers (a whole response, or a stream handed to the relay).

    Every call in flight is in `calls`, so a health check or a drain can interrupt one from outside its
    handler. The clients it sends with exist only while the app runs: the app hands them over in start().
    """

    def __init__(
        self,
        config: RouterConfig,
        pools: dict[str, Pool],
        metrics: RouterMetrics,
        classifier: Classifier,
        pump: Pump,
    ) -> None:
        self.config = config
        self.pools = pools
        self.metrics = metrics
        self.classifier = classifier
        self.pump = pump
        self.calls: set[Call] = set()
        self.shutting_down = False
        self._session: aiohttp.ClientSession | None = None
        self._upstream: UpstreamPool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, session: aiohttp.ClientSession, upstream: UpstreamPool, loop: asyncio.AbstractEventLoop) -> None:
        self._session, self._upstream, self._loop = session, upstream, loop

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the router's client session exists only while the app runs")
        return self._session

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the router's event loop is known only while the app runs")
        return self._loop

    @property
    def upstream(self) -> UpstreamPool:
        if self._upstream is None:
            raise RuntimeError("the router's upstream pool exists only while the app runs")
        return self._upstream

    def _failed_mid_response(self, call: Call, replica: Replica, exc: BaseException) -> web.Response:
        """The answer when a replica fails after it began answering: the interrupt's own reason where a health
        check or a drain stopped the call (503), else the replica died (502). One place for both the streamed and
        the whole-body paths, so they cannot drift apart."""
        if call.stop_kind is not None:
            return call_error(self.metrics, call, 503, call.stop_kind, call.stop_reason or "interrupted")
        return call_error(
            self.metrics,
            call,
            502,
            "upstream_died",
            f"replica {replica.url} failed while sending its response ({type(exc).__name__})",
            replica=replica.url,
        )

    def upstream_headers(self) -> dict[str, str]:
        # identity: compressing a token stream only adds latency on loopback.
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        if self.config.upstream_api_key:
            headers["Authorization"] = f"Bearer {self.config.upstream_api_key}"
        return headers

    async def dispatch(
        self,
        request: web.Request | FastRequest,
        raw: bytes,
        parsed: ParsedRequest,
        decision: Decision,
        started: float,
    ) -> web.StreamResponse | FastStream:
        pool = spill_target(
            self.pools[self.config.pool_for(decision.request_class)],
            self.pools,
            self.config.spill,
            prompt_tokens=parsed.token_estimate,
            max_prompt_tokens=self.config.spill_max_prompt_tokens,
        )
        call = Call(
            request=request,
            raw=with_priority(raw, decision.request_class, self.config.class_priority),
            parsed=parsed,
            decision=decision,
            pool=pool,
            series=self.metrics.by_class[decision.request_class.value],
            started=started,
            client_id=self.classifier.client_id(request.headers),
        )
        call.series.requests.inc()
        call.series.in_flight.inc()
        self.calls.add(call)
        try:
            return await (self._stream(call) if parsed.stream else self._unary(call))
        except asyncio.CancelledError:
            # The client went away (aiohttp cancels its handler); unwinding closes the upstream
            # connection, which makes the replica abort the request instead of finishing it for nobody.
            # A client that closes once it has [DONE] (as SDK clients do) left after a complete answer.
            if not call.delivered:
                self.metrics.errors.inc({**call.labels, "kind": "client_gone"})
            raise
        finally:
            self.calls.discard(call)
            call.series.in_flight.dec()
            call.series.e2e.observe(time.monotonic() - started)

    def interrupt(self, call: Call, kind: str, reason: str) -> None:
        """Stop a call's upstream wait from outside its handler; the handler answers with an error."""
        if call.stop_kind is not None:
            return
        call.stop_kind, call.stop_reason = kind, reason
        if call.waiting is not None:
            call.waiting.interrupt()
            self.metrics.upstream_aborts.inc(call.labels)
        if call.upstream is not None:
            # The handler's pending read fails at once with a connection error.
            abort_upstream(self.metrics, call, call.upstream)

    def _stopped(self, call: Call) -> str | web.Response:
        """What an interrupted attempt returns: a reason to fail over, or the final 503."""
        reason = call.stop_reason or "interrupted"
        if call.stop_kind == REPLICA_DOWN and not self.shutting_down:
            # Before the first byte the request may still go to another healthy replica.
            call.stop_kind = call.stop_reason = None
            return reason
        return call_error(self.metrics, call, 503, call.stop_kind or SHUTTING_DOWN, reason)

    async def _open(self, call: Call) -> tuple[Opened | web.Response, Replica | None]:
        """Send the request to replicas of the pool until one answers; failover happens only here.

        Returns the outcome and the replica whose in_flight count stays raised until the caller ends.
        """
        while True:
            if self.shutting_down:
                return call_error(self.metrics, call, 503, SHUTTING_DOWN, "the router is shutting down"), None
            replica, _by_affinity = call.pool.choose(call.decision.prefix, exclude=call.tried)
            if replica is None:
                return no_replica(self.metrics, call), None
            call.tried.append(replica.url)
            call.replica = replica
            call.last_upstream = time.monotonic()
            replica.in_flight += 1
            try:
                # Streams go straight to their own attempt: one coroutine less to pass on every resume.
                if call.parsed.stream:
                    outcome = await self._attempt_stream(call, replica, call.started + self.config.first_byte_timeout_s)
                else:
                    outcome = await self._attempt(call, replica)
            except BaseException:
                # Cancelled (client gone) mid-attempt: nobody else will lower the count.
                replica.in_flight -= 1
                call.replica = None
                raise
            if not isinstance(outcome, str):
                if not isinstance(outcome, Opened):
                    call.replica = None
                return outcome, replica
            replica.in_flight -= 1
            call.replica = None
            call.failures.append(f"{replica.url}: {outcome}")
            self.metrics.failovers.inc(call.labels)

    async def _attempt(self, call: Call, replica: Replica) -> Opened | web.Response | str:
        """One try on one replica for a non-streamed request: a final answer or the reason to try the next one."""
        cfg = self.config
        deadline = call.started + cfg.first_byte_timeout_s
        url = f"{replica.url}{call.parsed.endpoint.value}"
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s, connect=cfg.connect_timeout_s)
        upstream: aiohttp.ClientResponse | None = None
        try:
            with Waiting(call, deadline - time.monotonic(), self.loop) as waiting:
                upstream = await self.session.post(url, data=call.raw, headers=self.upstream_headers(), timeout=timeout)
        except asyncio.CancelledError:
            self.metrics.upstream_aborts.inc(call.labels)
            raise
        except (aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
            replica.mark_down(f"connect failed: {exc}")
            return f"connect failed ({type(exc).__name__})"
        except (aiohttp.ClientError, OSError) as exc:
            return f"failed before any byte ({type(exc).__name__})"
        ended = self._wait_outcome(call, waiting, upstream)
        if ended is not None:
            return ended
        assert upstream is not None, "_wait_outcome answers for a wait that left no response"
        if upstream.status >= 500:
            # Only the status: the replica's error text can carry paths and internals.
            upstream.close()
            return f"answered {upstream.status}"
        call.upstream = upstream
        return await self._read_whole(call, replica, upstream, deadline)

    async def _attempt_stream(self, call: Call, replica: Replica, deadline: float) -> Opened | web.Response | str:
        """_attempt for a streamed request, on the router's own client (builders/router/upstream.py).

        Sending, the response head and the first body bytes are waited for in one Waiting: the first-byte
        deadline covers all three, and an interrupt may end any of them.
        """
        exchange: Exchange | None = None
        first = b""
        try:
            with Waiting(call, deadline - time.monotonic(), self.loop) as waiting:
                exchange = await self.upstream.send(
                    replica.url,
                    call.parsed.endpoint.value,
                    call.raw,
                    self.upstream_headers(),
                    self.config.connect_timeout_s,
                )
                await exchange.head()
                if exchange.status == 200:
                    # The first event usually arrives with the head: taking what is buffered saves a wait.
                    first = exchange.take() or await exchange.body_chunk()
        except asyncio.CancelledError:
            self.metrics.upstream_aborts.inc(call.labels)
            if exchange is not None:
                exchange.close()
            raise
        except ConnectFailed as exc:
            replica.mark_down(f"connect failed: {exc}")
            return f"connect failed ({exc})"
        except UpstreamFailed as exc:
            if exchange is not None:
                exchange.close()
            if call.interrupted():
                return self._stopped(call)
            if exchange is not None and exchange.status:
                return f"died before the first byte ({exc})"
            return f"failed before any byte ({exc})"
        ended = self._wait_outcome(call, waiting, exchange)
        if ended is not None:
            return ended
        assert exchange is not None, "_wait_outcome answers for a wait that left no response"
        if exchange.status >= 500:
            # Only the status: the replica's error text can carry paths and internals.
            exchange.close()
            return f"answered {exchange.status}"
        call.upstream = exchange
        if exchange.status != 200:
            return await self._read_exchange(call, replica, exchange, deadline)
        if not first:
            exchange.close()
            return "closed the stream before the first byte"
        return Opened(replica=replica, upstream=exchange, first_chunk=first)

    def _wait_outcome(
        self, call: Call, waiting: Waiting, upstream: aiohttp.ClientResponse | Exchange | None
    ) -> web.Response | str | None:
        """What an attempt's wait that ended without an error means: None to go on with `upstream`, else the
        504 of a first-byte timeout or what an interrupt leaves (a reason to fail over, or the final 503)."""
        if waiting.expired:
            self.metrics.upstream_aborts.inc(call.labels)
            if upstream is not None:
                upstream.close()
            return self._first_byte_timeout(call)
        if waiting.cut or upstream is None:
            # interrupt() counted the abort.
            if upstream is not None:
                upstream.close()
            return self._stopped(call)
        if call.interrupted():
            # Interrupted between two attempts, when there was no wait to end.
            abort_upstream(self.metrics, call, upstream)
            return self._stopped(call)
        return None

    async def _read_exchange(self, call: Call, replica: Replica, exchange: Exchange, deadline: float) -> web.Response:
        """A streamed request's answer that is not a stream (an upstream 4xx): read it all, bounded, and pass it on."""
        limit = self.config.max_response_bytes
        try:
            body = await asyncio.wait_for(
                exchange.read_body(limit),
                timeout=max(self.config.upstream_idle_timeout_s, deadline - time.monotonic()),
            )
        except asyncio.CancelledError:
            abort_upstream(self.metrics, call, exchange)
            raise
        except (UpstreamFailed, TimeoutError) as exc:
            exchange.close()
            return self._failed_mid_response(call, replica, exc)
        finally:
            call.upstream = None
        if body is None:
            return call_error(
                self.metrics, call, 502, "upstream_error", f"replica {replica.url} sent more than {limit} bytes"
            )
        exchange.release()
        headers = call.headers(replica)
        headers["Content-Type"] = exchange.content_type or "application/json"
        return web.Response(status=exchange.status, body=body, headers=headers)

    def _first_byte_timeout(self, call: Call) -> web.Response:
        # No failover here: the replica may still be working on it, and a retry would double the load.
        return call_error(
            self.metrics,
            call,
            504,
            "first_byte_timeout",
            f"no first byte from pool {call.pool.name!r} within {self.config.first_byte_timeout_s}s",
        )

    async def _read_whole(
        self, call: Call, replica: Replica, upstream: aiohttp.ClientResponse, deadline: float
    ) -> web.Response:
        """A non-streamed answer (or an upstream 4xx): read it all, bounded, then answer the client."""
        limit = self.config.max_response_bytes
        chunks: list[bytes] = []
        size = 0
        try:
            while True:
                chunk = await asyncio.wait_for(
                    upstream.content.read(65536),
                    timeout=max(self.config.upstream_idle_timeout_s, deadline - time.monotonic()),
                )
                if not chunk:
                    break
                call.last_upstream = time.monotonic()
                size += len(chunk)
                if size > limit:
                    upstream.close()
                    return call_error(
                        self.metrics, call, 502, "upstream_error", f"replica {replica.url} sent more than {limit} bytes"
                    )
                chunks.append(chunk)
        except asyncio.CancelledError:
            abort_upstream(self.metrics, call, upstream)
            raise
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            upstream.close()
            return self._failed_mid_response(call, replica, exc)
        finally:
            upstream.release()
            call.upstream = None
        headers = call.headers(replica)
        headers["Content-Type"] = upstream.headers.get("Content-Type", "application/json")
        if upstream.status == 200:
            call.pool.remember(call.decision.prefix, replica)
            replica.served += 1
        return web.Response(status=upstream.status, body=b"".join(chunks), headers=headers)

    async def _unary(self, call: Call) -> web.Response:
        outcome, held = await self._open(call)
        try:
            if isinstance(outcome, Opened):
                # _attempt only opens a stream for streamed requests; this is a guard, not a path.
                outcome.upstream.close()
                return call_error(
                    self.metrics, call, 502, "upstream_error", "replica opened a stream for a non-streamed request"
                )
            if outcome.status == 200:
                # The whole body is the first byte a non-streamed client gets.
                call.series.ttft.observe(time.monotonic() - call.started)
            return outcome
        finally:
            if held is not None:
                held.in_flight -= 1

    # --- streaming -------------------------------------------------------------------------------

    async def _stream(self, call: Call) -> web.StreamResponse | FastStream:
        outcome, held = await self._open(call)
        try:
            if not isinstance(outcome, Opened):
                return outcome
            replica, upstream = outcome.replica, outcome.upstream
            call.pool.remember(call.decision.prefix, replica)
            replica.served += 1
            self.pump.stats.streams_active += 1
            try:
                return await self.pump.pump(call, replica, upstream, outcome.first_chunk)
            finally:
                self.pump.stats.streams_active -= 1
                if call.delivered:
                    # [DONE] reached the client: nothing is left to abort, whatever ended the handler.
                    upstream.close()
                else:
                    # A cancelled handler (the client left) ends here too: that is an abort.
                    abort_upstream(self.metrics, call, upstream)
                call.upstream = None
        finally:
            call.replica = None
            if held is not None:
                held.in_flight -= 1
