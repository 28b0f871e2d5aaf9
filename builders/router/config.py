"""Router configuration: validated, frozen, loaded from a JSON or YAML file."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from builders.errors import ConfigError
from builders.router.classes import ALL_CLASSES, RequestClass, TrafficClass


class SlowClientDetection(BaseModel):
    """How the router learns that a client reads slowly, so its later streams go to the slow pool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=True, description="Remember clients that stalled a stream and classify them slow.")
    client_id_header: str = Field(
        default="x-client-id",
        description="Header naming the client; without it a client cannot be remembered (peer addresses "
        "are all 127.0.0.1 behind a local proxy, so they are not used).",
    )
    stall_s: float = Field(
        default=0.5, gt=0, description="A single wait for the client to drain longer than this marks the client slow."
    )
    remember_s: float = Field(default=300.0, gt=0, description="How long a client stays marked slow.")
    max_clients: int = Field(default=10_000, ge=1, description="Bound on remembered slow clients (oldest forgotten).")


class DnsDiscovery(BaseModel):
    """A pool whose replicas are every address its DNS name resolves to (a Kubernetes headless Service)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dns: str = Field(
        min_length=1,
        description="Name whose A records are the pool's replicas, e.g. forge-pool-bulk.NAMESPACE.svc.cluster.local.",
    )
    port: int = Field(ge=1, le=65535, description="Port every replica listens on.")
    scheme: Literal["http", "https"] = Field(default="http", description="Scheme of the replica base URLs.")
    interval_s: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between resolutions: a replica that stops resolving leaves the pool (its running "
        "streams go on), a new address joins it.",
    )


class KubernetesDiscovery(BaseModel):
    """A pool whose replicas are the Ready pods a label selector picks, listed and watched through the Kubernetes
    API (builders/router/kubernetes_discovery.py; needs the `kubernetes` client and get/list/watch on pods)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    label_selector: str = Field(
        min_length=1,
        description="Selector of the pool's pods, e.g. app.kubernetes.io/instance=forge-ci,forge/pool=bulk.",
    )
    namespace: str | None = Field(
        default=None,
        description="Namespace of the pods; default: the router pod's own (its service account's), else the "
        "kubeconfig context's, else 'default'.",
    )
    port: int = Field(ge=1, le=65535, description="Port every replica listens on.")
    scheme: Literal["http", "https"] = Field(default="http", description="Scheme of the replica base URLs.")
    interval_s: float = Field(
        default=1.0,
        gt=0,
        description="Seconds between applying what the watch has seen to the pool: a pod that turns NotReady "
        "or terminating leaves it (its running streams go on), a Ready one joins.",
    )


def _discovery_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "kubernetes" if "label_selector" in value else "dns"
    return "kubernetes" if isinstance(value, KubernetesDiscovery) else "dns"


Discovery = Annotated[
    Annotated[DnsDiscovery, Tag("dns")] | Annotated[KubernetesDiscovery, Tag("kubernetes")],
    Discriminator(_discovery_kind),
]
"""A `discovery` entry: DNS when it names `dns`, the Kubernetes API when it names `label_selector`."""


