"""SGLang's GPU image from PyPI alone: the sglang and sglang-kernel CUDA wheels, torch's nvidia-* wheels for CUDA,
on the plain Debian base vLLM's gpu-wheel image uses. No NVIDIA base image is fetched and nothing is compiled.

Every wheel of the set is pinned by sha256 in the recipe's `wheel_lock`: preflight compares the wheelhouse with it
(`wheelhouse_findings`), and the Containerfile checks each file with `sha256sum --check` and refuses a wheel the
lock does not name before anything is installed. Its test stage is gpu_wheel_checks.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from builders.config.models import Distro, Recipe
from builders.distros import family_for
from builders.engines.sglang.serve import SGLangRecipe
from builders.errors import ConfigError
from builders.gates.context import PreflightContext
from builders.gates.findings import Finding, blocker, passed, unchecked
from builders.plan import BuildPlan, ContextItem, CudaPlan, PlanOptions, image_build_args, image_labels, torch_spec
from builders.platforms import platform_of
from builders.sources import sha256_file, wheelhouse_dir
from builders.target import Target

CHECKS = ("import-sglang", "import-sgl-kernel", "cuda-archs", "kernel-archs", "serve-models-gpu")
LOCK_KEY = "wheel_lock"


def sglang_recipe(recipe: Recipe) -> SGLangRecipe:
    assert isinstance(recipe, SGLangRecipe), f"recipes/{recipe.name}.yaml is {recipe.engine}'s, not SGLang's"
    return recipe


def plan(distro: Distro, recipe: Recipe, options: PlanOptions) -> BuildPlan:
    target = Target.resolve(distro, recipe)
    own = sglang_recipe(recipe)
    if recipe.cuda is None or recipe.wheelhouse is None:
        raise ConfigError(
            f"recipes/{recipe.name}.yaml: a wheel image needs a cuda section and a wheelhouse",
            hint="pin the sglang wheel under cuda.wheels and its requirements under wheelhouse.requirements",
        )
    if not own.wheel_lock:
        raise ConfigError(
            f"recipes/{recipe.name}.yaml: {LOCK_KEY} is empty, so no wheel of the image would be checked",
            hint=f"run `forge fetch {distro.name} {recipe.target} wheelhouse`, then pin each wheel's sha256 under "
            f"{LOCK_KEY} (`sha256sum *.whl` in the wheelhouse folder)",
        )
    wheel = next((w for w in recipe.cuda.wheels if w.arch == distro.arch), None)
    if wheel is None:
        raise ConfigError(
            f"recipes/{recipe.name}.yaml: cuda.wheels has no {distro.arch} wheel for {distro.name}",
            hint="pin the wheel's file name and sha256 for that architecture from PyPI",
        )
    if own.wheel_lock.get(wheel.filename) != wheel.sha256:
        raise ConfigError(
            f"recipes/{recipe.name}.yaml: cuda.wheels pins {wheel.filename} at sha256 {wheel.sha256}, and "
            f"{LOCK_KEY} pins {own.wheel_lock.get(wheel.filename) or 'no such file'}",
            hint="pin the same file with the same sha256 in both",
        )
    version = recipe.cuda.wheel_version
    arch_list = options.cuda_arch_list or recipe.cuda.arch_list
    labels = image_labels(
        distro,
        recipe,
        version=version,
        base_name=distro.base.pinned_ref,
        base_digest=options.base_digest or distro.base.digest or "unpinned",
        with_source=False,
    )
    labels |= {
        "org.opencontainers.image.source": f"https://pypi.org/project/{recipe.cuda.wheel_project}/",
        "dev.forge.engine": "sglang",
        "dev.forge.platform": platform_of(distro).name,
        "dev.forge.gpu.mode": "pypi-wheels",
        "dev.forge.cuda.arch_list": arch_list,
        "dev.forge.wheel": f"{wheel.filename} sha256:{wheel.sha256}",
        "dev.forge.wheel_lock": f"{len(own.wheel_lock)} wheels pinned by sha256 in recipes/{recipe.name}.yaml",
    }
    # Triton and flashinfer compile launchers with a C compiler and Python.h at first use; no C++ compiler.
    runtime = [*family_for(distro).packages(["runtime", "python", "python_headers"]), "gcc"]
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
        torch=torch_spec(target, options),
        compile_env={},
        build_args=image_build_args({"BASE_IMAGE": distro.base.local_tag}, options),
        context=(
            ContextItem(name="scripts", kind="script", origin="containers/scripts"),
            ContextItem(name="wheelhouse", kind="wheelhouse", origin="`forge fetch` of the recipe's wheelhouse"),
        ),
        labels=labels,
        secrets=("ca_bundle",) if options.trust_ca_bundle else (),
        runtime_packages=tuple(dict.fromkeys(runtime)),
        build_packages=(),
        vllm_version=version,
        test_checks=CHECKS,
        cuda=CudaPlan(
            mode="wheel",
            # torch's nvidia-* wheels decide the CUDA; the test stage records which (torch.version.cuda).
            version="from PyPI's nvidia-* wheels",
            devel_ref=None,
            runtime_ref=distro.base.local_tag,
            home="",
            torch_tag="",
            arch_list=arch_list,
            nvcc_threads=recipe.cuda.nvcc_threads,
            host_cxx=None,
            toolkit_install=None,
            wheel_requirement=f"{recipe.cuda.wheel_project}=={version}",
            wheel=wheel,
            build_python_packages=(),
        ),
    )


# --- the lock against a wheelhouse --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LockDrift:
    """How a wheelhouse folder differs from the lock: files the lock names that are not there, files there that
    it does not name, and files whose bytes are another build (sha256 differs)."""

    missing: tuple[str, ...]
    unlocked: tuple[str, ...]
    changed: tuple[tuple[str, str, str], ...]  # (file, locked sha256, found sha256)

    @property
    def clean(self) -> bool:
        return not (self.missing or self.unlocked or self.changed)

    def lines(self) -> list[str]:
        out = [f"missing: {name}" for name in self.missing]
        out += [f"not in the lock: {name}" for name in self.unlocked]
        out += [f"{name}: sha256 {found[:12]}…, locked {locked[:12]}…" for name, locked, found in self.changed]
        return out


def lock_drift(lock: dict[str, str], folder: Path) -> LockDrift:
    """Compare the wheels in `folder` with `lock` (file name → sha256), hashing only what both name."""
    present = {p.name: p for p in folder.glob("*.whl")} if folder.is_dir() else {}
    changed = []
    for name in sorted(set(lock) & set(present)):
        found = sha256_file(present[name])
        if found != lock[name]:
            changed.append((name, lock[name], found))
    return LockDrift(
        missing=tuple(sorted(set(lock) - set(present))),
        unlocked=tuple(sorted(set(present) - set(lock))),
        changed=tuple(changed),
    )


def lock_problems(recipe: SGLangRecipe) -> list[str]:
    """What the lock itself gets wrong, with no wheelhouse at hand: two files of one project (the install would
    fail on the pair), and a top-level requirement's pinned version that no locked file has."""
    projects: dict[str, list[str]] = {}
    versions: dict[str, set[str]] = {}
    problems = []
    for name in recipe.wheel_lock:
        try:
            project, version, _, _ = parse_wheel_filename(name)
        except InvalidWheelFilename as exc:
            problems.append(f"{name}: {exc}")
            continue
        projects.setdefault(project, []).append(name)
        versions.setdefault(project, set()).add(str(version))
    problems += [f"two files of {p}: {', '.join(files)}" for p, files in sorted(projects.items()) if len(files) > 1]
    for requirement in recipe.wheelhouse.requirements if recipe.wheelhouse else ():
        req = Requirement(requirement)
        project = canonicalize_name(req.name)
        pinned = next((s.version for s in req.specifier if s.operator == "=="), None)
        if pinned and pinned not in versions.get(project, set()):
            held = ", ".join(sorted(versions.get(project, set()))) or "none"
            problems.append(f"wheelhouse.requirements pins {requirement}, the lock has {held}")
    return problems


