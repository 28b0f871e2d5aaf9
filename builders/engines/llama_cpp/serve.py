"""llama.cpp's `llama-server` as a serving engine: one GGUF file, slots instead of a scheduler budget.

Its knobs differ from vLLM's in kind, not only in name: a replica has a fixed number of slots (`-np`), each
with an equal share of the context (`-c` is the total unless the KV cache is unified), and a prompt is
evaluated in logical batches of `-b` tokens split into physical micro-batches of `-ub`. Its help is
llama.cpp's own table (common/arg.cpp, `common_arg::to_string`): an entry starts in column 0 with its
flags, their value hint follows the last one, and the help text starts at column 40.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from builders.config.models import Recipe
from builders.config.profile import PoolSettings, StackProfile
from builders.cpusets import parse_cpuset
from builders.engines.args import ServeArgSpec, ServeOption, local_cache_key, probe_help
from builders.engines.serving import HelpRunner, ModelFormat, PoolArgs, ServeOptions, ServerProbe, ServingEngine
from builders.errors import SmokeFailed

MODEL_FILE = "model.gguf"
SERVER = "llama-server"
# The image puts llama-server on PATH; the help is printed by the binary itself, no model needed.
IMAGE_ENTRY: tuple[str, ...] = (SERVER,)

_ENTRY_HEAD = re.compile(r"^(-[^\s,][^\s]*(?:,\s+-[^\s,]+)*)(?:\s(\S+))?(?:\s(\S+))?")
_FLAG = re.compile(r"--?[A-Za-z0-9][A-Za-z0-9._-]*")
_NOT_POOL_ARGS = frozenset({"-h", "--help", "--usage", "--version", "--completion-bash", "--license"})
_RANGE = re.compile(r"^\d+-\d+$")


class LlamaCppSettings(BaseModel):
    """llama-server's own knobs for one pool; each becomes one flag, checked against the image's help."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    slots: int = Field(
        default=1, ge=1, le=256, description="Requests one replica decodes at once (-np); each gets context/slots."
    )
    context: int | None = Field(
        default=None,
        ge=64,
        description="Total KV context of a replica (-c), shared equally by its slots; default slots × the pool's "
        "max_model_len, so every slot holds a whole request.",
    )
    batch: int | None = Field(default=None, ge=1, description="Logical batch: prompt tokens per decode call (-b).")
    ubatch: int | None = Field(default=None, ge=1, description="Physical micro-batch within a batch (-ub).")
    threads: int | None = Field(
        default=None,
        ge=1,
        description="Generation threads (-t); default one per CPU of the replica's cpus, else 1.",
    )
    threads_batch: int | None = Field(
        default=None, ge=1, description="Prompt-processing threads (-tb); default the same as threads."
    )
    cpu_range: str | None = Field(
        default=None,
        description="CPU range its threads are pinned to (-Cr lo-hi); default the replica's cpus when they are "
        "one contiguous range.",
    )

    @field_validator("cpu_range")
    @classmethod
    def _range(cls, value: str | None) -> str | None:
        if value is not None and not _RANGE.match(value):
            raise ValueError(f"{value!r} is not a range 'lo-hi' like '0-1' (llama-server's --cpu-range)")
        return value


class LlamaCppRecipe(Recipe):
    """A llama.cpp recipe: the keys every recipe has, its engine named."""

    engine: Literal["llama-cpp"] = Field(description="llama.cpp's llama-server")


