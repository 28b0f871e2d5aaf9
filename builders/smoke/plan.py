"""Profile + run settings -> the exact replicas and router config of one smoke run. Pure: starts nothing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from builders.config.profile import PoolSettings, StackProfile
from builders.engines import ENGINES, ServingEngine, serving_engine
from builders.engines.args import PoolArgv
from builders.errors import PreflightBlocked
from builders.serving_dtype import CpuHost, DtypeChoice, choose_dtype, this_host

# Where the tiny model is mounted inside replica containers.
CONTAINER_MODEL_DIR = "/forge/model"
RUN_LABEL = "forge.smoke"
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, kw_only=True)
class ReplicaPlan:
    """One server of one pool: its port, its arguments (without model and entry point), its env."""

    pool: str
    index: int
    port: int
    args: tuple[str, ...]
    keys: tuple[str, ...]
    env: Mapping[str, str]
    name: str
    cpuset: str | None = None
    """CPUs the whole replica (every process it starts) is confined to; None leaves it to the kernel."""
    engine: str = ENGINES.default.name
    """The serving engine it runs (builders/engines/)."""

    @property
    def serving(self) -> ServingEngine:
        return serving_engine(self.engine)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def label(self) -> str:
        return f"{self.pool}/{self.index}"


@dataclass(frozen=True, kw_only=True)
class RuntimeGroup:
    """Pools that run the same serving engine from the same image (None: the one given for that engine)."""

    engine: str
    image: str | None
    pools: tuple[str, ...]

    @property
    def serving(self) -> ServingEngine:
        return serving_engine(self.engine)


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

    def pool_argvs(self, pools: tuple[str, ...] | None = None) -> list[PoolArgv]:
        """The arguments of each pool's first replica (the others differ only in port and CPUs), of every pool
        or of `pools`."""
        seen: dict[str, PoolArgv] = {}
        for replica in self.replicas:
            if pools is None or replica.pool in pools:
                seen.setdefault(replica.pool, PoolArgv(pool=replica.pool, argv=replica.args, keys=replica.keys))
        return list(seen.values())

    def engines(self) -> list[str]:
        """The serving engines this stack runs, in pool order."""
        return list(dict.fromkeys(r.engine for r in self.replicas))

    def runtime_groups(self) -> list[RuntimeGroup]:
        """The pools grouped by what runs them (serving engine and image), in pool order."""
        groups: dict[tuple[str, str | None], list[str]] = {}
        for name, pool in self.profile.pools.items():
            groups.setdefault((pool.engine, pool.image), []).append(name)
        return [RuntimeGroup(engine=k, image=image, pools=tuple(names)) for (k, image), names in groups.items()]

    def group_of(self, replica: ReplicaPlan) -> RuntimeGroup:
        return next(g for g in self.runtime_groups() if replica.pool in g.pools)

    def router_config(self, *, api_key: str, upstream_api_key: str) -> dict[str, object]:
        """The router's config mapping: the profile's router section plus what this run decides."""
        keep_alive = all(serving_engine(kind).reuses_connections for kind in self.engines())
        return {
            # The profile's router section may still choose; keep-alive is off only where a server needs it.
            **({} if keep_alive else {"upstream_keep_alive": False}),
            **self.profile.router,
            "host": LOOPBACK,
            "port": self.router_port,
            "pools": self.pool_urls(),
            "class_pools": {c.value: pool for c, pool in self.profile.classes.items()},
            "api_key": api_key,
            "upstream_api_key": upstream_api_key,
        }


def pool_args(
    profile: StackProfile,
    name: str,
    pool: PoolSettings,
    port: int,
    dtype: str,
    *,
    host: str = LOOPBACK,
    cpuset: str | None = None,
) -> tuple[list[str], list[str]]:
    """The server arguments of pool `name` (without model and entry point), as its serving engine builds them,
    and for each token the profile key it comes from."""
    command = serving_engine(pool.engine).command(profile, name, pool, port=port, dtype=dtype, host=host, cpuset=cpuset)
    return list(command.args), list(command.keys)


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
            cpuset = pool.cpuset_of(index)
            args, keys = pool_args(profile, name, pool, port, choice.dtype, cpuset=cpuset)
            env = serving_engine(pool.engine).replica_env(profile, pool, cpuset=cpuset, ordinal=ordinal, cpus=cpus)
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
                    engine=pool.engine,
                )
            )
            ordinal += 1
    return StackPlan(run_id=run_id, profile=profile, router_port=base, replicas=tuple(replicas), dtype=choice)


def check_host_runs(profile: StackProfile, source: str, host: CpuHost) -> None:
    """Refuse, before anything starts, a profile whose pools serve an engine this host's CPU cannot run (SGLang's
    CPU kernels without AVX-512 BF16 and AMX): its replicas would start and fail their first request."""
    for name, pool in profile.pools.items():
        serving = serving_engine(pool.engine)
        if (why := serving.host_problem(host)) is not None:
            raise PreflightBlocked(
                f"{source}: pool {name!r} serves {serving.title}, which cannot run on this host: {why}",
                hint=f"run it on a CPU that has them, or serve pool {name!r} with another engine (pools.{name}.engine)",
            )
