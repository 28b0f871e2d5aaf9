"""The router service: an aiohttp server in front of vLLM pools.

Streamed requests go through the router's own client (builders/router/upstream.py), whose relay
writes each event to the client inside the replica connection's data_received; non-streamed
requests, /v1/models and health checks use aiohttp's client.

Guarantees it keeps:
- failover to another healthy replica of the same pool only before the first response byte;
- after the first byte an upstream failure ends the stream with an SSE error event, never a hang;
- a stream never holds more than ``stream_buffer_bytes`` for its client: upstream is read only as fast
  as the client drains, and a client that stalls past ``stream_cut_timeout_s`` is cut and its
  upstream request aborted (its connection closed, which makes vLLM abort the sequence);
- when nothing can serve, a 503 JSON error at once;
- a request waiting on a replica that its health check marks down is released at once (failover
  before the first byte, else an SSE error event or 503), and a drain on SIGTERM ends each stream
  still running after the grace with an SSE error event.

docs/router.md lists every promise and the test that keeps it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import hmac
import json
import math
import re
import socket
import sys
import time
from bisect import bisect_left
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from builders.errors import ListenFailed
from builders.router.classes import ALL_CLASSES, RequestClass
from builders.router.classify import Classifier, Decision
from builders.router.config import RouterConfig
from builders.router.discovery import Change, Membership, Resolver, discoverers, system_resolver
from builders.router.front import FastRequest, FastStream, Front
from builders.router.native import NativeRelay, native_relay, relay_name
from builders.router.openai_request import BadRequest, Endpoint, ParsedRequest, parse_request
from builders.router.prometheus import CONTENT_TYPE, HistogramSeries
from builders.router.replicas import Pool, Replica
from builders.router.router_metrics import ClassSeries, RouterMetrics
from builders.router.stats import HEALTH, STREAM, UNARY, StreamStats, connector_connections, pool_connections, publish
from builders.router.upstream import ConnectFailed, Exchange, UpstreamFailed, UpstreamPool
from builders.router.work_conserving import spill_target, with_priority

HEADER_POOL = "x-forge-pool"
HEADER_REPLICA = "x-forge-replica"
HEADER_CLASS = "x-forge-class"

ROUTER_KEY: web.AppKey[Router] = web.AppKey("router")


def json_error(status: int, message: str, kind: str, **extra: Any) -> web.Response:
    error: dict[str, Any] = {"message": message, "type": kind, "code": status}
    error.update(extra)
    return web.json_response({"error": error}, status=status)


class _StreamCut(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _ClientGone(Exception):
    pass


class _InvalidStream(Exception):
    pass


# Why a call was stopped from outside its handler: its replica went down, or the router is shutting down.
REPLICA_DOWN = "replica_down"
SHUTTING_DOWN = "shutting_down"


class _Waiting:
    """The handler's wait for one upstream attempt, which the first-byte deadline or interrupt() may end early.

    Both end it by cancelling the handler's own task and taking the cancellation back on the way out
    (Task.uncancel), as asyncio.timeout does: the attempt needs no task of its own and no asyncio.wait
    around it (together about 6 µs per request). A cancellation from anywhere else (the client went
    away) is left to propagate.
    """

    __slots__ = ("_call", "_task", "_timer", "cut", "expired")

    def __init__(self, call: _Call, timeout_s: float, loop: asyncio.AbstractEventLoop) -> None:
        # Given the loop, current_task() skips get_running_loop() and its getpid() system call.
        task = asyncio.current_task(loop)
        assert task is not None, "an attempt runs in its handler's task"
        self._call = call
        self._task = task
        self._timer = loop.call_later(max(0.001, timeout_s), self._expire)
        self.expired = False
        """The first-byte deadline passed."""
        self.cut = False
        """interrupt() stopped the wait (replica marked down, drain)."""

    def __enter__(self) -> _Waiting:
        self._call.waiting = self
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        self._timer.cancel()
        self._call.waiting = None
        if kind is asyncio.CancelledError and (self.expired or self.cut):
            # Ours to take back unless someone else cancelled the handler too.
            return self._task.uncancel() == 0
        if self.expired or self.cut:
            # The attempt caught the CancelledError itself and ended normally: the request to cancel is
            # still counted on the task, and is taken back so that later uncancel() checks add up.
            self._task.uncancel()
        return False

    def _expire(self) -> None:
        if not self.cut:
            self.expired = True
            self._task.cancel()

    def interrupt(self) -> None:
        if not (self.expired or self.cut):
            self.cut = True
            self._task.cancel()


@dataclass(kw_only=True, eq=False)
class _Call:
    """One routed request as it goes through the router (hashed by identity: the router keeps a set)."""

    request: web.Request | FastRequest
    raw: bytes
    parsed: ParsedRequest
    decision: Decision
    pool: Pool
    series: ClassSeries
    started: float
    client_id: str | None
    tried: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    replica: Replica | None = None
    """The replica being tried or streamed from, so a health check that marks it down can find the call."""
    waiting: _Waiting | None = None
    """The handler's wait for an upstream attempt, while one is on: interrupt() ends it."""
    upstream: aiohttp.ClientResponse | Exchange | None = None
    last_upstream: float = 0.0
    """When the replica last sent something (or the attempt began): a health check spares a flowing stream."""
    stop_kind: str | None = None
    stop_reason: str | None = None
    head_sent: bool = False
    """The streamed response's head is on the client's transport, so chunks may be framed and written there."""
    delivered: bool = False
    """The whole answer, [DONE] included, reached the client's socket: a close after this is normal."""

    def interrupted(self) -> bool:
        # A call, not a field test: interrupt() sets stop_kind while the handler awaits, which a type
        # checker's narrowing cannot see.
        return self.stop_kind is not None

    @property
    def labels(self) -> dict[str, str]:
        return {"class": self.decision.request_class.value, "pool": self.pool.name}

    @property
    def class_label(self) -> dict[str, str]:
        return {"class": self.decision.request_class.value}

    def headers(self, replica: Replica | None = None) -> dict[str, str]:
        headers = {HEADER_CLASS: self.decision.request_class.value, HEADER_POOL: self.pool.name}
        if replica is not None:
            headers[HEADER_REPLICA] = replica.url
        return headers


