"""Whole answers from a replica (not streamed, or a stream's error answer): read bounded, passed on with their status,
Content-Type and the router's headers. A replica's 4xx reaches the client as it was sent (an OpenAI client raises
its BadRequestError or NotFoundError from it); a 5xx never gets here (dispatch fails over or answers 502/503).
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web

from builders.router.call import Call, abort_upstream, call_error
from builders.router.config import RouterConfig
from builders.router.replicas import Replica
from builders.router.router_metrics import RouterMetrics
from builders.router.upstream import Exchange, UpstreamFailed


def failed_mid_response(metrics: RouterMetrics, call: Call, replica: Replica, exc: BaseException) -> web.Response:
    """The answer when a replica fails after it began answering: the interrupt's own reason where a health
    check or a drain stopped the call (503), else the replica died (502). One place for both the streamed and
    the whole-body paths, so they cannot drift apart."""
    if call.stop_kind is not None:
        return call_error(metrics, call, 503, call.stop_kind, call.stop_reason or "interrupted")
    return call_error(
        metrics,
        call,
        502,
        "upstream_died",
        f"replica {replica.url} failed while sending its response ({type(exc).__name__})",
        replica=replica.url,
    )


async def read_exchange(
    config: RouterConfig, metrics: RouterMetrics, call: Call, replica: Replica, exchange: Exchange, deadline: float
) -> web.Response:
    """A streamed request's or an upload's answer that is not a stream (an upstream 4xx, a whole transcription):
    read it all, bounded, and pass it on."""
    limit = config.max_response_bytes
    try:
        body = await asyncio.wait_for(
            exchange.read_body(limit),
            timeout=max(config.upstream_idle_timeout_s, deadline - time.monotonic()),
        )
    except asyncio.CancelledError:
        abort_upstream(metrics, call, exchange)
        raise
    except (UpstreamFailed, TimeoutError) as exc:
        exchange.close()
        return failed_mid_response(metrics, call, replica, exc)
    finally:
        call.upstream = None
    if body is None:
        return call_error(metrics, call, 502, "upstream_error", f"replica {replica.url} sent more than {limit} bytes")
    exchange.release()
    headers = call.headers(replica)
    headers["Content-Type"] = exchange.content_type or "application/json"
    return web.Response(status=exchange.status, body=body, headers=headers)


async def read_whole(
    config: RouterConfig,
    metrics: RouterMetrics,
    call: Call,
    replica: Replica,
    upstream: aiohttp.ClientResponse,
    deadline: float,
) -> web.Response:
    """A non-streamed answer (or an upstream 4xx): read it all, bounded, then answer the client."""
    limit = config.max_response_bytes
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            chunk = await asyncio.wait_for(
                upstream.content.read(65536),
                timeout=max(config.upstream_idle_timeout_s, deadline - time.monotonic()),
            )
            if not chunk:
                break
            call.last_upstream = time.monotonic()
            size += len(chunk)
            if size > limit:
                upstream.close()
                return call_error(
                    metrics, call, 502, "upstream_error", f"replica {replica.url} sent more than {limit} bytes"
                )
            chunks.append(chunk)
    except asyncio.CancelledError:
        abort_upstream(metrics, call, upstream)
        raise
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        upstream.close()
        return failed_mid_response(metrics, call, replica, exc)
    finally:
        upstream.release()
        call.upstream = None
    headers = call.headers(replica)
    headers["Content-Type"] = upstream.headers.get("Content-Type", "application/json")
    if upstream.status == 200:
        call.pool.remember(call.decision.prefix, replica)
        replica.served += 1
    return web.Response(status=upstream.status, body=b"".join(chunks), headers=headers)


def first_byte_timeout(config: RouterConfig, metrics: RouterMetrics, call: Call) -> web.Response:
    # No failover here: the replica may still be working on it, and a retry would double the load.
    return call_error(
        metrics,
        call,
        504,
        "first_byte_timeout",
        f"no first byte from pool {call.pool.name!r} within {config.first_byte_timeout_s}s",
    )
