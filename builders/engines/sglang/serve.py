"""SGLang's CPU server as a serving engine: `python3 -m sglang.launch_server` on a Hugging Face model directory with
dummy weights, the same tiny random Llama vLLM serves.

Its workload controls, against the seed's (vLLM's) names:

| vLLM (pool level)              | SGLang (`sglang:` in a pool)  | what it bounds                                                  |
| ------------------------------ | ----------------------------- | --------------------------------------------------------------- |
| long_prefill_token_threshold   | chunked_prefill_size          | prompt tokens one request's prefill takes per step (-1: none)   |
| max_num_seqs                   | max_running_requests          | requests one replica decodes at once                            |
| max_num_batched_tokens         | max_prefill_tokens            | prompt tokens of one prefill batch (decodes run in their own    |
|                                |                               | batches unless enable_mixed_chunk, so it bounds prefill only)   |
| model.kv_cache_memory          | max_total_tokens              | tokens the KV pool holds (default: kv_cache_memory's worth)     |

SGLang reads its API key only from `--api-key` (python/sglang/srt/server_args.py, no environment variable). An
argument would show the key in the host's `ps`, so the entry point is a few lines of Python that append it from the
environment inside the interpreter, where /proc/PID/cmdline does not see it, and start the server module as
`python3 -m` would.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from builders.config.models import Recipe
from builders.config.profile import PoolSettings, StackProfile
from builders.engines import serving
from builders.engines.args import (
    ServeArgSpec,
    local_cache_key,
    parse_human_int,
    parse_serve_help,
    probe_help,
)
from builders.engines.serving import HelpRunner, ModelFormat, PoolArgs, ServeOptions, ServerProbe, ServingEngine
from builders.engines.sglang import kernel_source
from builders.engines.sglang.gates import AMX_FLAGS
from builders.errors import SmokeFailed
from builders.serving_dtype import CpuHost

KEY_ENV = "FORGE_SGLANG_API_KEY"
SERVER_MODULE = "sglang.launch_server"
# `python3 -c ENTRY ARGS…` runs the server module with ARGS, plus --api-key from KEY_ENV when it is set.
ENTRY = (
    "import os, runpy, sys; "
    f"key = os.environ.pop({KEY_ENV!r}, ''); "
    "sys.argv += ['--api-key', key] if key else []; "
    f"runpy.run_module({SERVER_MODULE!r}, run_name='__main__', alter_sys=True)"
)
HELP_COMMAND = f"python3 -m {SERVER_MODULE} --help"
# Bytes per element of the KV cache by the dtype the run serves (the tiny model's weights and cache share it).
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
_GAUGE = re.compile(r"^sglang:num_running_reqs(?:\{[^}]*\})?\s+(\S+)")


class SGLangSettings(BaseModel):
    """SGLang's own scheduler knobs for one pool; each becomes one flag, checked against the image's help."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chunked_prefill_size: int | None = Field(
        default=None,
        ge=-1,
        description="Prompt tokens one request's prefill takes per scheduler step (--chunked-prefill-size); "
        "-1 turns chunking off. vLLM's long_prefill_token_threshold plays this part.",
    )
    max_running_requests: int | None = Field(
        default=None, ge=1, description="Requests one replica runs at once (--max-running-requests): max_num_seqs."
    )
    max_prefill_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Prompt tokens of one prefill batch (--max-prefill-tokens; SGLang raises it to the context "
        "length if lower): what max_num_batched_tokens bounds, for prefills only.",
    )
    max_total_tokens: int | None = Field(
        default=None,
        ge=64,
        description="Tokens the replica's KV pool holds (--max-total-tokens); default model.kv_cache_memory's "
        "worth at the run's dtype, as vLLM is given. Without it SGLang sizes the pool from the host's memory.",
    )
    stream_interval: int | None = Field(
        default=None, ge=1, description="Tokens per streamed chunk (--stream-interval; 1 = every token)."
    )
    radix_cache: bool | None = Field(
        default=None,
        description="SGLang's prefix cache (on by default; false passes --disable-radix-cache): enable_prefix_caching.",
    )
    mixed_chunk: bool | None = Field(
        default=None,
        description="Run a prefill chunk and decodes in one batch (--enable-mixed-chunk), as vLLM's chunked "
        "prefill does; off by default, so a prefill step holds every decode of the replica up.",
    )


WheelName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.]+-[A-Za-z0-9_.!+]+(-[A-Za-z0-9_.]+){2,3}\.whl$")]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class SGLangRecipe(Recipe):
    """An SGLang recipe: the keys every recipe has, its engine named, and the wheel image's lock."""

    engine: Literal["sglang"] = Field(description="SGLang's server")
    wheel_lock: dict[WheelName, Sha256] = Field(
        default_factory=dict,
        description="kind=wheel: every wheel of the wheelhouse by file name, with its sha256; preflight compares "
        "the wheelhouse with it, and the image checks each file and refuses any other before installing",
    )


