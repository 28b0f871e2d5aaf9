"""Dispatch: a classified request to a replica of its pool, with failover before the first byte.

Choosing the pool is the policy's (builders/router/pool_choice.py: the request's model, then its class), choosing
a replica the pool's (builders/router/replicas.py) and spilling to another pool the work-conserving rule's
(builders/router/work_conserving.py); this module tries the choice, retries on another replica while nothing
has reached the client, and answers: a whole response, or an opened stream handed to the relay
(builders/router/relay.py). A multipart upload's body goes to its replica as it arrives (builders/router/uploads.py).
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web

from builders.router.answers import first_byte_timeout, read_exchange, read_whole
from builders.router.call import (
    REPLICA_DOWN,
    SHUTTING_DOWN,
    Call,
    Opened,
    Waiting,
    abort_upstream,
    call_error,
    json_error,
    no_replica,
    not_served,
)
from builders.router.classify import Classifier, Decision
from builders.router.config import RouterConfig
from builders.router.front import FastRequest, FastStream
from builders.router.openai_request import ParsedRequest
from builders.router.pool_choice import PoolChoice
from builders.router.relay import Pump
from builders.router.replicas import Pool, Replica
from builders.router.router_metrics import RouterMetrics
from builders.router.uploads import Upload, UploadRefused
from builders.router.upstream import ConnectFailed, Exchange, UpstreamFailed, UpstreamPool
from builders.router.work_conserving import spill_target, with_priority


def is_event_stream(content_type: str | None) -> bool:
    return content_type is not None and content_type.split(";", 1)[0].strip().lower() == "text/event-stream"


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
        choice: PoolChoice,
    ) -> None:
        self.config = config
        self.pools = pools
        self.metrics = metrics
        self.classifier = classifier
        self.pump = pump
        self.choice = choice
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
        upload: Upload | None = None,
    ) -> web.StreamResponse | FastStream:
        chosen = self.choice.choose(parsed.model, decision.request_class)
        if chosen is None:
            return not_served(self.metrics, parsed.model, self.choice.catalog.served())
        pool = spill_target(
            chosen,
            self.pools,
            self.config.spill,
            prompt_tokens=parsed.token_estimate,
            max_prompt_tokens=self.config.spill_max_prompt_tokens,
        )
        if pool is not chosen and not self.choice.may_serve(pool, parsed.model):
            pool = chosen
        series = self.metrics.by_class[decision.request_class.value]
        call = Call(
            request=request,
            raw=with_priority(raw, decision.request_class, self.config.class_priority),
            parsed=parsed,
            decision=decision,
            pool=pool,
            series=series,
            started=started,
            client_id=self.classifier.client_id(request.headers),
            upload=upload,
        )
        # By pool name, not by class: an enum's .value is a Python call, and this runs on every request.
        counted = series.requests.get(chosen.name)
        if counted is None:
            counted = self.metrics.requests_in(decision.request_class.value, chosen.name)
        counted.inc()
        series.in_flight.inc()
        self.calls.add(call)
        try:
            return await (self._stream(call) if parsed.stream or upload is not None else self._unary(call))
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
                elif call.upload is not None:
                    outcome = await self._attempt_upload(call, replica, call.upload)
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
        return await read_whole(self.config, self.metrics, call, replica, upstream, deadline)

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
        except (asyncio.CancelledError, ConnectFailed) as exc:
            return _not_reached(self.metrics, call, replica, exchange, exc)
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
            return await read_exchange(self.config, self.metrics, call, replica, exchange, deadline)
        if not first:
            exchange.close()
            return "closed the stream before the first byte"
        return Opened(replica=replica, upstream=exchange, first_chunk=first)

    async def _attempt_upload(self, call: Call, replica: Replica, upload: Upload) -> Opened | web.Response | str:
        """_attempt_stream for a multipart upload: the body goes to the replica as it arrives (uploads.py), and the
        answer is relayed as a stream when the replica sends one (text/event-stream), else read whole.

        Only the body's beginning is kept: once bytes past it were read, the upload cannot go to another replica,
        and a failure is the final answer (502) instead of a failover.
        """
        cfg = self.config
        # The first-byte deadline runs from when the body is due whole: uploading is the client's time, not the
        # replica's. The body's own deadline (body_timeout_s) ends a slow upload before it with a 408.
        deadline = call.started + cfg.body_timeout_s + cfg.first_byte_timeout_s
        exchange: Exchange | None = None
        first = b""
        try:
            with Waiting(call, deadline - time.monotonic(), self.loop) as waiting:
                headers = {**self.upstream_headers(), **upload.framing()}
                exchange = await self.upstream.send(
                    replica.url, call.parsed.endpoint.value, None, headers, cfg.connect_timeout_s
                )
                assert exchange.connection is not None, "a fresh exchange has its connection"
                await upload.send(exchange.connection)
                await exchange.head()
                if exchange.status == 200 and is_event_stream(exchange.content_type):
                    first = exchange.take() or await exchange.body_chunk()
        except (asyncio.CancelledError, ConnectFailed) as exc:
            return _not_reached(self.metrics, call, replica, exchange, exc)
        except UploadRefused as exc:
            if exchange is not None:
                abort_upstream(self.metrics, call, exchange)
            self.metrics.rejected.inc({"reason": "bad_request"})
            refused = json_error(exc.status, exc.message, "invalid_request_error", param="body")
            refused.headers.update(call.headers())
            return refused
        except (UpstreamFailed, ConnectionError) as exc:
            if exchange is not None:
                exchange.close()
            stopped = self._stopped(call) if call.interrupted() else f"failed while taking the upload ({exc})"
            return self._once(call, replica, upload, stopped)
        ended = self._wait_outcome(call, waiting, exchange)
        if ended is not None:
            return self._once(call, replica, upload, ended)
        assert exchange is not None, "_wait_outcome answers for a wait that left no response"
        if exchange.status >= 500:
            exchange.close()
            return self._once(call, replica, upload, f"answered {exchange.status}")
        call.upstream = exchange
        if not first:
            if exchange.status == 200 and is_event_stream(exchange.content_type):
                exchange.close()
                return self._once(call, replica, upload, "closed the stream before the first byte")
            return await read_exchange(self.config, self.metrics, call, replica, exchange, deadline)
        return Opened(replica=replica, upstream=exchange, first_chunk=first)

    def _once(self, call: Call, replica: Replica, upload: Upload, outcome: web.Response | str) -> web.Response | str:
        """An upload attempt's failure: a reason to fail over while the body is whole here, else the final 502."""
        if isinstance(outcome, str) and upload.consumed:
            return call_error(
                self.metrics,
                call,
                502,
                "upstream_error",
                f"replica {replica.url} {outcome}; an upload is relayed as it arrives, so it is not sent twice",
                replica=replica.url,
            )
        return outcome

    def _wait_outcome(
        self, call: Call, waiting: Waiting, upstream: aiohttp.ClientResponse | Exchange | None
    ) -> web.Response | str | None:
        """What an attempt's wait that ended without an error means: None to go on with `upstream`, else the
        504 of a first-byte timeout or what an interrupt leaves (a reason to fail over, or the final 503)."""
        if waiting.expired:
            self.metrics.upstream_aborts.inc(call.labels)
            if upstream is not None:
                upstream.close()
            return first_byte_timeout(self.config, self.metrics, call)
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
                if outcome.status == 200:
                    # An upload answered whole: its body is the first byte its client gets.
                    call.series.ttft.observe(time.monotonic() - call.started)
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


def _not_reached(
    metrics: RouterMetrics, call: Call, replica: Replica, exchange: Exchange | None, exc: BaseException
) -> str:
    """Where a stream's or an upload's attempt ends when it never reached its replica, in one place so the two
    cannot drift apart. The replica refused the connection: it is chosen no more until a health check finds it
    back, and the reason returned is the attempt's, to fail over with. The client left (a cancellation): closing
    the exchange is how the replica learns to stop, it counts as an abort, and the cancellation goes on."""
    if isinstance(exc, ConnectFailed):
        replica.mark_down(f"connect failed: {exc}")
        return f"connect failed ({exc})"
    metrics.upstream_aborts.inc(call.labels)
    if exchange is not None:
        exchange.close()
    raise exc
