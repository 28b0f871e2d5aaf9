"""Stack profiles: which pools a smoke run starts, how each is tuned, and which class goes where.

A profile is data (profiles/<name>.yaml). A pool's settings are the common `PoolSettings` plus its serving
engine's own knobs: each engine's package owns a subclass, and the loader hands their `ByEngine` in through the
validation context (POOL_MODELS), so this module names no engine. Its `router` and `traffic` sections are handed
to the router's and the traffic generator's own schema models, so a typo there is reported with this file's name
and key path just like one in the pool settings. builders/smoke/profile.py loads profiles with the registry's
pool models.
"""

from __future__ import annotations

import difflib
import enum
import re
import types
import typing
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from builders.config.by_engine import POOL_MODELS, ByEngine
from builders.config.types import EnvName, ImageRef, OneLine
from builders.cpusets import format_cpuset, parse_cpuset
from builders.errors import ConfigError
from builders.router.classes import ALL_CLASSES, RequestClass

_POOL_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSettings(_Strict):
    """The tiny random model every replica serves, and the settings all pools share."""

    max_model_len: int = Field(
        default=2048, ge=64, description="Context length of every replica unless a pool overrides it."
    )
    max_position_embeddings: int = Field(
        default=4096,
        ge=64,
        description="Positions the generated model config declares; must cover every max_model_len.",
    )
    dtype: Literal["auto", "bfloat16", "float32", "float16"] = Field(
        default="auto",
        description="Weights and activations dtype. 'auto': bfloat16 where the serving CPU has native BF16 "
        "(AVX512-BF16, AMX or Arm BF16), float32 elsewhere (builders/serving_dtype.py). An explicit dtype wins; "
        "bfloat16 without native support is warned about, it served ~55x slower here.",
    )
    enforce_eager: bool = Field(
        default=True,
        description="Skip torch.compile: startup drops from about 45 s to about 20 s per replica on 2 cores, "
        "and the compile cache would not survive a throwaway container anyway.",
    )
    kv_cache_memory: str = Field(
        default="128M",
        pattern=r"^\d+(\.\d+)?[kKmMgG]?$",
        description="KV cache size per replica (vLLM's --kv-cache-memory-bytes, human-readable: 128M = 128 MiB).",
    )
    served_model_name: OneLine = Field(default="forge-tiny", min_length=1, description="Model name clients send.")
    hidden_size: int = Field(
        default=128,
        ge=64,
        multiple_of=64,
        description="Hidden size of the generated Llama (64 per attention head). The smoke default is tiny; "
        "a sweep needs prefills that cost real time (1024 with 8 layers: ~1 s for 2,900 tokens on one core).",
    )
    num_hidden_layers: int = Field(default=2, ge=1, le=64, description="Layers of the generated Llama.")
    intermediate_size: int | None = Field(
        default=None, ge=64, description="MLP width of the generated Llama; default 2 × hidden_size."
    )
    seed: int = Field(default=0, ge=0, description="Sampling seed of every replica.")


