"""What the router counts about itself outside the metric registry: stream bookkeeping the relay updates per
event, and the upstream connections its three clients hold open, read when /metrics is rendered.

The connection counts are what a test of the router's file descriptors needs to know: each open upstream
connection is one socket, and how many of them stay open after a burst of load is the pools' choice, not a
leak. They are read from the pools themselves, never from /proc, so that a test comparing the two compares
two independent counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from builders.router.replicas import Pool
from builders.router.router_metrics import RouterMetrics
from builders.router.upstream import UpstreamPool

IDLE = "idle"
IN_USE = "in_use"
CONNECTING = "connecting"
"""Being opened: the socket exists, the connection does not yet (aiohttp's do not know their upstream yet)."""

STREAM = "stream"
UNARY = "unary"
HEALTH = "health"
"""The router's three upstream clients: its own for streams, aiohttp's for the rest and for health checks."""


@dataclass
class StreamStats:
    """Counters the relays update as streams run (the C relay sets stream_buffer_peak by name)."""

    stream_buffer_peak: int = 0
    streams_active: int = 0
    events_relayed_natively: int = 0
    """Events the C relay moved without Python, over finished streams: how tests see it at work."""


def connector_connections(connector: aiohttp.BaseConnector | None) -> Counter[tuple[str, str]]:
    """Open connections of an aiohttp connector, by (upstream host:port, idle or in use).

    aiohttp has no public count of its pool, so this reads its two containers: idle connections per key
    and the set of those acquired. tests/router/test_router_pool.py checks the counts against the sockets
    the replica sees, so an aiohttp that renames them fails a test instead of reporting zero.
    """
    counts: Counter[tuple[str, str]] = Counter()
    if connector is None:
        return counts
    for key, entries in connector._conns.items():
        for protocol, _ in entries:
            if protocol.is_connected():
                counts[(f"{key.host}:{key.port}", IDLE)] += 1
    for protocol in connector._acquired:
        transport = protocol.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        if peer is not None:
            counts[(f"{peer[0]}:{peer[1]}", IN_USE)] += 1
        elif transport is None:
            # aiohttp's stand-in for a connection it is opening.
            counts[("", CONNECTING)] += 1
    return counts


def pool_connections(pool: UpstreamPool) -> Counter[tuple[str, str]]:
    counts: Counter[tuple[str, str]] = Counter()
    for (host, port), (idle, busy, connecting) in pool.connections().items():
        counts[(f"{host}:{port}", IDLE)] += idle
        counts[(f"{host}:{port}", IN_USE)] += busy
        if connecting:
            counts[(f"{host}:{port}", CONNECTING)] += connecting
    return counts


def open_fds() -> int:
    """The process's open file descriptors, counted in the same render as the pools so the two agree."""
    try:
        # Less one: the listing's own descriptor for the directory is among those it lists.
        return sum(1 for _ in Path("/proc/self/fd").iterdir()) - 1
    except OSError:
        return -1


def publish(
    metrics: RouterMetrics,
    pools: Mapping[str, Pool],
    stats: StreamStats,
    clients: Mapping[str, Counter[tuple[str, str]]],
    *,
    idle_timeout_s: float,
    client_connections: int,
) -> None:
    """Set the gauges that are read, not counted, before /metrics is rendered."""
    for pool in pools.values():
        for r in pool.replicas:
            labels = {"pool": pool.name, "replica": r.url}
            metrics.replica_healthy.set(labels, 1.0 if r.healthy else 0.0)
            metrics.replica_in_flight.set(labels, float(r.in_flight))
    metrics.streams_active.set(None, float(stats.streams_active))
    metrics.stream_buffer_peak.set(None, float(stats.stream_buffer_peak))
    # Every series seen so far is reset first: a replica whose connections all closed must read 0, not its
    # last count.
    metrics.upstream_connections.reset()
    total = 0
    for client, counts in clients.items():
        for (upstream, state), count in counts.items():
            metrics.upstream_connections.set({"client": client, "upstream": upstream, "state": state}, float(count))
            total += count
    metrics.upstream_connections_open.set(None, float(total))
    metrics.upstream_pool_idle_timeout.set(None, idle_timeout_s)
    metrics.client_connections.set(None, float(client_connections))
    fds = open_fds()
    if fds >= 0:
        metrics.open_fds.set(None, float(fds))