class SGLangPool(PoolSettings):
    """A pool of SGLang CPU servers: the settings every pool has, and SGLang's own scheduler knobs."""

    engine: Literal["sglang"] = Field(description="SGLang's CPU server (python3 -m sglang.launch_server).")
    sglang: SGLangSettings | None = Field(
        default=None,
        description="SGLang's own knobs (engine: sglang only): chunked prefill size, running requests, prefill "
        "batch tokens, KV pool tokens (builders/engines/sglang/serve.py names their vLLM counterparts).",
    )

    @property
    def knobs(self) -> SGLangSettings:
        return self.sglang or SGLangSettings()

    def problems(self, profile: StackProfile, name: str) -> list[str]:
        knobs = self.knobs
        length = self.max_model_len or profile.model.max_model_len
        problems = []
        if knobs.max_total_tokens is not None and knobs.max_total_tokens < length:
            problems.append(
                f"pools.{name}.sglang.max_total_tokens: {knobs.max_total_tokens} tokens of KV pool cannot hold one "
                f"request of the pool's max_model_len {length}; raise it or drop it"
            )
        if knobs.mixed_chunk and knobs.chunked_prefill_size == -1:
            problems.append(
                f"pools.{name}.sglang.mixed_chunk: mixes a prefill chunk into decode batches, and "
                "chunked_prefill_size -1 turns chunks off; drop one of them"
            )
        return problems

    @property
    def max_sequences(self) -> int | None:
        return self.knobs.max_running_requests


def parse_help(text: str, *, source: str) -> ServeArgSpec:
    """SGLang's `--help` (argparse's own layout) as the flags it accepts."""
    spec = parse_serve_help(text, source=source, server="SGLang", command=HELP_COMMAND)
    if "--model-path" not in spec.options or "--chunked-prefill-size" not in spec.options:
        raise SmokeFailed(
            f"{source}: the help has no --model-path or --chunked-prefill-size; this is not SGLang's server",
            hint=f"check that `{HELP_COMMAND}` runs in the image",
        )
    return spec