class PoolSettings(_Strict):
    """One pool: identical replicas of one serving engine, tuned for the classes routed to it. These are the
    settings every engine's pools share; each engine's own knobs are its subclass's (builders/engines/<name>/)."""

    engine: str = Field(
        description="The serving engine its replicas run (default: the registry's default engine). Each has its "
        "own knobs; setting another's is an error."
    )
    image: ImageRef | None = Field(
        default=None,
        description="Image the replicas run from; default the image given on the command line for this engine "
        "(`forge smoke --help` lists each engine's option).",
    )
    replicas: int = Field(default=1, ge=1, le=8, description="Number of servers in the pool.")
    max_model_len: int | None = Field(
        default=None, ge=64, description="Context length of this pool; default from model."
    )
    extra_args: tuple[OneLine, ...] = Field(
        default=(),
        description="Further server arguments, checked against the server's own help in the image before start.",
    )
    env: dict[EnvName, OneLine] = Field(default_factory=dict, description="Extra environment of each replica.")
    cpus: tuple[str, ...] = Field(
        default=(),
        description="CPU set of each replica in Linux cpuset syntax ('1', '0-3', '0,2'): one entry per replica, "
        "or one entry every replica of the pool shares. Containers get it as --cpuset-cpus, host processes "
        "as their CPU affinity (every process vLLM starts inherits it), and vLLM's OpenMP threads are bound "
        "to it (VLLM_CPU_OMP_THREADS_BIND). Empty: the replicas are not confined (see cpu_bind).",
    )

    @field_validator("cpus")
    @classmethod
    def _cpusets(cls, cpus: tuple[str, ...]) -> tuple[str, ...]:
        for i, text in enumerate(cpus):
            try:
                parse_cpuset(text)
            except ValueError as exc:
                raise ValueError(f"cpus[{i}]: {exc}") from None
        return cpus

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, name: str, info: ValidationInfo) -> str:
        # Reached with the common model only when no engine's model took the pool: its engine is unknown.
        known: ByEngine[PoolSettings] | None = (info.context or {}).get(POOL_MODELS)
        if known is not None and name not in known.models:
            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": _either(known.names)})
        return name

    def problems(self, profile: StackProfile, name: str) -> list[str]:
        """What is inconsistent in this engine's settings of pool `name`, one message per problem, each naming
        its key; checked when the profile loads (an engine's pool model adds its own)."""
        return []

    @property
    def max_sequences(self) -> int | None:
        """The most requests one replica runs at once, where the pool's engine settings fix it (None: not set)."""
        return None

    @property
    def own_model(self) -> str | None:
        """The model name this pool serves where its engine's settings give it one of its own (None:
        model.served_model_name): a second model behind the same router, reached by requests naming it."""
        return None

    @property
    def embeds(self) -> bool:
        """Whether the pool serves its model as an embedding model (its requests are embeddings, not chat turns)."""
        return False

    def cpuset_of(self, index: int) -> str | None:
        """The CPU set replica `index` is confined to, or None when the pool sets none."""
        if not self.cpus:
            return None
        return self.cpus[index] if len(self.cpus) > 1 else self.cpus[0]


