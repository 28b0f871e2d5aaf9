"""Stack profiles: which vLLM pools a smoke run starts, how each is tuned, and which class goes where.

A profile is data (profiles/<name>.yaml). Its `router` and `traffic` sections are handed to the router's
and the traffic generator's own schema models, so a typo there is reported with this file's name and key
path just like one in the pool settings.
"""

from __future__ import annotations

import difflib
import enum
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from builders.config.loading import load_yaml
from builders.cpusets import format_cpuset, parse_cpuset
from builders.engines import DEFAULT_KIND, SERVING_ENGINES, LlamaCppSettings, ServerKind, ServingEngine, SGLangSettings
from builders.errors import ConfigError, UsageError
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
    served_model_name: str = Field(default="forge-tiny", min_length=1, description="Model name clients send.")
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
    """One pool: identical replicas of one serving engine, tuned for the classes routed to it."""

    engine: ServerKind = Field(
        default=DEFAULT_KIND,
        description="The server its replicas run: vllm (`vllm serve`), llama-cpp (llama.cpp's llama-server) or "
        "sglang (SGLang's CPU server). "
        "Each has its own knobs; setting the other's is an error.",
    )
    image: str | None = Field(
        default=None,
        description="Image the replicas run from; default the image given on the command line for this engine "
        "(IMAGE for vllm, --llama-image for llama-cpp).",
    )
    replicas: int = Field(default=1, ge=1, le=8, description="Number of servers in the pool.")
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, description="Token budget per scheduler step (small keeps decode steps short for TTFT/ITL)."
    )
    max_num_seqs: int | None = Field(default=None, ge=1, description="Most sequences one replica runs at once.")
    long_prefill_token_threshold: int | None = Field(
        default=None, ge=0, description="Prompt length above which a prefill is chunked to share steps with decodes."
    )
    stream_interval: int | None = Field(
        default=None, ge=1, description="Tokens per streamed chunk (1 = every token, lowest inter-token latency)."
    )
    enable_prefix_caching: bool | None = Field(default=None, description="Reuse KV blocks of shared prompt prefixes.")
    llama_cpp: LlamaCppSettings | None = Field(
        default=None, description="llama-server's own knobs (engine: llama-cpp only): slots, context, batches, threads."
    )
    sglang: SGLangSettings | None = Field(
        default=None,
        description="SGLang's own knobs (engine: sglang only): chunked prefill size, running requests, prefill "
        "batch tokens, KV pool tokens (builders/engines/sglang/serve.py names their vLLM counterparts).",
    )
    max_model_len: int | None = Field(
        default=None, ge=64, description="Context length of this pool; default from model."
    )
    extra_args: tuple[str, ...] = Field(
        default=(),
        description="Further server arguments (`vllm serve` or `llama-server`), checked against the server's own "
        "help in the image before start.",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment of each replica.")
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

    @property
    def serving(self) -> ServingEngine:
        return SERVING_ENGINES[self.engine]

    def foreign_knobs(self) -> list[tuple[str, ServingEngine]]:
        """Settings given for another serving engine than this pool's, with the engine they belong to. A knob
        written out at its default (a dumped profile spells every field, `llama_cpp: null` included) sets nothing,
        so a profile read back from its own dump is the same profile."""
        fields = type(self).model_fields
        return [
            (field, other)
            for field in sorted(self.model_fields_set)
            if getattr(self, field) != fields[field].get_default(call_default_factory=True)
            for other in SERVING_ENGINES.values()
            if other is not self.serving and field in other.knobs and field not in self.serving.knobs
        ]

    def cpuset_of(self, index: int) -> str | None:
        """The CPU set replica `index` is confined to, or None when the pool sets none."""
        if not self.cpus:
            return None
        return self.cpus[index] if len(self.cpus) > 1 else self.cpus[0]


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

    name: str = Field(description="Profile name; the file's stem.")
    description: str = Field(default="", description="What this profile is for.")
    model: ModelSettings = Field(default_factory=lambda: ModelSettings(), description="Model settings.")
    ports: PortSettings = Field(default_factory=lambda: PortSettings(), description="Loopback ports.")
    cpu_bind: Literal["round_robin", "auto", "nobind"] = Field(
        default="round_robin",
        description="How the OpenMP threads of replicas in pools without `cpus` are pinned: round_robin gives "
        "replica k core k mod N (vLLM's 'auto' pins every replica to the same core); 'nobind' leaves it to the "
        "kernel. Only the OpenMP threads are pinned this way, not the replica's other processes: for isolation "
        "give the pools `cpus`.",
    )
    pools: dict[str, PoolSettings] = Field(description="Pool name -> settings (names: lowercase, digits, '-').")
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
    def _pool_names(cls, pools: dict[str, PoolSettings]) -> dict[str, PoolSettings]:
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
        unused = sorted(set(self.pools) - set(self.classes.values()))
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
            for field, other in settings.foreign_knobs():
                raise ValueError(
                    f"pools.{name}.{field}: a {other.title} setting, but this pool's engine is {settings.engine}; "
                    f"drop it, or set engine: {other.kind}"
                )
            problems = settings.serving.check_pool(self, name, settings)
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
) -> list[str]:
    """One line per validation error of `model` (found at `prefix` in the file): file, key path, what is
    wrong, the closest valid key."""
    root = model or StackProfile
    lines = []
    for err in exc.errors():
        loc = tuple(part for part in err["loc"] if part != "[key]")
        path = (*prefix, *loc)
        if err["type"] == "extra_forbidden":
            close = _suggest(str(loc[-1]), _keys_at(root, loc[:-1]))
            lines.append(f"{source}: {_dotted(path)}: unknown key{close}")
        elif err["type"] == "enum" and err["loc"][-1] == "[key]":
            close = _suggest(str(loc[-1]), _keys_at(root, loc[:-1]))
            lines.append(f"{source}: {_dotted(path)}: not a request class{close}")
        else:
            lines.append(f"{source}: {_dotted(path)}: {err['msg']}")
    return lines


def profile_from_mapping(data: Any, *, source: str, name: str) -> StackProfile:
    """Validate parsed YAML; every error names `source`, the key path and, for a typo, the intended key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a profile must be a mapping, found {type(data).__name__}")
    try:
        profile = StackProfile.model_validate({"name": name, **data})
    except ValidationError as exc:
        raise ConfigError(
            "\n  ".join(explain(exc, source)),
            hint="fix the keys named above; every field is described in builders/smoke/profile.py",
        ) from None
    return profile


def profiles_dir(root: Path) -> Path:
    return root / "profiles"


def available_profiles(root: Path) -> list[str]:
    return sorted(p.stem for p in profiles_dir(root).glob("*.yaml"))


def load_profile(name_or_path: str, *, root: Path) -> tuple[StackProfile, Path]:
    """A profile by name (profiles/NAME.yaml under `root`) or by path to a YAML file."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_path:
        path = candidate
    else:
        path = profiles_dir(root) / f"{name_or_path}.yaml"
    if not path.is_file():
        known = available_profiles(root)
        raise UsageError(
            f"no profile {name_or_path!r} (looked for {path}){_suggest(name_or_path, known)}",
            hint=f"known profiles: {', '.join(known) or 'none'}; or pass a path to a YAML file",
        )
    profile = profile_from_mapping(load_yaml(path), source=str(path), name=path.stem)
    return profile, path