def kv_tokens(kv_cache_memory: str, *, layers: int, hidden: int, dtype: str) -> int:
    """Tokens a KV cache of `kv_cache_memory` bytes holds for the tiny Llama (keys and values, every layer,
    as many KV heads as query heads), so SGLang's pool holds what vLLM's --kv-cache-memory-bytes does."""
    size = parse_human_int(kv_cache_memory)
    if size is None:
        raise SmokeFailed(f"model.kv_cache_memory {kv_cache_memory!r} is not a size like 2G")
    return max(64, size // (2 * layers * hidden * _DTYPE_BYTES.get(dtype, 4)))


class SGLangServer(ServingEngine):
    """How a pool serves SGLang: the serving half of its engine (builders/engines/sglang/__init__.py)."""

    name: ClassVar[str] = "sglang"
    title: ClassVar[str] = "SGLang"
    recipe_model: ClassVar[type[Recipe]] = SGLangRecipe
    model_format: ClassVar[ModelFormat] = "hf-dir"
    pool_model: ClassVar[type[PoolSettings] | None] = SGLangPool
    busy_metric: ClassVar[str] = "sglang:num_running_reqs"
    reuses_connections: ClassVar[bool] = True
    deployable: ClassVar[bool] = False
    # The generated spellings (--sglang-image, --local-sglang); the binary is a python, not a server.
    serve_options: ClassVar[ServeOptions] = ServeOptions(
        image_help="image with SGLang's CPU server for the profile's sglang pools (e.g. forge/debian-13-sglang:latest)",
        local_help="run sglang pools as host processes of this python (a virtualenv with SGLang) instead",
        local_hint="pass the python of a virtualenv with SGLang and sgl-kernel's CPU build, VENV/bin/python",
    )

    def host_problem(self, host: CpuHost) -> str | None:
        # The preflight gates' flags (gates.py): sgl-kernel is compiled with -march=native and its GEMMs have no
        # scalar path, and the intel_amx backend needs AMX tiles; without them the server starts, then its first
        # request stops with "not implemented".
        needed = (*kernel_source.flags_for(kernel_source.PINNED_ISA_MACROS), *AMX_FLAGS)
        missing = [flag for flag in needed if flag not in host.flags]
        if not missing:
            return None
        return (
            f"{host.source} ({host.model or host.arch}) lacks {', '.join(missing)}; SGLang's CPU kernels need "
            f"{', '.join(needed)} (AVX-512 BF16 and AMX: Intel Xeon 4th generation or newer)"
        )

    @staticmethod
    def settings(pool: PoolSettings) -> SGLangSettings:
        assert isinstance(pool, SGLangPool), "an SGLang pool is loaded by SGLangPool"
        return pool.knobs

    def pool_args(
        self, args: PoolArgs, profile: StackProfile, name: str, pool: PoolSettings, *, dtype: str, cpuset: str | None
    ) -> None:
        model = profile.model
        knobs = self.settings(pool)
        prefix = f"pools.{name}.sglang"
        args.add("(run)", "--device", "cpu")
        # Prometheus gauges for the kill check and the sweep; Forge warms the replicas up itself.
        args.add("(run)", "--load-format", "dummy", "--enable-metrics", "--skip-server-warmup")
        args.add("model.served_model_name", "--served-model-name", model.served_model_name)
        args.add("model.dtype", "--dtype", dtype)
        args.add("model.seed", "--random-seed", str(model.seed))
        length_key = f"pools.{name}.max_model_len" if pool.max_model_len else "model.max_model_len"
        args.add(length_key, "--context-length", str(pool.max_model_len or model.max_model_len))
        total = knobs.max_total_tokens or kv_tokens(
            model.kv_cache_memory, layers=model.num_hidden_layers, hidden=model.hidden_size, dtype=dtype
        )
        total_key = f"{prefix}.max_total_tokens" if knobs.max_total_tokens else "model.kv_cache_memory"
        args.add(total_key, "--max-total-tokens", str(total))
        for field, flag in (
            ("chunked_prefill_size", "--chunked-prefill-size"),
            ("max_running_requests", "--max-running-requests"),
            ("max_prefill_tokens", "--max-prefill-tokens"),
            ("stream_interval", "--stream-interval"),
        ):
            value = getattr(knobs, field)
            if value is not None:
                args.add(f"{prefix}.{field}", flag, str(value))
        if knobs.radix_cache is False:
            args.add(f"{prefix}.radix_cache", "--disable-radix-cache")
        if knobs.mixed_chunk:
            args.add(f"{prefix}.mixed_chunk", "--enable-mixed-chunk")

    def replica_env(
        self, profile: StackProfile, pool: PoolSettings, *, cpuset: str | None, ordinal: int, cpus: int
    ) -> dict[str, str]:
        env = {
            **serving.OFFLINE_ENV,
            "SGLANG_USE_CPU_ENGINE": "1",
            # SGLang's /health otherwise generates a token and sleeps a second before it looks for the answer
            # (entrypoints/http_server.py, health_generate): never inside the router's 1 s health timeout, so
            # every replica was marked unhealthy. Without it /health says whether the server is up.
            "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0",
        }
        # SGLang binds its OpenMP threads to every CPU of a NUMA node unless told which (model_runner.py,
        # init_threads_binding): in a container confined to one CPU that binding would name CPUs it may not use.
        bind = serving.omp_threads_bind(profile, cpuset=cpuset, ordinal=ordinal, cpus=cpus)
        if bind is not None:
            env["SGLANG_CPU_OMP_THREADS_BIND"] = bind
        return env

    def api_key_env(self, key: str) -> dict[str, str]:
        return {KEY_ENV: key}

    def help_entries(self, local: Path | None) -> tuple[tuple[str, ...], ...]:
        return (("python3" if local is None else str(local), "-c", ENTRY),)

    def probe(
        self, run: HelpRunner, *, entries: Sequence[Sequence[str]], source: str, cache_key: str | None
    ) -> ServerProbe:
        found = probe_help(
            run,
            entries=entries,
            cache_name=f"sglang-{cache_key}" if cache_key else None,
            parse=lambda output, entry: parse_help(output, source=f"`{HELP_COMMAND}` in {source}"),
            shown=lambda entry: f"{entry[0]} -m {SERVER_MODULE}",
            none_runs=f"no SGLang server runs in {source}",
            hint="use an image built by `forge build DISTRO sglang --source sgl-kernel=PATH`, or pass its python",
        )
        return ServerProbe(spec=found.spec, entry=found.entry)

    def local_cache_key(self, binary: Path) -> str:
        return local_cache_key(binary, package="sglang")

    def model_argument(self, model_dir: str) -> str:
        return model_dir

    def write_model(self, model_dir: Path, profile: StackProfile, *, dtype: str) -> None:
        # Imported here: the tokenizer library loads only when a pool needs its model.
        from builders.engines.tiny_model import write_profile_model

        write_profile_model(model_dir, profile, dtype=dtype)

    def busy(self, metrics_text: str) -> bool:
        # The exact gauge: sglang:num_running_reqs_offline_batch shares its prefix.
        for line in metrics_text.splitlines():
            match = _GAUGE.match(line)
            if match:
                try:
                    if float(match.group(1)) > 0:
                        return True
                except ValueError:
                    continue
        return False