class LlamaCppPool(PoolSettings):
    """A pool of llama-server replicas: the settings every pool has, and llama-server's own knobs."""

    engine: Literal["llama-cpp"] = Field(description="llama.cpp's llama-server.")
    llama_cpp: LlamaCppSettings | None = Field(
        default=None, description="llama-server's own knobs (engine: llama-cpp only): slots, context, batches, threads."
    )

    @property
    def knobs(self) -> LlamaCppSettings:
        return self.llama_cpp or LlamaCppSettings()

    def problems(self, profile: StackProfile, name: str) -> list[str]:
        knobs = self.knobs
        length = self.max_model_len or profile.model.max_model_len
        problems = []
        if knobs.context is not None and knobs.context // knobs.slots < length:
            problems.append(
                f"pools.{name}.llama_cpp.context: {knobs.context} tokens over {knobs.slots} slot(s) leave "
                f"{knobs.context // knobs.slots} per request, below the pool's max_model_len {length}; raise "
                "context to slots × max_model_len or drop it"
            )
        if knobs.batch is not None and knobs.ubatch is not None and knobs.ubatch > knobs.batch:
            problems.append(
                f"pools.{name}.llama_cpp.ubatch: {knobs.ubatch} exceeds batch {knobs.batch} (a micro-batch is "
                "part of a batch; llama.cpp would cut it to the batch silently)"
            )
        return problems


def parse_server_help(text: str, *, source: str) -> ServeArgSpec:
    """Parse `llama-server --help` into the flags it accepts; lines that are not entries are skipped, so a
    container's combined output (log lines about the CPU backend) can be passed as is."""
    options: dict[str, ServeOption] = {}
    for line in text.splitlines():
        # The first flag is padded after its comma ("-t,    --threads N"); the help starts after 2+ spaces.
        head = re.split(r"\s{2,}", re.sub(r"^(-\S+,)\s+", r"\1 ", line.rstrip()), maxsplit=1)[0]
        if not head.startswith("-"):
            continue
        parts = re.split(r",\s+(?=-)", head)
        flags: list[str] = []
        hint: str | None = None
        for part in parts:
            flag, _, rest = part.partition(" ")
            if not _FLAG.fullmatch(flag):
                flags = []
                break
            flags.append(flag)
            if rest.strip():
                hint = rest.strip()
        if not flags:
            continue
        choices = None
        if hint is not None:
            closed = re.fullmatch(r"[<\[{]([^<>\[\]{}]*)[>\]}]", hint.split(" ")[0])
            if closed and "|" in closed.group(1):
                choices = tuple(closed.group(1).split("|"))
        option = ServeOption(flags=tuple(flags), takes_value=hint is not None, choices=choices)
        for flag in flags:
            options.setdefault(flag, option)
    for flag in _NOT_POOL_ARGS:
        options.pop(flag, None)
    if len(options) < 20 or "--parallel" not in options:
        raise SmokeFailed(
            f"{source}: found only {len(options)} options in the `llama-server --help` output; "
            "this is not the help of llama.cpp's server",
            hint="check that the image has llama-server on PATH and that `llama-server --help` runs in it",
        )
    return ServeArgSpec(options=options, source=source, server=SERVER)


