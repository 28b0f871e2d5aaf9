"""A toy serving engine, added from this test package through the registry alone (`ENGINES.added(ToyEngine())`):
the proof that a new engine is one package, one registry line, one recipe and its template, with nothing in
builders/ naming it.

Its image is a pinned archive copied onto the distro's base; its one gate reads the CMake floor its archive's
`toy.toml` states and cites that line; a pool runs `toy-server`, whose own knob is `toy.workers`.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from builders.config.models import Distro, Recipe
from builders.config.profile import PoolSettings, StackProfile
from builders.container import Engine, RunSpec
from builders.engines.args import ServeArgSpec, ServeOption
from builders.engines.checks import CheckResult
from builders.engines.sdist import find_line, sdist_member
from builders.engines.serving import HelpRunner, ModelFormat, PoolCommand, ServerProbe, ServingEngine
from builders.gates.context import PreflightContext
from builders.gates.findings import Finding, blocker, passed, unchecked
from builders.plan import BuildPlan, ContextItem, PlanOptions, image_build_args, image_labels
from builders.platforms import platform_of

SERVER = "toy-server"
TOY_TOML = "toy.toml"
CMAKE_FLOOR = r'^cmake_minimum\s*=\s*"(\d+(?:\.\d+)*)"'


class ToyRecipe(Recipe):
    """A toy recipe: the keys every recipe has, and the toy's own greeting."""

    engine: Literal["toy"] = Field(description="the toy engine")
    greeting: str = Field(default="hello", pattern=r"^[a-z ]{1,40}$", description="what its server says")


class ToySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int = Field(default=1, ge=1, le=64, description="Worker threads of one toy-server.")


class ToyPool(PoolSettings):
    """A pool of toy-server replicas."""

    engine: Literal["toy"] = Field(description="the toy engine")
    toy: ToySettings = Field(default_factory=ToySettings, description="toy-server's own knobs")

    def problems(self, profile: StackProfile, name: str) -> list[str]:
        cores = max(len(self.cpus), 1)
        if self.toy.workers > 8 * cores:
            return [f"pools.{name}.toy.workers: {self.toy.workers} workers on {cores} CPU set(s); give at most 8 each"]
        return []

    @property
    def max_sequences(self) -> int | None:
        return self.toy.workers


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


class ToyEngine(ServingEngine):
    name: ClassVar[str] = "toy"
    title: ClassVar[str] = "Toy"
    recipe_model: ClassVar[type[Recipe]] = ToyRecipe
    pool_model: ClassVar[type[PoolSettings] | None] = ToyPool
    model_format: ClassVar[ModelFormat] = "gguf"
    busy_metric: ClassVar[str] = "toy:busy"

    def plan(self, distro: Distro, recipe: Recipe, options: PlanOptions) -> BuildPlan:
        assert recipe.source is not None and recipe.source.pypi is not None
        pin = recipe.source.pypi
        version = options.vllm_version or pin.version
        return BuildPlan(
            distro=distro,
            recipe=recipe,
            target=recipe.target,
            base_ref=distro.base.local_tag,
            image_tag=options.tag or f"forge/{distro.name}-{recipe.target}{platform_of(distro).suffix}:{version}",
            containerfile="Containerfile",
            template=recipe.template,
            final_stage="runtime",
            max_jobs=options.max_jobs,
            buildkit=options.buildkit,
            trust_ca_bundle=options.trust_ca_bundle,
            cmake_from_pip=False,
            torch=None,
            compile_env={},
            build_args=image_build_args({"BASE_IMAGE": distro.base.local_tag}, options),
            context=(
                ContextItem(name=f"sources/{pin.name}-{pin.version}.tar.gz", kind="sdist", origin=f"PyPI {pin.name}"),
            ),
            labels=image_labels(
                distro,
                recipe,
                version=version,
                base_name=distro.base.pinned_ref,
                base_digest=options.base_digest or distro.base.digest or "unpinned",
            )
            | {"dev.forge.engine": self.name},
            secrets=(),
            runtime_packages=(),
            build_packages=(),
            vllm_version=version,
            test_checks=("toy-says",),
        )

    def gates(self, ctx: PreflightContext) -> list[Finding]:
        distro, recipe, sdist = ctx.distro, ctx.recipe, ctx.source
        if sdist is None:
            return [
                unchecked(
                    "toy-cmake",
                    f"not evaluated: {ctx.source_why}",
                    "read from toy.toml",
                    f"recipes/{recipe.name}.yaml: source",
                    f"run `forge fetch {distro.name} {recipe.target}`",
                )
            ]
        text = sdist_member(sdist, TOY_TOML) or ""
        where = find_line(text, CMAKE_FLOOR)
        if where is None:
            return [unchecked("toy-cmake", f"no cmake_minimum in {TOY_TOML}", "a floor", sdist.name, "fix the archive")]
        line, match = where
        floor, cited = match.group(1), f"{sdist.name}: {TOY_TOML}:{line}"
        found = f"CMake {distro.toolchain.cmake} (distros/{distro.name}.yaml: toolchain.cmake)"
        if _version(distro.toolchain.cmake) >= _version(floor):
            return [passed("toy-cmake", found, f">= {floor}", cited)]
        return [blocker("toy-cmake", found, f">= {floor}", cited, "build it on a distro with a newer CMake")]

    def checks(self, engine: Engine, image: str, plan: BuildPlan) -> list[CheckResult]:
        start = time.monotonic()
        rc, out = engine.run_once(RunSpec(image=image, command=["--version"], entrypoint=[SERVER]), timeout=60)
        return [CheckResult(name="toy-says", ok=rc == 0, detail=out.strip()[-200:], seconds=time.monotonic() - start)]

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
        assert isinstance(pool, ToyPool)
        args = ("--host", host, "--port", str(port), "--workers", str(pool.toy.workers), *pool.extra_args)
        keys = (
            *("(run)",) * 4,
            *(f"pools.{name}.toy.workers",) * 2,
            *(f"pools.{name}.extra_args[{i}]" for i in range(len(pool.extra_args))),
        )
        return PoolCommand(args=args, keys=keys)

    def replica_env(
        self, profile: StackProfile, pool: PoolSettings, *, cpuset: str | None, ordinal: int, cpus: int
    ) -> dict[str, str]:
        return {"TOY_ORDINAL": str(ordinal)}

    def api_key_env(self, key: str) -> dict[str, str]:
        return {"TOY_API_KEY": key}

    def help_entries(self, local: Path | None) -> tuple[tuple[str, ...], ...]:
        return ((SERVER,),) if local is None else ((str(local),),)

    def probe(
        self, run: HelpRunner, *, entries: Sequence[Sequence[str]], source: str, cache_key: str | None
    ) -> ServerProbe:
        _, out = run([*entries[0], "--help"])
        flags = re.findall(r"^\s*(--[a-z-]+)( VALUE)?", out, flags=re.M)
        options = {flag: ServeOption(flags=(flag,), takes_value=bool(value)) for flag, value in flags}
        return ServerProbe(spec=ServeArgSpec(options=options, source=source, server=SERVER), entry=tuple(entries[0]))

    def local_cache_key(self, binary: Path) -> str:
        return hashlib.sha256(str(binary.resolve()).encode()).hexdigest()[:16]

    def model_argument(self, model_dir: str) -> str:
        return f"{model_dir}/toy.model"

    def write_model(self, model_dir: Path, profile: StackProfile, *, dtype: str) -> None:
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "toy.model").write_text(f"hidden {profile.model.hidden_size}\n")
