"""Profile + run settings -> the exact replicas and router config of one smoke run. Pure: starts nothing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from builders.serving_dtype import DtypeChoice, choose_dtype, this_host
from builders.smoke.profile import PoolSettings, StackProfile, format_cpuset, parse_cpuset
from builders.smoke.vllm_args import PoolArgv

# Where the tiny model is mounted inside replica containers.
CONTAINER_MODEL_DIR = "/forge/model"
RUN_LABEL = "forge.smoke"
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, kw_only=True)
class ReplicaPlan:
    """One vLLM server of one pool: its port, its arguments (without model and entry point), its env."""

    pool: str
    index: int
    port: int
    args: tuple[str, ...]
    keys: tuple[str, ...]
    env: Mapping[str, str]
    name: str
    cpuset: str | None = None
    """CPUs the whole replica (every process it starts) is confined to; None leaves it to the kernel."""

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def label(self) -> str:
        return f"{self.pool}/{self.index}"


@dataclass(frozen=True, kw_only=True)
class StackPlan:
    run_id: str
    profile: StackProfile
    router_port: int
    replicas: tuple[ReplicaPlan, ...]
    dtype: DtypeChoice
    """The dtype every replica serves in, and why (the host's CPU or the profile)."""

    @property
    def router_url(self) -> str:
        return f"http://{LOOPBACK}:{self.router_port}"

    def pool_urls(self) -> dict[str, list[str]]:
        urls: dict[str, list[str]] = {name: [] for name in self.profile.pools}
        for replica in self.replicas:
            urls[replica.pool].append(replica.url)
        return urls

    def pool_argvs(self) -> list[PoolArgv]:
        """The arguments of each pool's first replica (the others differ only in port)."""
        seen: dict[str, PoolArgv] = {}
        for replica in self.replicas:
            seen.setdefault(replica.pool, PoolArgv(pool=replica.pool, argv=replica.args, keys=replica.keys))
        return list(seen.values())

    def router_config(self, *, api_key: str, upstream_api_key: str) -> dict[str, Any]:
        """The router's config mapping: the profile's router section plus what this run decides."""
        return {
            **self.profile.router,
            "host": LOOPBACK,
            "port": self.router_port,
            "pools": self.pool_urls(),
            "class_pools": {c.value: pool for c, pool in self.profile.classes.items()},
            "api_key": api_key,
            "upstream_api_key": upstream_api_key,
        }


def pool_args(
    profile: StackProfile, name: str, pool: PoolSettings, port: int, dtype: str, *, host: str = LOOPBACK
) -> tuple[list[str], list[str]]:
    """The `vllm serve` arguments of pool `name` (without model and entry point) and, for each token, the
    profile key it comes from."""
    model = profile.model
    args: list[str] = []
    keys: list[str] = []

    def add(key: str, *tokens: str) -> None:
        args.extend(tokens)
        keys.extend([key] * len(tokens))

    add("(run)", "--host", host, "--port", str(port))
    add("(run)", "--load-format", "dummy")
    add("model.served_model_name", "--served-model-name", model.served_model_name)
    add("model.dtype", "--dtype", dtype)
    add("model.seed", "--seed", str(model.seed))
    add("model.kv_cache_memory", "--kv-cache-memory-bytes", model.kv_cache_memory)
    if model.enforce_eager:
        add("model.enforce_eager", "--enforce-eager")
    length_key = f"pools.{name}.max_model_len" if pool.max_model_len else "model.max_model_len"
    add(length_key, "--max-model-len", str(pool.max_model_len or model.max_model_len))
    prefix = f"pools.{name}"
    for field in ("max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold", "stream_interval"):
        value = getattr(pool, field)
        if value is not None:
            add(f"{prefix}.{field}", "--" + field.replace("_", "-"), str(value))
    if pool.enable_prefix_caching is not None:
        flag = "--enable-prefix-caching" if pool.enable_prefix_caching else "--no-enable-prefix-caching"
        add(f"{prefix}.enable_prefix_caching", flag)
    for i, token in enumerate(pool.extra_args):
        add(f"{prefix}.extra_args[{i}]", token)
    return args, keys


def plan_stack(
    profile: StackProfile,
    *,
    run_id: str,
    base_port: int | None = None,
    cpus: int = 1,
    dtype: DtypeChoice | None = None,
) -> StackPlan:
    """Ports, arguments and environment of every replica, in pool order; the router takes the base port.
    `dtype` is the run's choice; without one it is made for this host's CPU."""
    choice = dtype if dtype is not None else choose_dtype(profile.model.dtype, this_host())
    base = base_port if base_port is not None else profile.ports.base
    port = base
    replicas: list[ReplicaPlan] = []
    ordinal = 0
    for name, pool in profile.pools.items():
        for index in range(pool.replicas):
            port += 1
            args, keys = pool_args(profile, name, pool, port, choice.dtype)
            env = {
                # The model directory is all there is; a hub lookup would hang on this network.
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
            }
            cpuset = pool.cpuset_of(index)
            if cpuset is not None:
                # vLLM binds one OpenMP thread to each listed CPU; left to its 'auto' it would pick CPUs by
                # NUMA node and ignore the cpuset, and two pools would share a core again.
                env["VLLM_CPU_OMP_THREADS_BIND"] = format_cpuset(parse_cpuset(cpuset))
            elif profile.cpu_bind == "round_robin":
                env["VLLM_CPU_OMP_THREADS_BIND"] = str(ordinal % max(cpus, 1))
            elif profile.cpu_bind == "nobind":
                env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
            env.update(pool.env)
            replicas.append(
                ReplicaPlan(
                    pool=name,
                    index=index,
                    port=port,
                    args=tuple(args),
                    keys=tuple(keys),
                    env=env,
                    name=f"forge-smoke-{run_id}-{name}-{index}",
                    cpuset=cpuset,
                )
            )
            ordinal += 1
    return StackPlan(run_id=run_id, profile=profile, router_port=base, replicas=tuple(replicas), dtype=choice)