class LlamaCppServer(ServingEngine):
    """How a pool serves llama.cpp: the serving half of its engine (builders/engines/llama_cpp/__init__.py)."""

    name: ClassVar[str] = "llama-cpp"
    title: ClassVar[str] = "llama.cpp"
    recipe_model: ClassVar[type[Recipe]] = LlamaCppRecipe
    model_format: ClassVar[ModelFormat] = "gguf"
    pool_model: ClassVar[type[PoolSettings] | None] = LlamaCppPool
    busy_metric: ClassVar[str] = "llamacpp:requests_processing"
    reuses_connections: ClassVar[bool] = False
    deployable: ClassVar[bool] = False
    serve_options: ClassVar[ServeOptions] = ServeOptions(
        image="--llama-image",
        image_help="image with llama-server for the profile's llama-cpp pools (e.g. forge/debian-14-llama-cpp:latest)",
        local="--local-llama-server",
        local_help="run llama-cpp pools as host processes of this `llama-server` binary instead",
        local_hint="pass a llama-server binary built from llama.cpp (build/bin/llama-server)",
    )

    @staticmethod
    def settings(pool: PoolSettings) -> LlamaCppSettings:
        assert isinstance(pool, LlamaCppPool), "a llama.cpp pool is loaded by LlamaCppPool"
        return pool.knobs

    def context(self, profile: StackProfile, pool: PoolSettings) -> int:
        knobs = self.settings(pool)
        return knobs.context or knobs.slots * (pool.max_model_len or profile.model.max_model_len)

    def pool_args(
        self, args: PoolArgs, profile: StackProfile, name: str, pool: PoolSettings, *, dtype: str, cpuset: str | None
    ) -> None:
        knobs = self.settings(pool)
        prefix = f"pools.{name}.llama_cpp"
        # Prometheus gauges for the kill check and the sweep; the web UI is not needed behind a router.
        args.add("(run)", "--metrics", "--no-webui")
        args.add("model.served_model_name", "--alias", profile.model.served_model_name)
        args.add("model.seed", "--seed", str(profile.model.seed))
        args.add(f"{prefix}.slots", "--parallel", str(knobs.slots))
        context_key = f"{prefix}.context" if knobs.context else f"pools.{name}.max_model_len"
        args.add(context_key, "--ctx-size", str(self.context(profile, pool)))
        if knobs.batch is not None:
            args.add(f"{prefix}.batch", "--batch-size", str(knobs.batch))
        if knobs.ubatch is not None:
            args.add(f"{prefix}.ubatch", "--ubatch-size", str(knobs.ubatch))
        cpus = sorted(parse_cpuset(cpuset)) if cpuset is not None else None
        threads = knobs.threads or (len(cpus) if cpus else 1)
        args.add(f"{prefix}.threads" if knobs.threads else f"pools.{name}.cpus", "--threads", str(threads))
        if knobs.threads_batch is not None:
            args.add(f"{prefix}.threads_batch", "--threads-batch", str(knobs.threads_batch))
        cpu_range = knobs.cpu_range
        if cpu_range is None and cpus and cpus == list(range(cpus[0], cpus[-1] + 1)):
            cpu_range = f"{cpus[0]}-{cpus[-1]}"
        if cpu_range is not None:
            args.add(f"{prefix}.cpu_range" if knobs.cpu_range else f"pools.{name}.cpus", "--cpu-range", cpu_range)

    def replica_env(
        self, profile: StackProfile, pool: PoolSettings, *, cpuset: str | None, ordinal: int, cpus: int
    ) -> dict[str, str]:
        # ggml's threads are llama-server's own (-t, -Cr); nothing reads the environment for them.
        return {}

    def api_key_env(self, key: str) -> dict[str, str]:
        # common/arg.cpp: --api-key has set_env("LLAMA_API_KEY"); an env keeps the key out of `ps` output.
        return {"LLAMA_API_KEY": key}

    def help_entries(self, local: Path | None) -> tuple[tuple[str, ...], ...]:
        return (IMAGE_ENTRY,) if local is None else ((str(local),),)

    def probe(
        self, run: HelpRunner, *, entries: Sequence[Sequence[str]], source: str, cache_key: str | None
    ) -> ServerProbe:
        found = probe_help(
            run,
            entries=entries,
            cache_name=f"llama-{cache_key}" if cache_key else None,
            parse=lambda output, entry: parse_server_help(output, source=f"`{' '.join(entry)} --help` in {source}"),
            shown=" ".join,
            none_runs=f"no llama-server runs in {source}",
            hint="use an image built by `forge build DISTRO llama-cpp` (llama-server on PATH), or pass the binary",
        )
        return ServerProbe(spec=found.spec, entry=found.entry)

    def local_cache_key(self, binary: Path) -> str:
        return local_cache_key(binary, package=None)

    def model_argument(self, model_dir: str) -> str:
        return f"{model_dir}/{MODEL_FILE}"

    def write_model(self, model_dir: Path, profile: StackProfile, *, dtype: str) -> None:
        from builders.engines.llama_cpp.gguf_model import write_tiny_gguf

        # The weights are float32 whatever the run's dtype: ggml's CPU backend computes in f32 either way.
        write_tiny_gguf(
            model_dir / MODEL_FILE,
            hidden=profile.model.hidden_size,
            layers=profile.model.num_hidden_layers,
            ctx=profile.model.max_position_embeddings,
            seed=profile.model.seed,
        )
