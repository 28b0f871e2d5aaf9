"""The one interface of a serving engine (vLLM, llama.cpp, SGLang): everything Forge knows about one is a
`ServingEngine` in its package (builders/engines/<name>/), registered once in builders/engines/__init__.py.

It covers the image and the pools. The image: the plan of a distro × recipe (pure), the preflight gates read
from the engine's own source (`preflight(ctx)`, around the disk and RAM gates every build shares), the source
facts a build and a lock need (its torch pin, its version, a tree's parts), and the test stage's checks in the
image just built. The pools: the recipe and pool settings models that hold its own keys, the command-line
options `forge smoke` and `forge sweep` take for it, and how a replica is started (its command line, argument
checks read from its own `--help`, readiness, model format). The core (plan, preflight, build, lock, smoke,
sweep, deploy) asks the recipe's or pool's engine; none of it branches on which engine that is.

"Engine" alone means Docker or Podman in this project (builders/container); this module's subject is the
serving engine a recipe builds and a pool runs.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from builders.config.models import Distro, Recipe, TorchIndex
from builders.config.profile import PoolSettings, StackProfile
from builders.container import Engine
from builders.cpusets import format_cpuset, parse_cpuset
from builders.engines.args import ArgProblem, PoolArgv, ServeArgSpec, check_pools
from builders.engines.checks import CheckResult
from builders.gates.common import check_ram, count_jobs, fetch_source, measure_disk, report_disk
from builders.gates.context import PreflightContext
from builders.gates.findings import Finding
from builders.plan import BuildPlan, PlanOptions
from builders.rebuild.devtree import TreeManifest, TreeSplit
from builders.rebuild.records import ReuseRecord
from builders.serving_dtype import CpuHost
from builders.sources import ResolvedSource
from builders.target import Target

ModelFormat = Literal["hf-dir", "gguf"]
"""What a replica loads: a Hugging Face model directory (config + tokenizer) or one GGUF file."""

HelpRunner = Callable[[list[str]], tuple[int, str]]
"""Runs an argv where the server lives (in its image, or on the host); returns exit code and output."""


@dataclass(frozen=True, kw_only=True)
class ServerProbe:
    """What one installation of a serving engine accepts and how its server is started."""

    spec: ServeArgSpec
    entry: tuple[str, ...]
    model_is_positional: bool = False
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class PoolCommand:
    """A replica's arguments (without entry point and model) with the profile key of each token, and its env."""

    args: tuple[str, ...]
    keys: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


class PoolArgs:
    """A replica's arguments as an engine adds them, each token tagged with the profile key that put it there (an
    argument check names that key)."""

    def __init__(self) -> None:
        self.args: list[str] = []
        self.keys: list[str] = []

    def add(self, key: str, *tokens: str) -> None:
        self.args.extend(tokens)
        self.keys.extend([key] * len(tokens))

    def command(self) -> PoolCommand:
        return PoolCommand(args=tuple(self.args), keys=tuple(self.keys))


# The model directory is all there is; a hub lookup would hang on this network.
OFFLINE_ENV: Mapping[str, str] = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def omp_threads_bind(profile: StackProfile, *, cpuset: str | None, ordinal: int, cpus: int) -> str | None:
    """The CPUs a replica's OpenMP threads bind to, as vLLM's and SGLang's *_CPU_OMP_THREADS_BIND spell them: its
    cpuset, or one CPU by ordinal under the profile's round_robin; None where the profile binds nothing."""
    if cpuset is not None:
        return format_cpuset(parse_cpuset(cpuset))
    if profile.cpu_bind == "round_robin":
        return str(ordinal % max(cpus, 1))
    return None


@dataclass(frozen=True, kw_only=True)
class SourcePins:
    """What an engine's pinned source states: the torch it builds against and its own version (None: not stated,
    or nothing to read)."""

    torch: str | None = None
    version: str | None = None


@dataclass(frozen=True, kw_only=True)
class LockedRequirements:
    """Requirement lines a build installs, as read from the engine's source for `forge.lock`."""

    name: str
    origin: str
    hashed: bool
    lines: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    """The command-line options `forge smoke` and `forge sweep` take for an engine's pools: its image and a host
    binary. Generated from the engine's name (`--<name>-image`, `--local-<name>`) unless it declares its own
    spelling; the registry's default engine takes its image as the commands' positional IMAGE instead."""

    image: str | None = None
    """The option naming its image; None: `--<name>-image`."""
    image_help: str = ""
    local: str | None = None
    """The option naming a host binary to run instead; None: `--local-<name>`."""
    local_help: str = ""
    local_hint: str = ""
    """What to pass as that binary, for the error when it is not one."""


