"""One routed request's state as it goes through the router: the call, its wait for an upstream attempt,
and the error answers built from it. Dispatch, the relay and the app all read it; it imports none of them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from builders.router.classify import Decision
from builders.router.front import FastRequest
from builders.router.openai_request import ParsedRequest
from builders.router.replicas import Pool, Replica
from builders.router.router_metrics import ClassSeries, RouterMetrics
from builders.router.uploads import Upload
from builders.router.upstream import Exchange

HEADER_POOL = "x-forge-pool"
HEADER_REPLICA = "x-forge-replica"
HEADER_CLASS = "x-forge-class"


def json_error(status: int, message: str, kind: str, **extra: Any) -> web.Response:
    error: dict[str, Any] = {"message": message, "type": kind, "code": status}
    error.update(extra)
    return web.json_response({"error": error}, status=status)


# Why a call was stopped from outside its handler: its replica went down, or the router is shutting down.
REPLICA_DOWN = "replica_down"
SHUTTING_DOWN = "shutting_down"


class Waiting:
    """The handler's wait for one upstream attempt, which the first-byte deadline or interrupt() may end early.

    Both end it by cancelling the handler's own task and taking the cancellation back on the way out
    (Task.uncancel), as asyncio.timeout does: the attempt needs no task of its own and no asyncio.wait
    around it (together about 6 µs per request). A cancellation from anywhere else (the client went
    away) is left to propagate.
    """

    __slots__ = ("_call", "_task", "_timer", "cut", "expired")

    def __init__(self, call: Call, timeout_s: float, loop: asyncio.AbstractEventLoop) -> None:
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

    def __enter__(self) -> Waiting:
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
class Call:
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
    waiting: Waiting | None = None
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
    upload: Upload | None = None
    """A multipart body still on its way from the client (builders/router/uploads.py); `raw` is empty then."""

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
class Opened:
    replica: Replica
    upstream: Exchange
    first_chunk: bytes


def call_error(metrics: RouterMetrics, call: Call, status: int, kind: str, message: str, **extra: Any) -> web.Response:
    """A routed request's JSON error, counted, carrying its class and pool (in the body and the headers)."""
    metrics.errors.inc({**call.labels, "kind": kind})
    response = json_error(
        status,
        message,
        kind,
        **{"class": call.decision.request_class.value, "pool": call.pool.name},
        **extra,
    )
    response.headers.update(call.headers())
    return response


def no_replica(metrics: RouterMetrics, call: Call) -> web.Response:
    if call.failures:
        why = "every replica failed before answering: " + "; ".join(call.failures)
    else:
        why = "no healthy replica"
    return call_error(
        metrics,
        call,
        503,
        "no_replica_available",
        f"pool {call.pool.name!r} cannot serve class {call.decision.request_class.value!r}: {why}",
    )


def not_served(metrics: RouterMetrics, model: str | None, served: list[str]) -> web.Response:
    """The 404 for a model no pool serves, in OpenAI's error shape, naming the models that are."""
    metrics.rejected.inc({"reason": "model_not_found"})
    return json_error(
        404,
        f"model {model!r} is not served here; served models: {', '.join(served) or 'none known yet'}",
        "model_not_found",
        param="model",
        served_models=served,
    )


def abort_upstream(metrics: RouterMetrics, call: Call, upstream: aiohttp.ClientResponse | Exchange) -> None:
    # Closing (not releasing) the upstream connection is how vLLM learns to abort the sequence.
    if not upstream.closed:
        upstream.close()
        metrics.upstream_aborts.inc(call.labels)
