"""The router's own metrics: per-class latency histograms and counters, plus stream-buffer bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass

from builders.router.classes import EVERY_CLASS
from builders.router.prometheus import BoundValue, HistogramSeries, Registry

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True, kw_only=True)
class ClassSeries:
    """The series one request class updates on every request and every streamed event, resolved once. The count of
    requests is by class and pool, and a request's model may choose another pool than its class's: `requests` holds
    it per pool name, bound on first use (RouterMetrics.requests_in)."""

    requests: dict[str, BoundValue]
    in_flight: BoundValue
    ttft: HistogramSeries
    itl: HistogramSeries
    e2e: HistogramSeries


class RouterMetrics:
    """Every series the router exports on /metrics; names start with forge_router_."""

    def __init__(self, class_pools: dict[str, str]) -> None:
        """class_pools: every class (generation and not) -> the pool it goes to when its model does not decide."""
        self.registry = Registry()
        r = self.registry
        self.requests = r.counter(
            "forge_router_requests_total",
            "Requests routed, by class (the six generation classes; embeddings, score, rerank, tokenize and "
            "transcription for the rest) and the pool its model and class chose.",
            ("class", "pool"),
        )
        self.errors = r.counter(
            "forge_router_errors_total",
            "Routed requests that failed, by class, pool and kind (no_replica_available, first_byte_timeout, "
            "upstream_error, upstream_died, replica_down, shutting_down, stream_cut, client_gone).",
            ("class", "pool", "kind"),
        )
        self.rejected = r.counter(
            "forge_router_rejected_total",
            "Requests refused before routing (bad_request, unauthorized, model_not_found).",
            ("reason",),
        )
        self.in_flight = r.gauge("forge_router_in_flight", "Requests being served now, by class.", ("class",))
        self.ttft = r.histogram(
            "forge_router_ttft_seconds",
            "Request arrival to the first response byte sent to the client (whole body for non-streamed).",
            ("class",),
            LATENCY_BUCKETS_S,
        )
        self.itl = r.histogram(
            "forge_router_itl_seconds",
            "Gap between consecutive SSE events forwarded to the client (0 for events that arrived together).",
            ("class",),
            ITL_BUCKETS_S,
        )
        self.e2e = r.histogram(
            "forge_router_e2e_seconds", "Request arrival to the end of the response.", ("class",), LATENCY_BUCKETS_S
        )
        self.failovers = r.counter(
            "forge_router_failovers_total",
            "Attempts abandoned before the first byte and retried on another replica.",
            ("class", "pool"),
        )
        self.stream_cuts = r.counter(
            "forge_router_stream_cuts_total",
            "Streams cut because the client did not drain (stalled) or its buffer would overflow.",
            ("class", "reason"),
        )
        self.upstream_aborts = r.counter(
            "forge_router_upstream_aborts_total",
            "Upstream requests the router aborted by closing the connection.",
            ("class", "pool"),
        )
        self.handoffs = r.counter(
            "forge_router_handoffs_total",
            "Client connections the fast front end handed to aiohttp's server, by reason (another_request, "
            "connection_handling, request_headers, large_body, not_http, pipelined, long_head).",
            ("reason",),
        )
        self.streams_active = r.gauge("forge_router_streams_active", "Streams being forwarded now.")
        self.stream_buffer_peak = r.gauge(
            "forge_router_stream_buffer_peak_bytes",
            "Largest number of bytes any one stream held in the router's client write buffer.",
        )
        self.replica_healthy = r.gauge(
            "forge_router_replica_healthy", "1 if the replica passes health checks.", ("pool", "replica")
        )
        self.replica_in_flight = r.gauge(
            "forge_router_replica_in_flight", "Requests in flight on the replica.", ("pool", "replica")
        )
        self.upstream_connections = r.gauge(
            "forge_router_upstream_connections",
            "Open connections to replicas, by client (stream: the router's own pool; unary: non-streamed "
            "requests and /v1/models; health: health checks), upstream host:port and state (idle, in_use, or "
            'connecting: aiohttp\'s do not know their upstream yet and carry upstream="").',
            ("client", "upstream", "state"),
        )
        self.upstream_connections_open = r.gauge(
            "forge_router_upstream_connections_open", "Open connections to replicas over all clients and states."
        )
        self.upstream_pool_idle_timeout = r.gauge(
            "forge_router_upstream_pool_idle_timeout_seconds",
            "How long an idle pooled connection to a replica is kept (upstream_pool_idle_timeout_s).",
        )
        self.client_connections = r.gauge(
            "forge_router_client_connections", "Open client connections (the fast front end's and aiohttp's)."
        )
        # The name Prometheus's own client libraries give it, so dashboards that know it find it here too.
        self.open_fds = r.gauge("process_open_fds", "Open file descriptors of the router process.")
        # Binding creates every class's series at zero, so dashboards see them before the first request.
        self.by_class = {
            c.value: ClassSeries(
                requests={},
                in_flight=self.in_flight.bind({"class": c.value}),
                ttft=self.ttft.bind({"class": c.value}),
                itl=self.itl.bind({"class": c.value}),
                e2e=self.e2e.bind({"class": c.value}),
            )
            for c in EVERY_CLASS
        }
        for c in EVERY_CLASS:
            self.requests_in(c.value, class_pools[c.value])
        self.streams_active.ensure()
        self.stream_buffer_peak.ensure()
        self.upstream_connections_open.ensure()

    def requests_in(self, request_class: str, pool: str) -> BoundValue:
        """The request count of one class in one pool, bound on first use."""
        by_pool = self.by_class[request_class].requests
        bound = by_pool.get(pool)
        if bound is None:
            bound = by_pool[pool] = self.requests.bind({"class": request_class, "pool": pool})
        return bound

    def render(self) -> str:
        return self.registry.render()