class ServingEngine(abc.ABC):
    """One serving engine. Subclasses are stateless; one instance each is registered in
    builders/engines/__init__.py, and every list of engine names is derived from that registry."""

    name: ClassVar[str]
    """What recipes and profiles call it (`engine: vllm`)."""
    title: ClassVar[str]
    """How messages name it."""
    recipe_model: ClassVar[type[Recipe]] = Recipe
    """The model of its recipes: the common Recipe, or a subclass adding this engine's own keys."""
    runtime_python: ClassVar[bool] = False
    """Whether its runtime image has a Python whose version the report records (llama-server's is one binary)."""

    # --- the image: plan, preflight, sources, test stage -------------------------------------------------

    @abc.abstractmethod
    def plan(self, distro: Distro, recipe: Recipe, options: PlanOptions) -> BuildPlan:
        """distro + recipe + options → BuildPlan, pure: no engine, no network, no filesystem writes."""

    def preflight(self, ctx: PreflightContext) -> None:
        """Every gate a build of `ctx.recipe` would hit, into `ctx.findings`, each phase `phase(ctx)`. This default
        suits an engine compiled from its pinned archive: its own gates (`gates`) read the archive (fetched when
        missing), then the disk and RAM gates every build shares."""
        fetch_source(ctx)
        measure_disk(ctx)
        count_jobs(ctx)
        ctx.findings += self.gates(ctx)
        report_disk(ctx)
        check_ram(ctx)

    def gates(self, ctx: PreflightContext) -> list[Finding]:
        """This engine's own gates, read from its own build files and cited by file and line (the default
        `preflight` runs them)."""
        return []

    @abc.abstractmethod
    def checks(self, engine: Engine, image: str, plan: BuildPlan) -> list[CheckResult]:
        """The test stage: run the image just built and judge it, before it is tagged."""

    def versions(self, checks: Sequence[CheckResult]) -> dict[str, str]:
        """Versions the test stage read in the image (the report's `versions`)."""
        return {}

    def compiles(self, target: Target) -> bool:
        """Whether building `target` compiles C, C++ or CUDA here: what a shared compiler cache can serve. By
        default a source recipe not installed from a wheel (vLLM's source builds)."""
        return target.compiles

    def stages_source(self, target: Target) -> bool:
        """Whether a build stages the recipe's pinned source (resolved from the cache or --source)."""
        return target.recipe.source is not None

    def checkouts(self, target: Target, given: Mapping[str, Path]) -> list[ResolvedSource]:
        """The checkouts a build needs beside the pinned source, taken from `given` (--source NAME=PATH): none
        for most engines. Raises SourceUnavailable naming what to check out, at which commit, where one is missing."""
        return []

    def source_pins(self, target: Target, source: Path) -> SourcePins:
        """What the pinned source says this build installs and is (read without running anything)."""
        return SourcePins()

    def split_tree(self, source: Path) -> TreeSplit | None:
        """A source tree given with --source split into the parts a rebuild reuses; None: built whole."""
        return None

    def stage_tree(self, tree: TreeSplit, context_dir: Path) -> None:
        """Put a split tree's parts where the plan's context items name them (an engine whose `split_tree` splits
        one must say where)."""
        raise NotImplementedError(f"{self.title} splits no source tree")

    def reuse(
        self,
        tree: TreeSplit,
        *,
        log: str,
        plan: BuildPlan,
        base_image_id: str,
        cache_mounted: bool,
        previous: TreeManifest | None,
    ) -> ReuseRecord:
        """The report's `reuse` section of a tree build: what each layer reused, read from the build's log."""
        return ReuseRecord()

    def locked_requirements(
        self,
        containers_dir: Path,
        target: Target,
        source: Path,
        *,
        torch_version: str | None,
        torch_index: TorchIndex | None,
    ) -> list[LockedRequirements]:
        """What a build installs from an index, as its pinned source states it (forge.lock); none for an engine
        whose archive is all it builds from."""
        return []

    # --- the pools: settings, options, a replica's command line ----------------------------------------------

    pool_model: ClassVar[type[PoolSettings] | None] = None
    """The model of a pool running it (the common PoolSettings plus its own knobs); None: no pool runs it."""
    serve_options: ClassVar[ServeOptions] = ServeOptions()
    model_format: ClassVar[ModelFormat] = "hf-dir"
    busy_metric: ClassVar[str] = ""
    """The Prometheus gauge that is above 0 while the replica generates (the kill check waits for it)."""
    reuses_connections: ClassVar[bool] = False
    """Whether the router may send it a request on a connection a previous answer used (router
    upstream_keep_alive)."""
    deployable: ClassVar[bool] = False
    """Whether `forge deploy` renders Kubernetes manifests for its pools."""

    @property
    def serves(self) -> bool:
        return self.pool_model is not None

    @property
    def image_option(self) -> str:
        """The option naming its image (`forge smoke`, `forge sweep`)."""
        return self.serve_options.image or f"--{self.name}-image"

    @property
    def local_option(self) -> str:
        """The option naming its host binary instead."""
        return self.serve_options.local or f"--local-{self.name}"

    @property
    def local_hint(self) -> str:
        return self.serve_options.local_hint or f"pass an executable {self.title} server"

    def _not_served(self) -> NotImplementedError:
        return NotImplementedError(f"{self.title} has no pools: Forge does not serve it")

    def command(
        self,
        profile: StackProfile,
        name: str,
        pool: PoolSettings,
        *,
        port: int,
        dtype: str,
        host: str,
        cpuset: str | None = None,
    ) -> PoolCommand:
        """The arguments of pool `name`'s replica on `port` (confined to `cpuset`), each token tagged with its
        profile key: where to listen, the engine's own (`pool_args`), then the pool's extra_args, the same for
        every engine."""
        if not self.serves:
            raise self._not_served()
        args = PoolArgs()
        args.add("(run)", "--host", host, "--port", str(port))
        self.pool_args(args, profile, name, pool, dtype=dtype, cpuset=cpuset)
        for i, token in enumerate(pool.extra_args):
            args.add(f"pools.{name}.extra_args[{i}]", token)
        return args.command()

    def pool_args(
        self, args: PoolArgs, profile: StackProfile, name: str, pool: PoolSettings, *, dtype: str, cpuset: str | None
    ) -> None:
        """Add the engine's own arguments of pool `name`'s replica to `args` (`command` puts them between where it
        listens and the pool's extra_args)."""
        raise self._not_served()

    def replica_env(
        self, profile: StackProfile, pool: PoolSettings, *, cpuset: str | None, ordinal: int, cpus: int
    ) -> dict[str, str]:
        """Environment of one replica (CPU binding and offline switches), before the pool's own `env`."""
        raise self._not_served()

    def api_key_env(self, key: str) -> dict[str, str]:
        """The environment that makes a replica require `key` as its Bearer token."""
        raise self._not_served()

    def help_entries(self, local: Path | None) -> tuple[tuple[str, ...], ...]:
        """Server entry points to try, in order: in an image (`local` None) or from a host binary."""
        raise self._not_served()

    def probe(
        self, run: HelpRunner, *, entries: Sequence[Sequence[str]], source: str, cache_key: str | None
    ) -> ServerProbe:
        """Read what the installation accepts from its own help output (cached under `cache_key`)."""
        raise self._not_served()

    def check(self, pools: Iterable[PoolArgv], probe: ServerProbe) -> list[ArgProblem]:
        """Every argument of `pools` this installation would reject: by default, the checks every engine's flags go
        through (builders/engines/args.py) against what its help listed."""
        return check_pools(pools, probe.spec)

    def local_cache_key(self, binary: Path) -> str:
        """Key under which the probe of a host installation is cached (changes when the binary does)."""
        raise self._not_served()

    def model_argument(self, model_dir: str) -> str:
        """The path the server is given, inside the directory `write_model` filled."""
        raise self._not_served()

    def write_model(self, model_dir: Path, profile: StackProfile, *, dtype: str) -> None:
        """Write the tiny random model this engine loads into `model_dir`."""
        raise self._not_served()

    def argv(self, probe: ServerProbe, model_dir: str, args: Sequence[str]) -> list[str]:
        """The full server command: entry point, model, then the pool's arguments."""
        model = self.model_argument(model_dir)
        return [*probe.entry, *([model] if probe.model_is_positional else ["--model", model]), *args]

    def host_problem(self, host: CpuHost) -> str | None:
        """Why this engine's server cannot run on `host`'s CPU, said before any replica starts; None where it can
        (the default: a server Forge builds for the host's architecture runs on any CPU of it)."""
        return None

    def cache_env(self, path: str) -> dict[str, str]:
        """The environment that points this engine's start-up caches at `path`, a directory every replica of one
        sweep shares. Empty for an engine that keeps nothing worth sharing between starts."""
        return {}

    def cache_seed(self, path: str) -> list[str] | None:
        """A command run once in the image, before its first replica, that copies what the image already holds
        of these caches into `path`: pointed at an empty shared directory, replicas would not see what the
        image's build warmed. None where there is nothing to copy."""
        return None

    def startup_parts(self, log: str, *, healthy_after_s: float | None) -> dict[str, float | None]:
        """Where a replica's start-up went, read from its log (seconds; None where the log does not say).
        Empty for an engine whose log carries no stamps or durations to read."""
        return {}

    def busy(self, metrics_text: str) -> bool:
        """Whether a /metrics page shows a request being generated."""
        for line in metrics_text.splitlines():
            if self.busy_metric and line.startswith(self.busy_metric):
                try:
                    if float(line.rsplit(" ", 1)[1]) > 0:
                        return True
                except (IndexError, ValueError):
                    continue
        return False