class RouterConfig(BaseModel):
    """Everything the class-aware router needs: where to listen, which pools exist, how to protect itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(default="127.0.0.1", description="Address to listen on; loopback by default.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port to listen on; 0 picks a free one.")
    pools: dict[str, list[str]] = Field(
        description="Pool name -> base URLs of its vLLM replicas (http://127.0.0.1:PORT, no /v1 suffix); "
        "empty for a pool found through `discovery`."
    )
    discovery: dict[str, Discovery] = Field(
        default_factory=dict,
        description="Pool name -> how its replicas are found at run time instead of a fixed list "
        "(builders/router/discovery.py); such a pool lists no URLs in `pools`.",
    )
    class_pools: dict[RequestClass, str] = Field(
        default_factory=dict,
        description="Request class -> pool name; classes left out go to default_pool. Among the pools that serve "
        "a request's `model`, the class's pool is chosen if it is one of them, else the first in `pools` order.",
    )
    default_pool: str | None = Field(
        default=None,
        description="Pool for classes missing from class_pools, and for requests that are not generation "
        "(embeddings, score, rerank, tokenize, transcription) and name no `model`; without it those go to the "
        "interactive class's pool. GET /version is answered by it too.",
    )
    models: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Pool name -> the model names its replicas serve, instead of asking them. A pool left out is "
        "learnt from its replicas' GET /v1/models (asked when a replica joins the pool or comes back healthy). A "
        "request's `model` selects the pools that serve it; a model no pool serves gets a 404 naming those served.",
    )
    models_refresh_s: float = Field(
        default=60.0,
        gt=0,
        description="A healthy replica's models are asked again after this many seconds (a LoRA adapter loaded at run "
        "time is routed to from then on); they are asked at once when the replica joins or comes back.",
    )
    api_key: str | None = Field(
        default=None,
        description="If set, /v1/* requires 'Authorization: Bearer <key>'; /health and /metrics do not. "
        "Must be non-empty printable ASCII without spaces (an empty key would admit 'Bearer' with no token).",
    )
    upstream_api_key: str | None = Field(
        default=None, description="Bearer key sent to replicas; the client's own Authorization is never forwarded."
    )
    stream_buffer_bytes: int = Field(
        default=256 * 1024,
        ge=4096,
        description="Per-stream bound on bytes the router holds for a client; above it the stream is cut.",
    )
    stream_cut_timeout_s: float = Field(
        default=10.0, gt=0, description="How long a client that does not drain may block its stream before it is cut."
    )
    client_sndbuf_bytes: int | None = Field(
        default=65536,
        ge=4096,
        description="SO_SNDBUF for streaming client sockets, so a stalled reader is seen within this many "
        "kernel bytes instead of megabytes of autotuned buffer; null leaves the kernel default.",
    )
    connect_timeout_s: float = Field(default=2.0, gt=0, description="TCP connect timeout to a replica.")
    first_byte_timeout_s: float = Field(
        default=120.0, gt=0, description="Wait for a replica's first response byte (prefill included) before 504."
    )
    upstream_keep_alive: bool = Field(
        default=True,
        description="Reuse a replica connection for the next request. Off: every request opens its own loopback "
        "connection, for servers that close a reused one before answering (llama.cpp's llama-server did so "
        "under the smoke traffic; forge smoke turns it off for stacks with llama.cpp pools).",
    )
    upstream_pool_idle_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="A pooled keep-alive connection to a replica that has carried no request for this long is "
        "closed, so the router's connections and fds follow the present load, not its busiest past moment. Health "
        "checks and non-streamed requests keep theirs for at least half of it. /metrics shows the pool "
        "(forge_router_upstream_connections).",
    )
    upstream_idle_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="Longest silence from a replica mid-stream before the stream ends with an error.",
    )
    max_response_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024, description="Largest non-streamed response body accepted from a replica."
    )
    max_request_bytes: int = Field(default=32 * 1024 * 1024, ge=1024, description="Largest request body accepted.")
    max_json_depth: int = Field(
        default=64,
        ge=4,
        le=500,
        description="Deepest nesting of arrays and objects a request body may have (400 above).",
    )
    max_json_elements: int = Field(
        default=200_000,
        ge=1000,
        description="Most JSON values (array items, object members, containers) a request body may have (400 "
        "above); bounds the memory and CPU one body can cost. The default fits a 128k-token token-id prompt.",
    )
    offload_parse_bytes: int = Field(
        default=256 * 1024,
        ge=0,
        description="Request bodies at least this large are checked and parsed on a worker thread, so one big "
        "body does not hold up every other stream on the event loop.",
    )
    idle_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="A client connection must send a complete request head within this many seconds of connecting "
        "or of its previous response, else it is closed: the keep-alive idle timeout and the header timeout at once "
        "(aiohttp runs one timer for both). Longer than the pool expiry of common clients (aiohttp 15 s, httpx and "
        "so the OpenAI SDK 5 s), so a pooled connection is retired by its client, never closed under a new request.",
    )
    body_timeout_s: float = Field(
        default=30.0, gt=0, le=3600, description="A request body must arrive completely within this time (408 if not)."
    )
    drain_grace_s: float = Field(
        default=8.0,
        ge=0,
        le=3600,
        description="On SIGTERM the router stops accepting and lets streams run this long; then each remaining one "
        "ends with an SSE error event (a waiting non-streamed request gets a 503). A second SIGTERM ends the grace. "
        "The default stays under Docker's 10 s stop timeout, so the events go out before SIGKILL.",
    )
    health_interval_s: float = Field(default=2.0, gt=0, description="Seconds between GET /health rounds on replicas.")
    health_timeout_s: float = Field(default=1.0, gt=0, description="Timeout of one replica health check.")
    long_prefill_tokens: int = Field(
        default=2048, ge=1, description="Estimated prompt tokens (chars/4) at or above which a request is long_prefill."
    )
    batch_max_tokens: int = Field(
        default=512, ge=1, description="max_tokens at or above which a non-streamed request is batch."
    )
    prefix_chars: int = Field(
        default=256, ge=16, description="Leading prompt characters that form the shared prefix (rag and affinity)."
    )
    prefix_ttl_s: float = Field(default=600.0, gt=0, description="How long a seen prefix counts as 'seen recently'.")
    prefix_cache_entries: int = Field(
        default=10_000, ge=1, description="Bound on remembered prefixes and affinity entries (oldest forgotten)."
    )
    affinity_max_extra_in_flight: int = Field(
        default=4,
        ge=0,
        description="Affinity is kept unless its replica has more than this many in-flight requests above "
        "the least loaded healthy replica.",
    )
    upstream_connection_limit: int = Field(
        default=1000,
        ge=1,
        description="Bound on connections in use from the router to all replicas together, for streamed and "
        "for non-streamed requests each (two clients); idle keep-alive connections do not count. A request "
        "waits for a free one within connect_timeout_s.",
    )
    spill: dict[str, str] = Field(
        default_factory=dict,
        description="Work-conserving routing: pool -> pool whose idle replicas (nothing in flight) may take "
        "this pool's requests while every replica of this pool is busy (builders/router/work_conserving.py).",
    )
    spill_max_prompt_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Only requests whose prompt is estimated at no more than this many tokens spill: a long "
        "prompt borrowed by a latency replica lengthens every one of its steps until it is prefilled, and "
        "that is the latency its own classes pay. Null: any request may spill.",
    )
    class_priority: dict[RequestClass, int] = Field(
        default_factory=dict,
        description="Priority written into each request body by class (lower is served first); the replicas "
        "must run with --scheduling-policy priority, or vLLM refuses the field.",
    )
    slow_client: SlowClientDetection = Field(
        default_factory=SlowClientDetection, description="Slow-client detection settings."
    )

    @field_validator("pools")
    @classmethod
    def _replica_urls(cls, pools: dict[str, list[str]]) -> dict[str, list[str]]:
        if not pools:
            raise ValueError("at least one pool is needed")
        for name, urls in pools.items():
            for url in urls:
                parts = urlsplit(url)
                if parts.username is not None or parts.password is not None:
                    # Replica URLs appear on the unauthenticated /health and /metrics and in x-forge-replica.
                    shown = f"{parts.scheme}://***@{parts.hostname}:{parts.port}"
                    raise ValueError(
                        f"pool {name!r}: replica {shown} has credentials in its URL, which the router would show in "
                        "/health, /metrics and x-forge-replica; remove them and set upstream_api_key instead"
                    )
                if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
                    raise ValueError(f"pool {name!r}: replica {url!r} is not a base URL like http://127.0.0.1:8001")
                if parts.path.rstrip("/"):
                    raise ValueError(f"pool {name!r}: replica {url!r} has a path; give the base URL without /v1")
            if len(set(urls)) != len(urls):
                raise ValueError(f"pool {name!r} lists a replica twice")
        return {name: [u.rstrip("/") for u in urls] for name, urls in pools.items()}

    @field_validator("api_key", "upstream_api_key")
    @classmethod
    def _usable_key(cls, key: str | None) -> str | None:
        if key is None:
            return None
        if not key:
            raise ValueError("is empty; leave it out (or null) for no key, or set a real key")
        if not key.isascii() or not key.isprintable() or " " in key:
            raise ValueError("must be printable ASCII without spaces, as a Bearer token is")
        return key

    @model_validator(mode="after")
    def _every_class_has_a_pool(self) -> RouterConfig:
        for name in self.discovery:
            if name not in self.pools:
                close = difflib.get_close_matches(name, list(self.pools), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"discovery.{name}: unknown pool{hint}; add it to pools with an empty list")
        for name, urls in self.pools.items():
            if not urls and name not in self.discovery:
                raise ValueError(f"pool {name!r} has no replicas; list at least one base URL or give it discovery")
            if urls and name in self.discovery:
                raise ValueError(f"pool {name!r} lists replicas and has discovery; use one or the other")
        for name, served in self.models.items():
            if name not in self.pools:
                close = difflib.get_close_matches(name, list(self.pools), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"models.{name}: unknown pool{hint}")
            if not served or not all(isinstance(m, str) and m.strip() == m and m for m in served):
                raise ValueError(f"models.{name}: list the model names (non-empty, no surrounding spaces) it serves")
        if self.default_pool is not None and self.default_pool not in self.pools:
            raise ValueError(f"default_pool {self.default_pool!r} is not a pool; pools: {sorted(self.pools)}")
        for request_class, pool in self.class_pools.items():
            if pool not in self.pools:
                close = difflib.get_close_matches(pool, list(self.pools), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"class_pools.{request_class.value} names unknown pool {pool!r}{hint}")
        for source, target in self.spill.items():
            for name in (source, target):
                if name not in self.pools:
                    close = difflib.get_close_matches(name, list(self.pools), n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise ValueError(f"spill.{source}: unknown pool {name!r}{hint}")
            if source == target:
                raise ValueError(f"spill.{source}: a pool cannot spill onto itself")
        missing = [c.value for c in ALL_CLASSES if c not in self.class_pools]
        if missing and self.default_pool is None:
            raise ValueError(f"classes {missing} have no pool: add them to class_pools or set default_pool")
        return self

    def pool_for(self, request_class: TrafficClass) -> str:
        """The pool a request of this class goes to when its `model` does not decide (none given, or served by
        several pools)."""
        if isinstance(request_class, RequestClass):
            pool = self.class_pools.get(request_class)
            if pool is not None:
                return pool
        return self.fallback_pool()

    def fallback_pool(self) -> str:
        """The pool of what no class maps: default_pool, else the interactive class's."""
        pool = self.default_pool or self.class_pools.get(RequestClass.INTERACTIVE)
        assert pool is not None  # guaranteed by _every_class_has_a_pool
        return pool