def wheelhouse_findings(ctx: PreflightContext) -> list[Finding]:
    """The lock is consistent, and the wheelhouse a build would use (--wheelhouse, else the cache folder `forge
    fetch` fills) holds exactly the locked files with the locked bytes."""
    recipe = sglang_recipe(ctx.recipe)
    where = f"recipes/{recipe.name}.yaml: {LOCK_KEY}"
    findings = []
    problems = lock_problems(recipe)
    if problems:
        findings.append(
            blocker(
                "wheel-lock",
                "; ".join(problems[:5]) + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""),
                "one file per project, at the version wheelhouse.requirements pins",
                where,
                "refetch the wheelhouse and pin what it holds",
                "the image's install of the wheelhouse would fail, or install other versions than the recipe names",
            )
        )
    else:
        findings.append(passed("wheel-lock", f"{len(recipe.wheel_lock)} wheels, one per project", "consistent", where))
    folder = ctx.wheelhouse[0] if ctx.wheelhouse else wheelhouse_dir(ctx.root, ctx.distro, recipe)
    drift = lock_drift(dict(recipe.wheel_lock), folder)
    fetch = f"forge fetch {ctx.distro.name} {recipe.target} wheelhouse"
    if drift.clean:
        findings.append(
            passed(
                "wheelhouse",
                f"{folder}: the {len(recipe.wheel_lock)} locked wheels, sha256 as pinned",
                "the lock",
                where,
            )
        )
    elif not drift.changed and len(drift.missing) == len(recipe.wheel_lock) and not drift.unlocked:
        # Not fetched yet (CI preflights before it fetches): not evaluated, as vLLM's torch-wheel gate says of an
        # absent wheelhouse, rather than a finding about files that are not there.
        findings.append(
            unchecked(
                "wheelhouse",
                f"no wheel in {folder}",
                f"the {len(recipe.wheel_lock)} locked wheels",
                where,
                f"run `{fetch}`, or pass --wheelhouse DIR",
                "the wheelhouse was not checked against the lock; the build stops before installing without it",
            )
        )
    else:
        lines = drift.lines()
        findings.append(
            blocker(
                "wheelhouse",
                f"{folder}: " + "; ".join(lines[:6]) + (f" (and {len(lines) - 6} more)" if len(lines) > 6 else ""),
                "exactly the locked wheels, sha256 as pinned",
                where,
                f"remove the files not in the lock and run `{fetch}`; if PyPI's resolution moved, pin what it "
                f"resolves now in {LOCK_KEY}",
                "the image's sha256 check refuses this wheelhouse before anything is installed",
            )
        )
    return findings