def _either(names: typing.Sequence[str]) -> str:
    quoted = [repr(n) for n in names]
    return " or ".join(quoted) if len(quoted) < 3 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _engine_model(value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
    """A pool validated by its engine's model (the loader's POOL_MODELS), else by the common model, which then
    names the unknown engine."""
    known: ByEngine[PoolSettings] | None = (info.context or {}).get(POOL_MODELS)
    if known is not None and isinstance(value, dict):
        model = known.pick(value)
        if model is not None:
            return model.model_validate(known.without_unset_foreign(value, common=PoolSettings), context=info.context)
    return handler(value)


Pool = Annotated[SerializeAsAny[PoolSettings], WrapValidator(_engine_model)]
"""A pool as a profile holds it: an instance of its engine's model, dumped with that model's fields."""


class PortSettings(_Strict):
    """Loopback ports: the router takes `base`, replicas the ports after it in pool order."""

    base: int = Field(default=18100, ge=1024, le=65000, description="Router port; replica ports follow it.")


class SlowClientCheck(_Strict):
    """Isolation check (a): slow readers must not slow the other classes down."""

    max_ratio: float = Field(
        default=1.5,
        ge=1.0,
        description="Other classes' p99 TTFT and ITL with slow clients may be this many times their p99 in a "
        "baseline run where the same streams are read at full speed ...",
    )
    allowance_ms: float = Field(
        default=50.0, ge=0, description="... plus this many milliseconds, so scheduler noise on tiny numbers passes."
    )
    scope: Literal["other_pools", "all_classes"] = Field(
        default="other_pools",
        description="Which classes are held to the margin: those served by pools other than slow_stream's "
        "(what routing promises), or every class (what a shared pool is measured by).",
    )


class KillReplicaCheck(_Strict):
    """Isolation check (b): a replica dying mid-run fails only its own clients, and fails them fast."""

    pool: str = Field(description="Pool one of whose replicas is killed.")
    after_s: float = Field(
        default=5.0,
        gt=0,
        description="Seconds into the traffic run after which the replica is killed, at the first moment it "
        "is generating (its vllm:num_requests_running gauge above 0).",
    )
    error_within_s: float = Field(
        default=5.0, gt=0, description="Clients in flight on the killed replica must get an error within this time."
    )
    traffic: dict[str, Any] = Field(
        default_factory=dict,
        description="Changes to the traffic section for this run (merged key by key), so that requests are "
        "still being generated on the victim at after_s and the other classes still run after it.",
    )


class CheckSettings(_Strict):
    """Settings of the isolation checks; whether they run is chosen on the command line."""

    slow_clients: SlowClientCheck = Field(
        default_factory=lambda: SlowClientCheck(), description="Margins of the slow-client check."
    )
    kill_replica: KillReplicaCheck | None = Field(default=None, description="Which pool loses a replica, and when.")


class DeploySettings(_Strict):
    """How `forge deploy render` writes the stack for a cluster (smoke runs ignore it)."""

    discovery: Literal["dns", "kubernetes"] = Field(
        default="dns",
        description="How the router finds the replicas: dns, every address of each pool's headless Service (no "
        "API permissions); kubernetes, the Ready pods of each pool's labels through the API (renders a "
        "ServiceAccount, a Role to get/list/watch pods and its RoleBinding; the router image needs the "
        "`kubernetes` client, forge-vllm[kubernetes]).",
    )


class Timeouts(_Strict):
    """Upper bounds on every phase, so a smoke run always ends."""

    startup_s: float = Field(default=300.0, gt=0, description="All replicas and the router healthy within this time.")
    probe_s: float = Field(default=180.0, gt=0, description="Asking the image's vLLM for its arguments.")
    traffic_s: float = Field(default=300.0, gt=0, description="One traffic run, from its start to its result.")


class StackProfile(_Strict):
    """A whole smoke-test stack: model, pools, class map, router settings, traffic plan, checks."""

    name: OneLine = Field(description="Profile name; the file's stem.")
    description: OneLine = Field(default="", description="What this profile is for.")
    model: ModelSettings = Field(default_factory=lambda: ModelSettings(), description="Model settings.")
    ports: PortSettings = Field(default_factory=lambda: PortSettings(), description="Loopback ports.")
    cpu_bind: Literal["round_robin", "auto", "nobind"] = Field(
        default="round_robin",
        description="How the OpenMP threads of replicas in pools without `cpus` are pinned: round_robin gives "
        "replica k core k mod N (vLLM's 'auto' pins every replica to the same core); 'nobind' leaves it to the "
        "kernel. Only the OpenMP threads are pinned this way, not the replica's other processes: for isolation "
        "give the pools `cpus`.",
    )
    pools: dict[str, Pool] = Field(description="Pool name -> settings (names: lowercase, digits, '-').")
    classes: dict[RequestClass, str] = Field(description="Each of the six request classes -> pool name.")
    router: dict[str, Any] = Field(
        default_factory=dict,
        description="Further RouterConfig settings (builders/router/config.py); pools, ports and keys are "
        "filled in by the smoke run.",
    )
    traffic: dict[str, Any] = Field(
        default_factory=dict, description="The traffic plan, as builders.traffic's TrafficPlan fields."
    )
    checks: CheckSettings = Field(
        default_factory=lambda: CheckSettings(), description="Settings of the isolation checks."
    )
    timeouts: Timeouts = Field(default_factory=lambda: Timeouts(), description="Phase time limits.")
    deploy: DeploySettings = Field(
        default_factory=lambda: DeploySettings(), description="Settings of `forge deploy render`."
    )

    @field_validator("pools")
    @classmethod
    def _pool_names(cls, pools: dict[str, Pool]) -> dict[str, Pool]:
        if not pools:
            raise ValueError("at least one pool is needed")
        for name in pools:
            if not _POOL_NAME.match(name):
                raise ValueError(f"pool name {name!r} must be lowercase letters, digits and '-' (max 31)")
        return pools

    @model_validator(mode="after")
    def _consistent(self) -> StackProfile:
        missing = [c.value for c in ALL_CLASSES if c not in self.classes]
        if missing:
            raise ValueError(f"classes: {', '.join(missing)} have no pool; map every class to a pool")
        for request_class, target in self.classes.items():
            if target not in self.pools:
                raise ValueError(
                    f"classes.{request_class.value}: unknown pool {target!r}{_suggest(target, self.pools)}"
                )
        for name, settings in self.pools.items():
            if settings.embeds and self.serves(name) == self.model.served_model_name:
                raise ValueError(f"pools.{name}: an embed pool serves a model of its own; set its served_model_name")
        for request_class, target in self.classes.items():
            if self.serves(target) != self.model.served_model_name:
                raise ValueError(
                    f"classes.{request_class.value}: pool {target!r} serves {self.serves(target)!r}, not "
                    f"{self.model.served_model_name!r}; classes go to the pools of model.served_model_name"
                )
        unused = sorted(set(self.pools) - set(self.classes.values()) - set(self.model_pools()))
        if unused:
            raise ValueError(f"pools {unused} receive no class; map a class to them or drop them")
        kill = self.checks.kill_replica
        if kill is not None and kill.pool not in self.pools:
            raise ValueError(f"checks.kill_replica.pool: unknown pool {kill.pool!r}{_suggest(kill.pool, self.pools)}")
        for name, settings in self.pools.items():
            length = settings.max_model_len or self.model.max_model_len
            if length > self.model.max_position_embeddings:
                raise ValueError(
                    f"pools.{name}: max_model_len {length} exceeds model.max_position_embeddings "
                    f"{self.model.max_position_embeddings}"
                )
        for name, settings in self.pools.items():
            problems = settings.problems(self, name)
            if problems:
                raise ValueError("; ".join(problems))
            if len(settings.cpus) not in (0, 1, settings.replicas):
                raise ValueError(
                    f"pools.{name}.cpus: {len(settings.cpus)} CPU sets for {settings.replicas} replica(s); give one "
                    "per replica, or one for the whole pool"
                )
        last = self.ports.base + self.replica_count
        if last > 65535:
            raise ValueError(f"ports.base {self.ports.base} leaves no room for {self.replica_count} replicas")
        return self

    def serves(self, pool: str) -> str:
        """The model name pool `pool` serves."""
        return self.pools[pool].own_model or self.model.served_model_name

    def model_pools(self) -> dict[str, str]:
        """Pools that serve another model than model.served_model_name, with that model: they take no class."""
        return {name: self.serves(name) for name in self.pools if self.serves(name) != self.model.served_model_name}

    @property
    def replica_count(self) -> int:
        return sum(p.replicas for p in self.pools.values())

    def classes_of(self, pool: str) -> list[RequestClass]:
        return [c for c in ALL_CLASSES if self.classes[c] == pool]


def check_cpus_available(profile: StackProfile, *, source: str, available: typing.Collection[int]) -> None:
    """Every pool's CPU sets exist on this host (the CPUs this process may run on), else a ConfigError naming
    the profile file and the key."""
    problems = []
    for name, pool in profile.pools.items():
        for i, text in enumerate(pool.cpus):
            missing = sorted(parse_cpuset(text) - set(available))
            if missing:
                problems.append(
                    f"{source}: pools.{name}.cpus[{i}]: CPU(s) {format_cpuset(missing)} of {text!r} are not "
                    f"available here (this host offers {format_cpuset(available) or 'none'})"
                )
    if problems:
        raise ConfigError(
            "\n  ".join(problems),
            hint="give the pools CPU sets within the host's CPUs, or run on a machine with more cores",
        )


def _suggest(name: str, choices: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


# --- loading ----------------------------------------------------------------------------------------------


def _inner(annotation: Any, part: str | int) -> Any:
    """The type found one step down `annotation` along a key path part (a field, dict key or list index)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            if arg is type(None):
                continue
            found = _inner(arg, part)
            if found is not None:
                return found
        return None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(str(part))
        return field.annotation if field is not None else None
    if origin is dict and len(args) == 2:
        return args[1]
    if origin in (list, tuple) and args:
        return args[0]
    return None


def _keys_at(model: type[BaseModel], path: tuple[str | int, ...]) -> list[str]:
    """Valid keys where `path` points in `model`: fields, or enum values for a dict keyed by an enum."""
    annotation: Any = model
    for part in path:
        annotation = _inner(annotation, part)
        if annotation is None:
            return []
    origin_args = typing.get_args(annotation)
    for arg in (annotation, *origin_args):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return list(arg.model_fields)
    if typing.get_origin(annotation) is dict:
        key = typing.get_args(annotation)[0]
        if isinstance(key, type) and issubclass(key, enum.Enum):
            return [str(m.value) for m in key]
    return []


def _dotted(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def explain(
    exc: ValidationError,
    source: str,
    *,
    model: type[BaseModel] | None = None,
    prefix: tuple[str | int, ...] = (),
    pools: ByEngine[PoolSettings] | None = None,
    data: Any = None,
) -> list[str]:
    """One line per validation error of `model` (found at `prefix` in the file): file, key path, what is
    wrong, the closest valid key. With the pools' models and the profile's `data`, a key under a pool is looked
    up in that pool's engine's model, and a key of another engine's is named as that engine's."""
    root = model or StackProfile
    lines = []
    for err in exc.errors():
        loc = tuple(part for part in err["loc"] if part != "[key]")
        path = (*prefix, *loc)
        where, inner = root, loc[:-1]
        pool = _pool_of(loc, pools, data) if root is StackProfile else None
        if pool is not None:
            where, inner = pool[1], loc[2:-1]
        if err["type"] == "extra_forbidden" and pool is not None and len(loc) == 3 and pools is not None:
            other = pools.owner(str(loc[-1]), besides=pool[0], common=PoolSettings)
            if other is not None:
                lines.append(
                    f"{source}: {_dotted(path)}: a {pools.titles[other]} setting, but this pool's engine is "
                    f"{pool[0]}; drop it, or set engine: {other}"
                )
                continue
        if err["type"] == "extra_forbidden":
            close = _suggest(str(loc[-1]), _keys_at(where, inner))
            lines.append(f"{source}: {_dotted(path)}: unknown key{close}")
        elif err["type"] == "enum" and err["loc"][-1] == "[key]":
            close = _suggest(str(loc[-1]), _keys_at(where, inner))
            lines.append(f"{source}: {_dotted(path)}: not a request class{close}")
        else:
            lines.append(f"{source}: {_dotted(path)}: {err['msg']}")
    return lines


def _pool_of(
    loc: tuple[str | int, ...], pools: ByEngine[PoolSettings] | None, data: Any
) -> tuple[str, type[BaseModel]] | None:
    """The engine and model of the pool an error under `pools.<name>` is in (None elsewhere)."""
    if pools is None or len(loc) < 3 or loc[0] != "pools" or not isinstance(data, dict):
        return None
    raw = (data.get("pools") or {}).get(loc[1]) if isinstance(data.get("pools"), dict) else None
    model = pools.pick(raw)
    return (pools.name_of(raw), model) if model is not None else None


def profile_from_mapping(data: Any, *, source: str, name: str, pools: ByEngine[PoolSettings]) -> StackProfile:
    """Validate parsed YAML, each pool by its engine's model in `pools`; every error names `source`, the key path
    and, for a typo, the intended key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a profile must be a mapping, found {type(data).__name__}")
    try:
        profile = StackProfile.model_validate({"name": name, **data}, context={POOL_MODELS: pools})
    except ValidationError as exc:
        raise ConfigError(
            "\n  ".join(explain(exc, source, pools=pools, data=data)),
            hint="fix the keys named above; every field is described in schemas/profile.schema.json",
        ) from None
    return profile