def _explain(exc: ValidationError, data: Any, source: str) -> str:
    lines = []
    for err in exc.errors():
        parts = list(err["loc"])
        tagged = len(parts) > 2 and parts[0] == "discovery" and parts[2] in ("dns", "kubernetes")
        # The union's tag is pydantic's, not a key of the file: the path names what the user wrote.
        loc = ".".join(str(part) for i, part in enumerate(parts) if not (tagged and i == 2))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            parent: Any = data
            for part in err["loc"][:-1]:
                parent = parent.get(part) if isinstance(parent, dict) else None
            model: type[BaseModel] = RouterConfig
            if len(err["loc"]) > 1 and err["loc"][0] == "slow_client":
                model = SlowClientDetection
            elif tagged:
                model = KubernetesDiscovery if parts[2] == "kubernetes" else DnsDiscovery
            close = difflib.get_close_matches(str(err["loc"][-1]), list(model.model_fields), n=1)
            if close:
                msg += f"; did you mean {close[0]!r}?"
        lines.append(f"{source}: {loc or '<top>'}: {msg}")
    return "\n".join(lines)


def config_from_mapping(data: Any, *, source: str = "<config>") -> RouterConfig:
    """Validate an already parsed mapping; errors name the source, the key path and a close valid key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the router config must be a mapping, found {type(data).__name__}")
    try:
        return RouterConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            _explain(exc, data, source),
            hint="fix the keys named above; the fields are described in builders/router/config.py",
        ) from None


def load_config(path: str | Path) -> RouterConfig:
    """Read a router config from a JSON or YAML file (JSON is valid YAML, so one parser serves both)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read router config {file}: {exc.strerror}", hint="pass an existing file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML/JSON: {exc}", hint="fix the syntax at the place named") from None
    return config_from_mapping(data, source=str(file))
