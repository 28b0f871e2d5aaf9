"""What Forge needs to know about a serving engine (the program a replica runs: vLLM, llama.cpp's server).

"Engine" alone means Docker or Podman in this project (builders/container); this module's subject is the
*server kind* a pool runs. Each kind is a `ServingEngine` in its package's serve.py (builders/engines/<name>/):
how its command line is built from a profile, which model format it loads, how its flags are read from its own
`--help` inside the image, how its replicas learn their API key and show that they are busy. Smoke, sweep and
deploy ask the pool's `ServingEngine`; none of them branches on the kind.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from builders.engines.args import ArgProblem, PoolArgv, ServeArgSpec

if TYPE_CHECKING:
    from builders.smoke.profile import PoolSettings, StackProfile

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


class ServingEngine(abc.ABC):
    """One kind of server behind the router. Subclasses are stateless; one instance per kind is registered in
    builders/engines/__init__.py."""

    kind: ClassVar[str]
    """The profile's spelling (`engine: vllm`)."""
    title: ClassVar[str]
    """How messages name it."""
    model_format: ClassVar[ModelFormat]
    knobs: ClassVar[frozenset[str]]
    """PoolSettings fields only this kind reads; a pool of another kind that sets one is refused."""
    busy_metric: ClassVar[str]
    """The Prometheus gauge that is above 0 while the replica generates (the kill check waits for it)."""
    reuses_connections: ClassVar[bool]
    """Whether the router may send it a request on a connection a previous answer used (router
    upstream_keep_alive)."""
    deployable: ClassVar[bool]
    """Whether `forge deploy` renders Kubernetes manifests for its pools."""
    image_option: ClassVar[str]
    """The command-line option that names its image (`forge smoke`, `forge sweep`)."""
    local_option: ClassVar[str]
    """The command-line option that names its host binary instead."""
    local_hint: ClassVar[str]
    """What to pass as that binary."""

    @abc.abstractmethod
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
        profile key."""

    def check_pool(self, profile: StackProfile, name: str, pool: PoolSettings) -> list[str]:
        """What is inconsistent in this kind's settings of pool `name`, one message per problem, each naming
        its key; checked when the profile loads."""
        return []

    @abc.abstractmethod
    def replica_env(
        self, profile: StackProfile, pool: PoolSettings, *, cpuset: str | None, ordinal: int, cpus: int
    ) -> dict[str, str]:
        """Environment of one replica (CPU binding and offline switches), before the pool's own `env`."""

    @abc.abstractmethod
    def api_key_env(self, key: str) -> dict[str, str]:
        """The environment that makes a replica require `key` as its Bearer token."""

    @abc.abstractmethod
    def help_entries(self, local: Path | None) -> tuple[tuple[str, ...], ...]:
        """Server entry points to try, in order: in an image (`local` None) or from a host binary."""

    @abc.abstractmethod
    def probe(
        self, run: HelpRunner, *, entries: Sequence[Sequence[str]], source: str, cache_key: str | None
    ) -> ServerProbe:
        """Read what the installation accepts from its own help output (cached under `cache_key`)."""

    @abc.abstractmethod
    def check(self, pools: Iterable[PoolArgv], probe: ServerProbe) -> list[ArgProblem]:
        """Every argument of `pools` this installation would reject."""

    @abc.abstractmethod
    def local_cache_key(self, binary: Path) -> str:
        """Key under which the probe of a host installation is cached (changes when the binary does)."""

    @abc.abstractmethod
    def model_argument(self, model_dir: str) -> str:
        """The path the server is given, inside the directory `write_model` filled."""

    @abc.abstractmethod
    def write_model(self, model_dir: Path, profile: StackProfile, *, dtype: str) -> None:
        """Write the tiny random model this kind loads into `model_dir`."""

    def argv(self, probe: ServerProbe, model_dir: str, args: Sequence[str]) -> list[str]:
        """The full server command: entry point, model, then the pool's arguments."""
        model = self.model_argument(model_dir)
        return [*probe.entry, *([model] if probe.model_is_positional else ["--model", model]), *args]

    def cache_env(self, path: str) -> dict[str, str]:
        """The environment that points this kind's start-up caches at `path`, a directory every replica of one
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
            if line.startswith(self.busy_metric):
                try:
                    if float(line.rsplit(" ", 1)[1]) > 0:
                        return True
                except (IndexError, ValueError):
                    continue
        return False
