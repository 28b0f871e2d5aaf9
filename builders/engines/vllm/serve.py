"""How a pool serves vLLM: `vllm serve` on a Hugging Face model directory with dummy weights. The serving half of
vLLM's engine (builders/engines/vllm/__init__.py)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from builders.config.models import Recipe
from builders.config.profile import PoolSettings, StackProfile
from builders.engines import serving
from builders.engines.args import SERVE_ENTRIES, local_cache_key, probe_serve
from builders.engines.serving import HelpRunner, ModelFormat, PoolArgs, ServeOptions, ServerProbe, ServingEngine
from builders.engines.vllm.recipe import VllmRecipe
from builders.engines.vllm.startup import startup_parts

# vLLM scheduler settings a profile names at pool level; `flag` spelling is `--` + the field with dashes.
_SCHEDULER_FIELDS = ("max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold", "stream_interval")


class VllmPool(PoolSettings):
    """A pool of `vllm serve` replicas: the settings every pool has, and vLLM's scheduler knobs."""

    engine: Literal["vllm"] = Field(default="vllm", description="`vllm serve` (the default engine).")
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
    served_model_name: str | None = Field(
        default=None,
        min_length=1,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}$",
        description="The model name this pool serves when it is not model.served_model_name: a second model behind "
        "the same router, in a pool of its own that takes no class (requests reach it by their `model`).",
    )
    task: Literal["generate", "embed"] = Field(
        default="generate",
        description="What the pool serves: generate (chat, completions, responses), or embed: the same tiny model "
        "as an embedding model (vLLM's --runner pooling --convert embed) for /v1/embeddings, /tokenize and /score; "
        "an embed pool serves a model of its own (served_model_name).",
    )

    @property
    def max_sequences(self) -> int | None:
        return self.max_num_seqs

    @property
    def own_model(self) -> str | None:
        return self.served_model_name

    @property
    def embeds(self) -> bool:
        return self.task == "embed"


class VllmServer(ServingEngine):
    name: ClassVar[str] = "vllm"
    title: ClassVar[str] = "vLLM"
    recipe_model: ClassVar[type[Recipe]] = VllmRecipe
    model_format: ClassVar[ModelFormat] = "hf-dir"
    pool_model: ClassVar[type[PoolSettings] | None] = VllmPool
    busy_metric: ClassVar[str] = "vllm:num_requests_running"
    reuses_connections: ClassVar[bool] = True
    deployable: ClassVar[bool] = True
    serve_options: ClassVar[ServeOptions] = ServeOptions(
        image="IMAGE",
        image_help="image with vLLM",
        local="--local-vllm",
        local_help="run replicas as host processes of this `vllm` executable instead of containers of IMAGE",
        local_hint="pass the `vllm` script of a virtualenv with vLLM installed, e.g. VENV/bin/vllm",
    )

    def startup_parts(self, log: str, *, healthy_after_s: float | None) -> dict[str, float | None]:
        return startup_parts(log, healthy_after_s=healthy_after_s)

    def pool_args(
        self, args: PoolArgs, profile: StackProfile, name: str, pool: PoolSettings, *, dtype: str, cpuset: str | None
    ) -> None:
        assert isinstance(pool, VllmPool), "a vLLM pool is loaded by VllmPool"
        model = profile.model
        args.add("(run)", "--load-format", "dummy")
        if pool.served_model_name:
            args.add(f"pools.{name}.served_model_name", "--served-model-name", pool.served_model_name)
        else:
            args.add("model.served_model_name", "--served-model-name", model.served_model_name)
        if pool.task == "embed":
            # The generated Llama is a decoder: vLLM's pooling runner serves it as an embedding model.
            args.add(f"pools.{name}.task", "--runner", "pooling", "--convert", "embed")
        args.add("model.dtype", "--dtype", dtype)
        args.add("model.seed", "--seed", str(model.seed))
        args.add("model.kv_cache_memory", "--kv-cache-memory-bytes", model.kv_cache_memory)
        if model.enforce_eager:
            args.add("model.enforce_eager", "--enforce-eager")
        length_key = f"pools.{name}.max_model_len" if pool.max_model_len else "model.max_model_len"
        args.add(length_key, "--max-model-len", str(pool.max_model_len or model.max_model_len))
        prefix = f"pools.{name}"
        for field in _SCHEDULER_FIELDS:
            value = getattr(pool, field)
            if value is not None:
                args.add(f"{prefix}.{field}", "--" + field.replace("_", "-"), str(value))
        if pool.enable_prefix_caching is not None:
            flag = "--enable-prefix-caching" if pool.enable_prefix_caching else "--no-enable-prefix-caching"
            args.add(f"{prefix}.enable_prefix_caching", flag)

    def replica_env(
        self, profile: StackProfile, pool: PoolSettings, *, cpuset: str | None, ordinal: int, cpus: int
    ) -> dict[str, str]:
        # profile.py imports this module (a pool's knobs are validated per kind), so not at the top.

        env = {**serving.OFFLINE_ENV, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        # vLLM binds one OpenMP thread to each listed CPU; left to its 'auto' it would pick CPUs by NUMA node and
        # ignore the cpuset, and two pools would share a core again.
        bind = serving.omp_threads_bind(profile, cpuset=cpuset, ordinal=ordinal, cpus=cpus)
        if bind is None and profile.cpu_bind == "nobind":
            bind = "nobind"
        if bind is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = bind
        return env

    def api_key_env(self, key: str) -> dict[str, str]:
        return {"VLLM_API_KEY": key}

    def cache_env(self, path: str) -> dict[str, str]:
        # vLLM keeps what it learnt of a model class (modelinfos/: the registry inspects it in a subprocess that
        # imports torch and the model code, about 20 s on one core) and torch.compile's artefacts under its cache
        # root; a throwaway container's home loses them at every start.
        return {"VLLM_CACHE_ROOT": path}

    def cache_seed(self, path: str) -> list[str] | None:
        # The runtime stage records the model classes' registry entries in the image user's own vLLM cache
        # (containers/scripts/warm_model_info.py); VLLM_CACHE_ROOT=path would hide them and the first replica
        # would inspect the class in a subprocess again (23 s on one core of an AVX2 EPYC).
        script = (
            'src="${VLLM_CACHE_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm}"; '
            'if [ -d "$src" ]; then cp -a "$src/." "$1/"; fi'
        )
        return ["sh", "-c", script, "sh", path]

    def help_entries(self, local: Path | None) -> tuple[tuple[str, ...], ...]:
        if local is None:
            return SERVE_ENTRIES
        python = local.parent / "python"
        return (
            (str(local), "serve"),
            (str(python) if python.exists() else sys.executable, *SERVE_ENTRIES[1][1:]),
        )

    def probe(
        self, run: HelpRunner, *, entries: Sequence[Sequence[str]], source: str, cache_key: str | None
    ) -> ServerProbe:
        found = probe_serve(run, entries=entries, source=source, cache_key=cache_key)
        return ServerProbe(
            spec=found.spec, entry=found.entry, model_is_positional=found.model_is_positional, notes=found.notes
        )

    def local_cache_key(self, binary: Path) -> str:
        return local_cache_key(binary, package="vllm")

    def model_argument(self, model_dir: str) -> str:
        return model_dir

    def write_model(self, model_dir: Path, profile: StackProfile, *, dtype: str) -> None:
        # Imported here: the tokenizer library loads only when a pool needs its model.
        from builders.engines.tiny_model import write_profile_model

        write_profile_model(model_dir, profile, dtype=dtype)
