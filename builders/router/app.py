"""The router service: an aiohttp server in front of vLLM pools.

Every path of vLLM's OpenAI server that serves requests is relayed on the same path (Endpoint in
builders/router/openai_request.py), with the same key, limits, metrics and timeouts; the request's model picks
its pool first, its class second (builders/router/pool_choice.py). Streamed requests and uploads go through the
router's own client (builders/router/upstream.py), whose relay writes each event to the client inside the replica
connection's data_received; non-streamed requests, /v1/models, /version and health checks use aiohttp's client.

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
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from builders.errors import ListenFailed
from builders.router.call import HEADER_POOL, HEADER_REPLICA, SHUTTING_DOWN, json_error
from builders.router.classes import EVERY_CLASS
from builders.router.classify import Classifier
from builders.router.config import RouterConfig
from builders.router.discovery import Membership, Resolver, discoverers, system_resolver
from builders.router.dispatch import Dispatcher
from builders.router.front import FastRequest, FastStream, Front
from builders.router.health import HealthChecker
from builders.router.native import native_relay, relay_name
from builders.router.openai_request import UPLOADS, BadRequest, Endpoint, parse_request, upload_request
from builders.router.pool_choice import PoolChoice
from builders.router.prometheus import CONTENT_TYPE
from builders.router.relay import Pump
from builders.router.replicas import Pool, Replica
from builders.router.router_metrics import RouterMetrics
from builders.router.served_models import ModelCatalog
from builders.router.stats import HEALTH, STREAM, UNARY, StreamStats, connector_connections, pool_connections, publish
from builders.router.uploads import Upload, UploadRefused, multipart_boundary
from builders.router.upstream import UpstreamPool

ROUTER_KEY: web.AppKey[Router] = web.AppKey("router")

SERVED_PATHS = (*(e.value for e in Endpoint), "/v1/models", "/version", "/health", "/metrics")
SERVED_TEXT = f"POST {', '.join(e.value for e in Endpoint)}; GET /v1/models, /version, /health, /metrics"


def _connector(*, limit: int, limit_per_host: int, idle_s: float) -> aiohttp.TCPConnector:
    # aiohttp sweeps its idle connections every keepalive_timeout and closes those idle longer than that,
    # so one lives between one and two of them: half the pool's timeout keeps it within the timeout.
    # No rounding of the sweep's time up to a whole second (timeout_ceil_threshold), which would add one.
    return aiohttp.TCPConnector(
        limit=limit, limit_per_host=limit_per_host, keepalive_timeout=idle_s / 2, timeout_ceil_threshold=math.inf
    )


class Router:
    """The app: its routes, its lifecycle and the state the handlers share (config, pools, metrics, clients)."""

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
        self.metrics = RouterMetrics({c.value: config.pool_for(c) for c in EVERY_CLASS})
        self.stats = StreamStats()
        self.pump = Pump(config, self.metrics, self.classifier, self.stats, native_relay())
        self.catalog = ModelCatalog(self.pools, config.models)
        choice = PoolChoice(config, self.pools, self.catalog)
        self.dispatch = Dispatcher(config, self.pools, self.metrics, self.classifier, self.pump, choice)
        self.calls = self.dispatch.calls
        """Every call in flight (the dispatcher's own set): a drain waits for it to empty."""
        self.health = HealthChecker(config, self.pools, self.dispatch, self.catalog)
        self.membership = Membership(self.pools, discoverers(config, resolver=resolver), self.health.membership_changed)
        self._discovery_task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._health_session: aiohttp.ClientSession | None = None
        self._upstream: UpstreamPool | None = None
        self._health_task: asyncio.Task[None] | None = None
        self.count_clients: Callable[[], int] = lambda: 0
        """Client connections open now, fast and handed off (start_router knows both servers)."""

    # --- lifecycle -------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_request_bytes)
        app[ROUTER_KEY] = self
        for endpoint in Endpoint:
            app.router.add_post(endpoint.value, self._upload if endpoint in UPLOADS else self._handler(endpoint))
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/version", self._version)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        # Clients of an OpenAI API parse error bodies as JSON: 405 and 404 answer in the same shape.
        for path in SERVED_PATHS:
            app.router.add_route("*", path, self._method_not_allowed)
        app.router.add_route("*", "/{path:.*}", self._not_found)
        app.cleanup_ctx.append(self._lifespan)
        return app

    def _handler(self, endpoint: Endpoint) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            return await self._route(request, endpoint)

        return handle

    async def _lifespan(self, _app: web.Application) -> AsyncIterator[None]:
        # Kept, not asked for: asyncio.get_running_loop() makes a getpid() system call each time (Python 3.11).
        loop = asyncio.get_running_loop()
        idle_s = self.config.upstream_pool_idle_timeout_s
        connector = _connector(limit=self.config.upstream_connection_limit, limit_per_host=0, idle_s=idle_s)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        # Health checks get connections of their own: queued behind busy streams for a pooled connection,
        # a check would time out and mark a healthy replica down exactly when it is serving most.
        # One connection per replica (limit_per_host), however many discovery finds.
        self._health_session = aiohttp.ClientSession(connector=_connector(limit=0, limit_per_host=1, idle_s=idle_s))
        self._upstream = UpstreamPool(
            limit=self.config.upstream_connection_limit,
            track_chunks=self.pump.native_relay is not None,
            keep_alive=self.config.upstream_keep_alive,
            idle_timeout_s=idle_s,
        )
        self.pump.start(loop)
        self.dispatch.start(self._session, self._upstream, loop)
        # Before discovery's first round, which checks each replica it finds.
        self.health.start(self._health_session)
        if self.membership.dynamic:
            await self.membership.refresh_all()
            self._discovery_task = asyncio.create_task(self.membership.run())
        self._health_task = asyncio.create_task(self.health.run())
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
    def upstream(self) -> UpstreamPool:
        if self._upstream is None:
            raise RuntimeError("the router's upstream pool exists only while the app runs")
        return self._upstream

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

    def _refuse_before_body(self, headers: Mapping[str, str]) -> web.Response | None:
        """None when a request with a body may be read, else what to answer first: _refuse_unauthorized's answer,
        or 415 for a compressed body. A JSON route and an upload refuse the same requests, in the same words."""
        refused = self._refuse_unauthorized(headers)
        if refused is not None:
            return refused
        encoding = headers.get("Content-Encoding", "identity").strip().lower()
        if encoding != "identity":
            # A compressed body can inflate a thousandfold; the server does not decompress (auto_decompress
            # is off), and no OpenAI client compresses requests, so refusing costs nobody anything. aiohttp
            # then reads and drops the rest of the body (compressed, so cheap) for up to its lingering time.
            return self.reject(
                415, f"Content-Encoding {encoding!r} is not accepted; send the body uncompressed", "Content-Encoding"
            )
        return None

    async def _method_not_allowed(self, request: web.Request) -> web.Response:
        return json_error(405, f"{request.method} is not allowed on {request.path}", "method_not_allowed")

    async def _not_found(self, request: web.Request) -> web.Response:
        return json_error(404, f"no such path: {request.path}; the router serves {SERVED_TEXT}", "not_found")

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

    async def _ask(self, pool: Pool, path: str) -> tuple[Replica, Any] | None:
        """GET path from the pool's replicas, healthy ones first, until one answers 200 with JSON."""
        timeout = aiohttp.ClientTimeout(total=self.config.health_timeout_s + self.config.connect_timeout_s)
        for replica in sorted(pool.replicas, key=lambda r: not r.healthy):
            try:
                async with self.session.get(
                    f"{replica.url}{path}", headers=self.dispatch.upstream_headers(), timeout=timeout
                ) as resp:
                    if resp.status != 200:
                        continue
                    return replica, await resp.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
                continue
        return None

    async def _models(self, request: web.Request) -> web.Response:
        refused = self._refuse_unauthorized(request.headers)
        if refused is not None:
            return refused
        models: dict[str, Any] = {}
        answered = 0
        for pool in self.pools.values():
            found = await self._ask(pool, "/v1/models")
            if found is None:
                continue
            answered += 1
            body = found[1]
            # Each model once, however many pools serve it: the first pool's card.
            for model in body.get("data", []) if isinstance(body, dict) else []:
                if isinstance(model, dict) and isinstance(model.get("id"), str):
                    models.setdefault(model["id"], model)
        if not answered:
            return json_error(503, "no replica of any pool answered GET /v1/models", "no_replica_available")
        return web.json_response({"object": "list", "data": list(models.values())})

    async def _version(self, request: web.Request) -> web.Response:
        """The version of the engine behind the router, as a replica of the fallback pool states it."""
        refused = self._refuse_unauthorized(request.headers)
        if refused is not None:
            return refused
        pool = self.pools[self.config.fallback_pool()]
        found = await self._ask(pool, "/version")
        if found is None:
            return json_error(503, f"no replica of pool {pool.name!r} answered GET /version", "no_replica_available")
        replica, body = found
        return web.json_response(body, headers={HEADER_POOL: pool.name, HEADER_REPLICA: replica.url})

    # --- routed requests -------------------------------------------------------------------------

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
        answer = await self.dispatch.dispatch(request, raw, parsed, decision, started)
        if isinstance(answer, FastStream | web.Response):
            return answer
        raise TypeError(f"a fast request was answered with a {type(answer).__name__}")

    async def _route(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        started = time.monotonic()
        refused = self._refuse_before_body(request.headers)
        if refused is not None:
            return refused
        cfg = self.config
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
            return await self._answer_and_close(
                request, self.reject(408, f"request body did not arrive within {cfg.body_timeout_s}s", "body")
            )
        answer = await self.dispatch.dispatch(request, raw, parsed, decision, started)
        if isinstance(answer, FastStream):
            raise TypeError("an aiohttp request was answered on the fast path")
        return answer

    async def _upload(self, request: web.Request) -> web.StreamResponse:
        """A multipart upload (builders/router/uploads.py): routed by its `model` field, its body relayed as it
        arrives."""
        started = time.monotonic()
        refused = self._refuse_before_body(request.headers)
        if refused is not None:
            return refused
        cfg = self.config
        content_type = request.headers.get("Content-Type", "")
        boundary = multipart_boundary(content_type)
        if boundary is None:
            return self.reject(
                400,
                f"{request.path} takes a multipart/form-data body with a boundary (the file and its fields)",
                "Content-Type",
            )
        upload = Upload(
            request.content,
            content_type=content_type,
            boundary=boundary,
            length=request.content_length,
            limit=cfg.max_request_bytes,
            deadline=started + cfg.body_timeout_s,
        )
        try:
            parsed = upload_request(await upload.sniff())
        except UploadRefused as exc:
            answer: web.StreamResponse | FastStream = self.reject(exc.status, exc.message, "body")
        else:
            decision = self.classifier.classify(parsed, request.headers)
            answer = await self.dispatch.dispatch(request, b"", parsed, decision, started, upload=upload)
        if isinstance(answer, FastStream):
            raise TypeError("an aiohttp request was answered on the fast path")
        if upload.answer_closes(answer):
            return await self._answer_and_close(request, answer)
        return answer

    async def _answer_and_close(self, request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
        # Sent now and the connection closed: aiohttp would otherwise linger up to 10 s reading the rest
        # of the body from a client already known to be too slow.
        await response.prepare(request)
        await response.write_eof()
        request.protocol.force_close()
        return response

    def reject(self, status: int, message: str, param: str) -> web.Response:
        self.metrics.rejected.inc({"reason": "bad_request"})
        return json_error(status, message, "invalid_request_error", param=param)


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
        router.dispatch.shutting_down = True
        for call in list(router.calls):
            router.dispatch.interrupt(call, SHUTTING_DOWN, "the router is shutting down")
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


__all__ = ["Router", "RunningRouter", "serve", "start_router"]