@dataclass(kw_only=True)
class _Opened:
    replica: Replica
    upstream: Exchange
    first_chunk: bytes


def _connector(*, limit: int, limit_per_host: int, idle_s: float) -> aiohttp.TCPConnector:
    # aiohttp sweeps its idle connections every keepalive_timeout and closes those idle longer than that,
    # so one lives between one and two of them: half the pool's timeout keeps it within the timeout.
    # No rounding of the sweep's time up to a whole second (timeout_ceil_threshold), which would add one.
    return aiohttp.TCPConnector(
        limit=limit, limit_per_host=limit_per_host, keepalive_timeout=idle_s / 2, timeout_ceil_threshold=math.inf
    )


class Router:
    """State shared by the handlers: config, pools, classifier memories, metrics, the upstream session."""

    def __init__(self, config: RouterConfig, *, resolver: Resolver = system_resolver) -> None:
        self.config = config
        self.classifier = Classifier(config)
        self.pools = {
            name: Pool(
                name=name,
                replicas=[Replica(pool=name, url=url) for url in urls],
                max_extra_in_flight=config.affinity_max_extra_in_flight,
                max_affinity_entries=config.prefix_cache_entries,
            )
            for name, urls in config.pools.items()
        }
        self.membership = Membership(self.pools, discoverers(config, resolver=resolver), self._membership_changed)
        self._discovery_task: asyncio.Task[None] | None = None
        self.metrics = RouterMetrics({c.value: config.pool_for(c) for c in ALL_CLASSES})
        self._session: aiohttp.ClientSession | None = None
        self._health_session: aiohttp.ClientSession | None = None
        self._upstream: UpstreamPool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._health_task: asyncio.Task[None] | None = None
        self.stats = StreamStats()
        self.count_clients: Callable[[], int] = lambda: 0
        """Client connections open now, fast and handed off (start_router knows both servers)."""
        self.calls: set[_Call] = set()
        self.shutting_down = False
        self._write_low = config.stream_buffer_bytes // 8
        """The client transport's low-water mark: writes that stay under it never wait (_send)."""
        self.native_relay = native_relay()
        """The C relay's type (builders/router/_fastrelay.c), or None where it is not built or switched off."""

    # --- lifecycle -------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_request_bytes)
        app[ROUTER_KEY] = self
        app.router.add_post(Endpoint.CHAT.value, self._chat)
        app.router.add_post(Endpoint.COMPLETIONS.value, self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        # Clients of an OpenAI API parse error bodies as JSON: 405 and 404 answer in the same shape.
        for path in (Endpoint.CHAT.value, Endpoint.COMPLETIONS.value, "/v1/models", "/health", "/metrics"):
            app.router.add_route("*", path, self._method_not_allowed)
        app.router.add_route("*", "/{path:.*}", self._not_found)
        app.cleanup_ctx.append(self._lifespan)
        return app

    async def _lifespan(self, _app: web.Application) -> AsyncIterator[None]:
        # Kept, not asked for: asyncio.get_running_loop() makes a getpid() system call each time (Python 3.11).
        self._loop = asyncio.get_running_loop()
        idle_s = self.config.upstream_pool_idle_timeout_s
        connector = _connector(limit=self.config.upstream_connection_limit, limit_per_host=0, idle_s=idle_s)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        # Health checks get connections of their own: queued behind busy streams for a pooled connection,
        # a check would time out and mark a healthy replica down exactly when it is serving most.
        # One connection per replica (limit_per_host), however many discovery finds.
        self._health_session = aiohttp.ClientSession(connector=_connector(limit=0, limit_per_host=1, idle_s=idle_s))
        self._upstream = UpstreamPool(
            limit=self.config.upstream_connection_limit,
            track_chunks=self.native_relay is not None,
            keep_alive=self.config.upstream_keep_alive,
            idle_timeout_s=idle_s,
        )
        if self.membership.dynamic:
            await self.membership.refresh_all()
            self._discovery_task = asyncio.create_task(self.membership.run())
        self._health_task = asyncio.create_task(self._health_loop())
        try:
            yield
        finally:
            if self._discovery_task is not None:
                self._discovery_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._discovery_task
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
            await self._health_session.close()
            await self._session.close()
            self._upstream.close()

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

    # --- health ----------------------------------------------------------------------------------

    async def check_replica(self, replica: Replica) -> None:
        timeout = aiohttp.ClientTimeout(total=self.config.health_timeout_s)
        if self._health_session is None:
            raise RuntimeError("the router's health session exists only while the app runs")
        try:
            async with self._health_session.get(f"{replica.url}/health", timeout=timeout) as resp:
                ok = resp.status == 200
                error = None if ok else f"GET /health answered {resp.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            ok, error = False, f"GET /health failed: {type(exc).__name__}: {exc}"
        replica.last_check = time.monotonic()
        if ok:
            replica.healthy = True
        else:
            replica.mark_down(error or "unhealthy")
            # Requests already waiting on it would otherwise wait out first_byte_timeout_s or
            # upstream_idle_timeout_s on a replica known to be gone. One that is still receiving bytes
            # is not hung, whatever /health says (a check can time out on a busy replica): it goes on.
            quiet_since = time.monotonic() - self.config.health_timeout_s
            for call in [c for c in self.calls if c.replica is replica and c.last_upstream <= quiet_since]:
                self.interrupt(call, REPLICA_DOWN, f"replica {replica.url} was marked down by its health check")

    async def _membership_changed(self, change: Change) -> None:
        added = ", ".join(r.url for r in change.added) or "none"
        removed = ", ".join(f"{r.url} ({r.in_flight} in flight, left to finish)" for r in change.removed) or "none"
        print(f"forge router: pool {change.pool}: joined {added}; left {removed}", file=sys.stderr, flush=True)
        # A new replica is checked at once rather than at the next round, so a wrong address is not chosen
        # for a whole health interval.
        await asyncio.gather(*(self.check_replica(r) for r in change.added))

    async def check_all(self) -> None:
        replicas = [r for pool in self.pools.values() for r in pool.replicas]
        await asyncio.gather(*(self.check_replica(r) for r in replicas))

    async def _health_loop(self) -> None:
        while True:
            await self.check_all()
            await asyncio.sleep(self.config.health_interval_s)

    # --- small handlers --------------------------------------------------------------------------

    def _refuse_unauthorized(self, headers: Mapping[str, str]) -> web.Response | None:
        """None when the request may pass, else the 401 (or 400 for a header that is not text) to send."""
        key = self.config.api_key
        if key is None:
            return None
        given = headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        try:
            # Headers arrive as UTF-8 with surrogate escapes; a key is ASCII (checked at config load).
            token_bytes = token.strip().encode("ascii")
        except UnicodeEncodeError:
            self.metrics.rejected.inc({"reason": "bad_request"})
            return json_error(
                400, "the Authorization header is not ASCII", "invalid_request_error", param="Authorization"
            )
        if scheme.lower() == "bearer" and token_bytes and hmac.compare_digest(token_bytes, key.encode()):
            return None
        self.metrics.rejected.inc({"reason": "unauthorized"})
        return json_error(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", "authentication_error")

    async def _method_not_allowed(self, request: web.Request) -> web.Response:
        return json_error(405, f"{request.method} is not allowed on {request.path}", "method_not_allowed")

    async def _not_found(self, request: web.Request) -> web.Response:
        return json_error(404, f"no such path: {request.path}", "not_found")

    def _upstream_headers(self) -> dict[str, str]:
        # identity: compressing a token stream only adds latency on loopback.
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        if self.config.upstream_api_key:
            headers["Authorization"] = f"Bearer {self.config.upstream_api_key}"
        return headers

    async def _health(self, _request: web.Request) -> web.Response:
        pools = {name: [r.as_json() for r in pool.replicas] for name, pool in self.pools.items()}
        serving = {name: any(r.healthy for r in pool.replicas) for name, pool in self.pools.items()}
        status = "ok" if all(serving.values()) else "degraded"
        return web.json_response({"status": status, "pools": pools, "pool_serving": serving})

    async def _metrics(self, _request: web.Request) -> web.Response:
        clients = {}
        if self._upstream is not None and self._session is not None and self._health_session is not None:
            clients = {
                STREAM: pool_connections(self._upstream),
                UNARY: connector_connections(self._session.connector if self._session else None),
                HEALTH: connector_connections(self._health_session.connector if self._health_session else None),
            }
        publish(
            self.metrics,
            self.pools,
            self.stats,
            clients,
            idle_timeout_s=self.config.upstream_pool_idle_timeout_s,
            client_connections=self.count_clients(),
        )
        return web.Response(body=self.metrics.render().encode(), headers={"Content-Type": CONTENT_TYPE})

    async def _models(self, request: web.Request) -> web.Response:
        refused = self._refuse_unauthorized(request.headers)
        if refused is not None:
            return refused
        timeout = aiohttp.ClientTimeout(total=self.config.health_timeout_s + self.config.connect_timeout_s)
        models: dict[str, Any] = {}
        answered: list[str] = []
        for pool in self.pools.values():
            ordered = sorted(pool.replicas, key=lambda r: not r.healthy)
            for replica in ordered:
                try:
                    async with self.session.get(
                        f"{replica.url}/v1/models", headers=self._upstream_headers(), timeout=timeout
                    ) as resp:
                        if resp.status != 200:
                            continue
                        body = await resp.json(content_type=None)
                except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
                    continue
                for model in body.get("data", []) if isinstance(body, dict) else []:
                    if isinstance(model, dict) and isinstance(model.get("id"), str):
                        models.setdefault(model["id"], model)
                answered.append(pool.name)
                break
        if not answered:
            return json_error(503, "no replica of any pool answered GET /v1/models", "no_replica_available")
        return web.json_response({"object": "list", "data": list(models.values())})

    # --- routed requests -------------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._route(request, Endpoint.CHAT)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._route(request, Endpoint.COMPLETIONS)

    async def route_fast(self, request: FastRequest, endpoint: Endpoint, raw: bytes) -> web.Response | FastStream:
        """A routed request from the fast front end (builders/router/front.py): its body is whole, not compressed,
        and under offload_parse_bytes, so it is parsed here on the loop."""
        started = time.monotonic()
        refused = self._refuse_unauthorized(request.headers)
        if refused is not None:
            return refused
        cfg = self.config
        try:
            parsed = parse_request(endpoint, raw, max_depth=cfg.max_json_depth, max_elements=cfg.max_json_elements)
            decision = self.classifier.classify(parsed, request.headers)
        except BadRequest as exc:
            return self.reject(400, exc.message, exc.param)
        answer = await self._dispatch(request, raw, parsed, decision, started)
        if isinstance(answer, FastStream | web.Response):
            return answer
        raise TypeError(f"a fast request was answered with a {type(answer).__name__}")

    async def _route(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        started = time.monotonic()
        refused = self._refuse_unauthorized(request.headers)
        if refused is not None:
            return refused
        cfg = self.config
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding != "identity":
            # A compressed body can inflate a thousandfold; the server does not decompress (auto_decompress
            # is off), and no OpenAI client compresses requests, so refusing costs nobody anything. aiohttp
            # then reads and drops the rest of the body (compressed, so cheap) for up to its lingering time.
            return self.reject(
                415, f"Content-Encoding {encoding!r} is not accepted; send the body uncompressed", "Content-Encoding"
            )
        try:
            async with asyncio.timeout(cfg.body_timeout_s):
                raw = await request.read()
            if len(raw) >= cfg.offload_parse_bytes:
                parsed = await asyncio.to_thread(
                    parse_request, endpoint, raw, max_depth=cfg.max_json_depth, max_elements=cfg.max_json_elements
                )
            else:
                parsed = parse_request(endpoint, raw, max_depth=cfg.max_json_depth, max_elements=cfg.max_json_elements)
            decision = self.classifier.classify(parsed, request.headers)
        except BadRequest as exc:
            return self.reject(400, exc.message, exc.param)
        except web.HTTPRequestEntityTooLarge:
            return self.reject(413, f"request body is over {cfg.max_request_bytes} bytes", "body")
        except TimeoutError:
            response = self.reject(408, f"request body did not arrive within {cfg.body_timeout_s}s", "body")
            # Sent now and the connection closed: aiohttp would otherwise linger up to 10 s reading the rest
            # of the body from a client already known to be too slow.
            await response.prepare(request)
            await response.write_eof()
            request.protocol.force_close()
            return response
        answer = await self._dispatch(request, raw, parsed, decision, started)
        if isinstance(answer, FastStream):
            raise TypeError("an aiohttp request was answered on the fast path")
        return answer

    async def _dispatch(
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
        call = _Call(
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

    def reject(self, status: int, message: str, param: str) -> web.Response:
        self.metrics.rejected.inc({"reason": "bad_request"})
        return json_error(status, message, "invalid_request_error", param=param)

    def interrupt(self, call: _Call, kind: str, reason: str) -> None:
        """Stop a call's upstream wait from outside its handler; the handler answers with an error."""
        if call.stop_kind is not None:
            return
        call.stop_kind, call.stop_reason = kind, reason
        if call.waiting is not None:
            call.waiting.interrupt()
            self.metrics.upstream_aborts.inc(call.labels)
        if call.upstream is not None:
            # The handler's pending read fails at once with a connection error.
            self._abort_upstream(call, call.upstream)

    def _stopped(self, call: _Call) -> str | web.Response:
        """What an interrupted attempt returns: a reason to fail over, or the final 503."""
        reason = call.stop_reason or "interrupted"
        if call.stop_kind == REPLICA_DOWN and not self.shutting_down:
            # Before the first byte the request may still go to another healthy replica.
            call.stop_kind = call.stop_reason = None
            return reason
        return self._error(call, 503, call.stop_kind or SHUTTING_DOWN, reason)

    def _error(self, call: _Call, status: int, kind: str, message: str, **extra: Any) -> web.Response:
        self.metrics.errors.inc({**call.labels, "kind": kind})
        response = json_error(
            status,
            message,
            kind,
            **{"class": call.decision.request_class.value, "pool": call.pool.name},
            **extra,
        )
        response.headers.update(call.headers())
        return response

    def _no_replica(self, call: _Call) -> web.Response:
        if call.failures:
            why = "every replica failed before answering: " + "; ".join(call.failures)
        else:
            why = "no healthy replica"
        return self._error(
            call,
            503,
            "no_replica_available",
            f"pool {call.pool.name!r} cannot serve class {call.decision.request_class.value!r}: {why}",
        )

    async def _open(self, call: _Call) -> tuple[_Opened | web.Response, Replica | None]:
        """Send the request to replicas of the pool until one answers; failover happens only here.

        Returns the outcome and the replica whose in_flight count stays raised until the caller ends.
        """
        while True:
            if self.shutting_down:
                return self._error(call, 503, SHUTTING_DOWN, "the router is shutting down"), None
            replica, _by_affinity = call.pool.choose(call.decision.prefix, exclude=call.tried)
            if replica is None:
                return self._no_replica(call), None
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
                if not isinstance(outcome, _Opened):
                    call.replica = None
                return outcome, replica
            replica.in_flight -= 1
            call.replica = None
            call.failures.append(f"{replica.url}: {outcome}")
            self.metrics.failovers.inc(call.labels)

    async def _attempt(self, call: _Call, replica: Replica) -> _Opened | web.Response | str:
        """One try on one replica for a non-streamed request: a final answer or the reason to try the next one."""
        cfg = self.config
        deadline = call.started + cfg.first_byte_timeout_s
        url = f"{replica.url}{call.parsed.endpoint.value}"
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s, connect=cfg.connect_timeout_s)
        upstream: aiohttp.ClientResponse | None = None
        try:
            with _Waiting(call, deadline - time.monotonic(), self.loop) as waiting:
                upstream = await self.session.post(
                    url, data=call.raw, headers=self._upstream_headers(), timeout=timeout
                )
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

    async def _attempt_stream(self, call: _Call, replica: Replica, deadline: float) -> _Opened | web.Response | str:
        """_attempt for a streamed request, on the router's own client (builders/router/upstream.py).

        Sending, the response head and the first body bytes are waited for in one _Waiting: the first-byte
        deadline covers all three, and an interrupt may end any of them.
        """
        exchange: Exchange | None = None
        first = b""
        try:
            with _Waiting(call, deadline - time.monotonic(), self.loop) as waiting:
                exchange = await self.upstream.send(
                    replica.url,
                    call.parsed.endpoint.value,
                    call.raw,
                    self._upstream_headers(),
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
        return _Opened(replica=replica, upstream=exchange, first_chunk=first)

    def _wait_outcome(
        self, call: _Call, waiting: _Waiting, upstream: aiohttp.ClientResponse | Exchange | None
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
            self._abort_upstream(call, upstream)
            return self._stopped(call)
        return None

    async def _read_exchange(self, call: _Call, replica: Replica, exchange: Exchange, deadline: float) -> web.Response:
        """A streamed request's answer that is not a stream (an upstream 4xx): read it all, bounded, and pass it on."""
        limit = self.config.max_response_bytes
        try:
            body = await asyncio.wait_for(
                exchange.read_body(limit),
                timeout=max(self.config.upstream_idle_timeout_s, deadline - time.monotonic()),
            )
        except asyncio.CancelledError:
            self._abort_upstream(call, exchange)
            raise
        except (UpstreamFailed, TimeoutError) as exc:
            exchange.close()
            if call.stop_kind is not None:
                return self._error(call, 503, call.stop_kind, call.stop_reason or "interrupted")
            return self._error(
                call,
                502,
                "upstream_died",
                f"replica {replica.url} failed while sending its response ({type(exc).__name__})",
                replica=replica.url,
            )
        finally:
            call.upstream = None
        if body is None:
            return self._error(call, 502, "upstream_error", f"replica {replica.url} sent more than {limit} bytes")
        exchange.release()
        headers = call.headers(replica)
        headers["Content-Type"] = exchange.content_type or "application/json"
        return web.Response(status=exchange.status, body=body, headers=headers)

    def _first_byte_timeout(self, call: _Call) -> web.Response:
        # No failover here: the replica may still be working on it, and a retry would double the load.
        return self._error(
            call,
            504,
            "first_byte_timeout",
            f"no first byte from pool {call.pool.name!r} within {self.config.first_byte_timeout_s}s",
        )

    async def _read_whole(
        self, call: _Call, replica: Replica, upstream: aiohttp.ClientResponse, deadline: float
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
                    return self._error(
                        call, 502, "upstream_error", f"replica {replica.url} sent more than {limit} bytes"
                    )
                chunks.append(chunk)
        except asyncio.CancelledError:
            self._abort_upstream(call, upstream)
            raise
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            upstream.close()
            if call.stop_kind is not None:
                return self._error(call, 503, call.stop_kind, call.stop_reason or "interrupted")
            return self._error(
                call,
                502,
                "upstream_died",
                f"replica {replica.url} failed while sending its response ({type(exc).__name__})",
                replica=replica.url,
            )
        finally:
            upstream.release()
            call.upstream = None
        headers = call.headers(replica)
        headers["Content-Type"] = upstream.headers.get("Content-Type", "application/json")
        if upstream.status == 200:
            call.pool.remember(call.decision.prefix, replica)
            replica.served += 1
        return web.Response(status=upstream.status, body=b"".join(chunks), headers=headers)

    async def _unary(self, call: _Call) -> web.Response:
        outcome, held = await self._open(call)
        try:
            if isinstance(outcome, _Opened):
                # _attempt only opens a stream for streamed requests; this is a guard, not a path.
                outcome.upstream.close()
                return self._error(call, 502, "upstream_error", "replica opened a stream for a non-streamed request")
            if outcome.status == 200:
                # The whole body is the first byte a non-streamed client gets.
                call.series.ttft.observe(time.monotonic() - call.started)
            return outcome
        finally:
            if held is not None:
                held.in_flight -= 1

    # --- streaming -------------------------------------------------------------------------------

    async def _stream(self, call: _Call) -> web.StreamResponse | FastStream:
        outcome, held = await self._open(call)
        try:
            if not isinstance(outcome, _Opened):
                return outcome
            replica, upstream = outcome.replica, outcome.upstream
            call.pool.remember(call.decision.prefix, replica)
            replica.served += 1
            self.stats.streams_active += 1
            try:
                return await self._pump(call, replica, upstream, outcome.first_chunk)
            finally:
                self.stats.streams_active -= 1
                if call.delivered:
                    # [DONE] reached the client: nothing is left to abort, whatever ended the handler.
                    upstream.close()
                else:
                    # A cancelled handler (the client left) ends here too: that is an abort.
                    self._abort_upstream(call, upstream)
                call.upstream = None
        finally:
            call.replica = None
            if held is not None:
                held.in_flight -= 1

    def _prepare_transport(self, request: web.Request | FastRequest) -> asyncio.Transport:
        transport = request.transport
        if transport is None:
            raise _ClientGone
        if isinstance(request, FastRequest):
            # A fast connection stays with the front end, so what is set here holds for all its streams:
            # once per connection saves a setsockopt and a socket object per request.
            if request.connection.streams_prepared:
                return transport
            request.connection.streams_prepared = True
        limit = self.config.stream_buffer_bytes
        # Pausing at half the limit and never accepting a chunk over the other half keeps the buffer
        # under the limit: each write starts from at most `high` bytes.
        transport.set_write_buffer_limits(high=limit // 2, low=self._write_low)
        sndbuf = self.config.client_sndbuf_bytes
        sock = transport.get_extra_info("socket")
        if sndbuf is not None and sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        return transport

    async def _send(
        self, call: _Call, resp: web.StreamResponse | FastStream, transport: asyncio.Transport, data: bytes
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
                raise _ClientGone
            buffered = transport.get_write_buffer_size()
            if buffered + len(chunk) > cfg.stream_buffer_bytes:
                raise _StreamCut("overflow")
            if buffered + len(chunk) <= self._write_low:
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
                        raise _ClientGone from None
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
                raise _StreamCut("stalled") from None
            except ConnectionError:
                raise _ClientGone from None
            if time.monotonic() - began > cfg.slow_client.stall_s:
                self.classifier.mark_slow(call.client_id)

    async def _pump(
        self, call: _Call, replica: Replica, upstream: Exchange, first: bytes
    ) -> web.StreamResponse | FastStream:
        request = call.request
        headers = call.headers(replica)
        headers.update({"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        resp: web.StreamResponse | FastStream
        if isinstance(request, FastRequest):
            resp = FastStream(request, 200, headers)
        else:
            resp = web.StreamResponse(status=200, headers=headers)
        events = _EventFramer(max_pending=self.config.stream_buffer_bytes // 2, itl=call.series.itl)
        relay: _Relay | None = None
        try:
            transport = self._prepare_transport(request)
            if isinstance(resp, web.StreamResponse) and isinstance(request, web.Request):
                # A FastStream needs no preparing: its head goes out with its first write, as aiohttp's does.
                await resp.prepare(request)
            call.series.ttft.observe(time.monotonic() - call.started)
            failure: tuple[str, int, str] | None = None
            call.last_upstream = now = time.monotonic()
            try:
                complete = events.feed(first, now)
            except _InvalidStream as exc:
                failure = ("upstream_error", 502, f"replica {replica.url} sent {exc}")
            else:
                if complete:
                    # Through aiohttp, which sends the response head with it.
                    await self._send(call, resp, transport, complete)
                    call.delivered = events.done
            if failure is None:
                relay = _Relay(self, call, replica, upstream, events, transport, hold_done=isinstance(resp, FastStream))
                while True:
                    if relay.gone:
                        raise _ClientGone
                    if relay.backlog:
                        # The client fell behind: the replica is paused while this waits for it.
                        data = b"".join(relay.backlog)
                        relay.backlog.clear()
                        await self._send(call, resp, transport, data)
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
            if failure is None and not (events.flush() == b"" and events.done):
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
                self._abort_upstream(call, upstream)
                error = {
                    "message": message,
                    "type": kind,
                    "code": code,
                    "class": call.decision.request_class.value,
                    "pool": call.pool.name,
                    "replica": replica.url,
                }
                await self._send(call, resp, transport, _sse({"error": error}) + b"data: [DONE]\n\n")
            try:
                held = relay.take_held() if relay is not None else b""
                if held and isinstance(resp, FastStream):
                    await resp.write_eof(last=held)
                else:
                    await resp.write_eof()
            except ConnectionError:
                # Many SSE clients close as soon as they read [DONE]; the answer was complete.
                if not call.delivered:
                    raise _ClientGone from None
        except _StreamCut as cut:
            self.metrics.stream_cuts.inc({"class": call.decision.request_class.value, "reason": cut.reason})
            self.metrics.errors.inc({**call.labels, "kind": "stream_cut"})
            self._abort_upstream(call, upstream)
            if request.transport is not None:
                request.transport.abort()
        except _ClientGone:
            self.metrics.errors.inc({**call.labels, "kind": "client_gone"})
            self._abort_upstream(call, upstream)
        finally:
            if relay is not None:
                relay.close()
        return resp

    def _abort_upstream(self, call: _Call, upstream: aiohttp.ClientResponse | Exchange) -> None:
        # Closing (not releasing) the upstream connection is how vLLM learns to abort the sequence.
        if not upstream.closed:
            upstream.close()
            self.metrics.upstream_aborts.inc(call.labels)


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


_SSE_FIELD = re.compile(rb"(?:data|event|id|retry)(?::|$)|:|$")
_DONE_EVENTS = (b"data: [DONE]\n\n", b"data:[DONE]\n\n", b"data: [DONE]\r\n\r\n", b"data:[DONE]\r\n\r\n")


def _is_sse(complete: bytes, events: int) -> bool:
    """Whether whole events are Server-Sent Events: every line a field (data, event, id, retry) or a comment."""
    # vLLM sends one 'data:' line per event: two byte counts settle those without a split.
    if (
        complete.startswith(b"data:")
        and complete.count(b"\n") == 2 * events
        and complete.count(b"\n\ndata:") == events - 1
    ):
        return True
    return all(_SSE_FIELD.match(line) for line in complete.splitlines())


class _Relay:
    """A stream's events from its replica to its client, moved inside the upstream's data_received.

    While the client keeps up (its write buffer stays under the low-water mark) each chunk is framed,
    timed and written synchronously, so the handler sleeps through the whole stream. Otherwise the
    replica's connection is paused and the chunk left in `backlog` for the handler, which sends it
    with the cut timeout (Router._send) and resumes the replica: a slow reader holds a bounded buffer
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
        router: Router,
        call: _Call,
        replica: Replica,
        exchange: Exchange,
        events: _EventFramer,
        transport: asyncio.Transport,
        *,
        hold_done: bool = False,
    ) -> None:
        loop = router.loop
        self._loop = loop
        self._router = router
        self._stats = router.stats
        self._call = call
        self._replica = replica
        self._exchange = exchange
        self._events = events
        self._transport = transport
        self._itl = events.itl
        self._write_low = router._write_low
        self._idle_s = router.config.upstream_idle_timeout_s
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
        native = router.native_relay
        if native is not None and self._connection is not None:
            self._native = native(
                connection=self._connection,
                owner=self,
                call=call,
                events=events,
                transport=transport,
                itl=self._itl,
                router=router.stats,
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
        except _InvalidStream as exc:
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


class _EventFramer:
    """Passes on whole SSE events only, and times them: each event's gap since the previous one goes to `itl`.

    Holding back a partial event costs nothing in latency (the client could not use it either) and
    lets a mid-stream failure append a clean error event. Bytes that are not SSE raise _InvalidStream,
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
        """The whole events that chunk completes (b"" if none). _Relay.on_body does the same inline for a
        chunk of exactly one event."""
        data = self.pending + chunk if self.pending else chunk
        if data.endswith(b"\n\n"):
            end = len(data)
        else:
            found = ((data.rfind(b"\n\n"), 2), (data.rfind(b"\r\n\r\n"), 4))
            end = max((at + size for at, size in found if at >= 0), default=0)
        if end == 0 and len(data) > self._max_pending:
            raise _InvalidStream(f"over {self._max_pending} bytes without an SSE event boundary")
        complete, self.pending = data[:end], data[end:]
        if not complete:
            return complete
        count = complete.count(b"\n\n") + complete.count(b"\r\n\r\n")
        if not _is_sse(complete, count):
            raise _InvalidStream("bytes that are not Server-Sent Events")
        self.done = complete.endswith(_DONE_EVENTS)
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


@dataclass
class RunningRouter:
    """A router started inside the current event loop (tests, embedding); stop() shuts it down.

    Clients connect to `server`, whose connections start on the fast front end (builders/router/front.py);
    those it hands off run on aiohttp's handler, which `runner` owns.
    """

    router: Router
    runner: web.AppRunner
    server: asyncio.AbstractServer
    front: Front
    url: str

    async def stop(self) -> None:
        self.server.close()
        await self.front.shutdown(timeout_s=SHUTDOWN_TIMEOUT_S)
        await self.runner.cleanup()

    async def drain(self, hurry: asyncio.Event | None = None) -> None:
        """Stop accepting, let calls finish within drain_grace_s (or until hurry is set), end the rest, stop.

        A remaining stream ends with an SSE error event of type shutting_down, a non-streamed request
        still waiting gets a 503; both reach the client before the connection closes.
        """
        router = self.router
        self.server.close()
        # Idle keep-alive connections close now, busy ones after their response.
        self.front.close_idle()
        if self.runner.server is not None:
            self.runner.server.pre_shutdown()
        deadline = time.monotonic() + router.config.drain_grace_s
        while router.calls and time.monotonic() < deadline and not (hurry is not None and hurry.is_set()):
            await asyncio.sleep(0.05)
        router.shutting_down = True
        for call in list(router.calls):
            router.interrupt(call, SHUTTING_DOWN, "the router is shutting down")
        # Each interrupted handler writes its error at once, unless its client does not read; such a
        # client is cut after stream_cut_timeout_s as always.
        deadline = time.monotonic() + router.config.stream_cut_timeout_s + 1.0
        while router.calls and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await self.stop()


SHUTDOWN_TIMEOUT_S = 5.0
"""How long stop() lets requests still being served finish before cancelling them (aiohttp's as well)."""


async def start_router(config: RouterConfig, *, resolver: Resolver = system_resolver) -> RunningRouter:
    router = Router(config, resolver=resolver)
    # handler_cancellation: a client that disconnects must free its replica too, streamed or not.
    # keepalive_timeout: aiohttp's timer runs from connect and from each response until the next request
    # head is complete, so it bounds idle, slow-header and never-speaking connections alike.
    # auto_decompress=False: request bodies are never inflated (a compressed body gets a 415).
    # These govern the connections the front end hands to aiohttp; the front end keeps the same rules.
    runner = web.AppRunner(
        router.app(),
        access_log=None,
        handler_cancellation=True,
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        keepalive_timeout=config.idle_timeout_s,
        auto_decompress=False,
    )
    await runner.setup()
    assert runner.server is not None, "AppRunner.setup() creates the server"
    front = Front(router, runner.server)
    aiohttp_server = runner.server
    router.count_clients = lambda: len(front.connections) + len(aiohttp_server.connections)
    try:
        server = await asyncio.get_running_loop().create_server(front, config.host, config.port)
    except OSError as exc:
        await runner.cleanup()
        why = "the port is already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise ListenFailed(f"cannot listen on {config.host} port {config.port}: {why}") from None
    host, port = server.sockets[0].getsockname()[:2]
    return RunningRouter(router=router, runner=runner, server=server, front=front, url=f"http://{host}:{port}")


async def serve(config: RouterConfig, stop: asyncio.Event | None = None, hurry: asyncio.Event | None = None) -> None:
    """Run the router until stop is set (then drain) or until cancelled (then stop at once)."""
    running = await start_router(config)
    # What exists now (modules, config, the app) lives as long as the process: frozen, the collector's full
    # passes no longer walk it. Those passes paused the loop for 15-35 ms every few seconds under
    # bench-router's load, which showed as TTFT p99 of +15-38 ms in 5 of 8 runs; frozen, 4 of 4 stayed under +5 ms.
    gc.collect()
    gc.freeze()
    print(f"forge router listening on {running.url}", flush=True)
    # Which loop runs is worth a line (after the listening line, which tools parse): CPU per streamed
    # event differs by about a fifth between them.
    loop = "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
    print(f"forge router event loop: {loop}, relay: {relay_name()}", flush=True)
    try:
        await (stop or asyncio.Event()).wait()
    except asyncio.CancelledError:
        await running.stop()
        raise
    await running.drain(hurry)


__all__ = [
    "HEADER_CLASS",
    "HEADER_POOL",
    "HEADER_REPLICA",
    "RequestClass",
    "Router",
    "RunningRouter",
    "json_error",
    "serve",
    "start_router",
]
