"""vLLM's preflight: every gate a build of one of its images would hit, read from the vLLM source (file and line),
the distro file, the real base image when the engine has it, the build host and the torch index. Each phase is
`phase(facts)` over one VllmPreflight, which carries the common PreflightContext (builders/gates/context.py)
and what vLLM's own phases share: the CUDA plan, the source's facts, the probe, the toolchain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from builders.config.models import Distro, GpuMode, Recipe, Role, TorchIndex
from builders.container import Engine
from builders.engines.vllm import gates
from builders.engines.vllm.arm_gates import arm_gates
from builders.engines.vllm.plan import make_vllm_plan
from builders.engines.vllm.probe import (
    NUMA_HEADER,
    ProbeResult,
    ProbeUnavailable,
    probe_base,
    probe_nvcc_max_gcc,
    probe_packages,
)
from builders.engines.vllm.recipe import vllm_recipe
from builders.engines.vllm.source_facts import SourceFacts, read_source_facts, read_source_files
from builders.engines.vllm.torch_index import IndexListing, fetch_listing, local_listing, project_url
from builders.errors import SourceUnavailable
from builders.gates.common import check_ram, count_jobs, fetch_source, measure_disk, report_disk
from builders.gates.context import PreflightContext
from builders.gates.findings import Finding, passed, unchecked, warning
from builders.plan import CudaPlan, PlanOptions, cuda_torch, torch_spec
from builders.platforms import isa_for
from builders.sources import resolve_fetched, wheelhouse_dir
from builders.target import Target

# The gates read from the vLLM source: without it none of them is evaluated.
SOURCE_GATES = ("gcc", "cmake", "python", "python-cmake", "fetched-source")


def _source_unchecked(recipe: Recipe, why: str, gates_read: Sequence[str]) -> list[Finding]:
    """One finding per gate the source would have answered: each says it was not evaluated, and why."""
    return [
        unchecked(
            gate,
            f"not evaluated: no vLLM source ({why})",
            "read from the vLLM source",
            f"recipes/{recipe.name}.yaml: source",
            "make PyPI reachable (preflight fetches the pinned sdist itself), run `forge fetch`, or pass --source PATH",
            f"the {gate} gate comes from the vLLM source being built",
        )
        for gate in gates_read
    ]


@dataclass(frozen=True, kw_only=True)
class Fact:
    value: str
    origin: str  # "distros/debian-12.yaml: toolchain.gcc" or "probe of forge/base:debian-12: g++-12 12.2.0-14"


@dataclass(frozen=True, kw_only=True)
class Toolchain:
    gcc: Fact
    gcc_key: str  # the YAML key the declared GCC came from
    cmake: Fact
    python: Fact


def _toolchain(target: Target, probe: ProbeResult | None) -> tuple[Toolchain, list[Finding]]:
    """The compiler, CMake and Python the build would use: probed where possible, else declared."""
    distro = target.distro
    yaml = f"distros/{distro.name}.yaml"
    cuda_host = distro.cuda.host_compiler if target.cuda and distro.cuda else None
    if cuda_host:
        gcc_key, gcc_declared, gcc_pkgs = "cuda.host_compiler.gcc", cuda_host.gcc, list(cuda_host.packages)
    elif distro.compiler_enable:
        gcc_key, gcc_declared = "compiler_enable.gcc", distro.compiler_enable.gcc
        gcc_pkgs = list(distro.compiler_enable.packages)
    else:
        gcc_key, gcc_declared, gcc_pkgs = "toolchain.gcc", distro.toolchain.gcc, list(distro.packages["c_compiler"])
    python_declared, python_key = distro.build_python
    wanted = {
        gcc_key: (gcc_declared, gcc_pkgs),
        "toolchain.cmake": (distro.toolchain.cmake, list(distro.packages.get("cmake", ()))),
        python_key: (python_declared, list(distro.packages["python"][:1])),
    }
    facts: dict[str, Fact] = {}
    probed: dict[str, tuple[str, str]] = {}
    for key, (declared, pkgs) in wanted.items():
        got = probe.version_of(pkgs) if probe else None
        if got and probe:
            probed[key] = got
            facts[key] = Fact(value=got[0], origin=f"probe of {probe.image}: {got[1]}")
        else:
            facts[key] = Fact(value=declared, origin=f"{yaml}: {key}")
    findings = gates.declared_vs_probed(
        distro_name=distro.name, declared={k: v[0] for k, v in wanted.items()}, probed=probed
    )
    python = facts[python_key]
    short_python = Fact(value=".".join(python.value.split(".")[:2]), origin=python.origin)
    return Toolchain(gcc=facts[gcc_key], gcc_key=gcc_key, cmake=facts["toolchain.cmake"], python=short_python), findings


def alternatives(distros: Mapping[str, Distro], target: Target) -> list[tuple[str, str]]:
    """Other distros' compilers, in the order a remedy should suggest them: the same family's default release (its
    stable one: Debian 14 is testing), the rest of the family (newest first), each other family's default, the rest."""
    distro = target.distro
    others = [d for d in distros.values() if d.name != distro.name]
    if target.cuda:
        others = [d for d in others if d.cuda]

    def gcc_of(d: Distro) -> str:
        if target.cuda and d.cuda and d.cuda.host_compiler:
            return d.cuda.host_compiler.gcc
        return d.gcc

    def release_key(d: Distro) -> tuple[int, ...]:
        return tuple(int(p) for p in d.release.split(".") if p.isdigit())

    same = sorted(
        (d for d in others if d.family == distro.family),
        key=lambda d: (d.default_for_family, release_key(d)),
        reverse=True,
    )
    defaults = sorted((d for d in others if d.default_for_family and d not in same), key=lambda d: d.name)
    rest = sorted((d for d in others if d not in same and d not in defaults), key=lambda d: d.name)
    return [(d.name, gcc_of(d)) for d in (*same, *defaults, *rest)]


def _torch_findings(
    facts: SourceFacts | None,
    target: Target,
    python: str,
    wheelhouse: Sequence[Path],
    torch_index: TorchIndex | None,
    torch_version: str | None,
) -> list[Finding]:
    distro, recipe = target.distro, target.recipe
    pin_version, pin_source = recipe.torch.version, f"recipes/{recipe.name}.yaml: torch.version"
    if torch_version:
        pin_version, pin_source = torch_version, "--torch-version"
    if pin_version is None and facts is not None:
        pins = facts.pins_for(target.device, arch=distro.arch, python=python)
        build_pins = [p for p in pins if p.kind == "build" and p.version] or [p for p in pins if p.version]
        if build_pins:
            pin_version, pin_source = build_pins[0].version, build_pins[0].source
    if pin_version is None:
        return [
            unchecked(
                "torch-wheel",
                "not evaluated: no torch pin known",
                "a torch pin",
                f"recipes/{recipe.name}.yaml: torch",
                "give torch.version in the recipe, or a vLLM source to read the pin from",
            )
        ]
    # The index the build will use: --torch-index where given, else the recipe's (issue 15: not always PyTorch's).
    options = PlanOptions(max_jobs=1, torch_version=pin_version, torch_index=torch_index)
    # A GPU image installs the plan's torch: the build for the base's CUDA (2.14.0+cu130 from /whl/cu130).
    spec = (
        cuda_torch(target, options, distro.cuda.torch_tag)
        if target.cuda and distro.cuda
        else torch_spec(target, options)
    )
    if spec is None:
        return []
    listing: IndexListing
    if spec.index == "wheelhouse":
        folders = [*wheelhouse]
        if recipe.wheelhouse:
            folders += [Path(f) for f in recipe.wheelhouse.find_links]
        if spec.index_url and not spec.index_url.startswith(("http://", "https://")):
            folders.append(Path(spec.index_url))
        if not any(f.is_dir() for f in folders):
            where = ", ".join(str(f) for f in folders) or "no folder given"
            return [
                unchecked(
                    "torch-wheel",
                    f"wheelhouse not fetched: {where} does not exist",
                    spec.requirement,
                    pin_source,
                    f"run `forge fetch {distro.name} {recipe.target} wheelhouse`, or pass --wheelhouse DIR",
                )
            ]
        listing = local_listing(folders)
    elif spec.index_url:
        listing = fetch_listing(project_url(spec.index_url))
    else:
        return [
            unchecked(
                "torch-wheel",
                f"not evaluated: no URL for index {spec.index}",
                spec.requirement,
                pin_source,
                f"set torch.index_url in recipes/{recipe.name}.yaml",
            )
        ]
    return [
        gates.torch_wheel_gate(
            version=spec.version,
            pin_source=pin_source,
            python=python,
            arch=distro.arch,
            index_name=spec.index,
            listing=listing,
            recipe_name=recipe.name,
            glibc=distro.toolchain.glibc,
        )
    ]


def _probe_findings(
    distro: Distro, device: str, engine: Engine | None, probe: bool, image: str | None = None
) -> tuple[ProbeResult | None, list[Finding]]:
    """Probe the image the build starts from if asked and possible; say so either way."""
    yaml = f"distros/{distro.name}.yaml"
    image = image or distro.base.local_tag
    result: ProbeResult | None = None
    if not probe:
        why = "--no-probe given"
    elif engine is None:
        why = "no container engine connected"
    else:
        outcome = probe_base(engine, distro, device=device, image=image)
        if isinstance(outcome, ProbeUnavailable):
            why = outcome.reason
        else:
            result, why = outcome, ""
    if result is None:
        how = (
            f"load or bootstrap {image} (`forge bootstrap {distro.name}`)"
            if image == distro.base.local_tag
            else f"pull or `docker load` {image}"
        )
        notice = warning(
            "probe",
            f"declared facts only: {why}",
            f"probe of {image}",
            yaml,
            f"{how} and rerun to check the real archive",
            "toolchain versions come from the distro file, unverified",
        )
        return None, [notice]
    out = [passed("probe", f"probed in {result.seconds:.1f} s", "", result.image)]
    out += [
        warning("probe", f"probe step failed: {err}", "", result.image, "check the base's package sources")
        for err in result.errors
    ]
    query, _ = probe_packages(distro, device=device)
    for pkg in result.missing(query):
        role = next((r for r, pkgs in distro.packages.items() if pkg in pkgs), "packages")
        out.append(_soften(gates.missing_package_gate(pkg, role, distro.name, result.image), result))
    return result, out


def _soften(finding: Finding, probe: ProbeResult | None) -> Finding:
    """A probe step that failed (EPEL unreachable) hides packages that do exist: warn rather than block."""
    if probe is not None and probe.archive_trouble and finding.blocking:
        return finding.model_copy(update={"blocking": False})
    return finding


def _file_findings(distro: Distro, compiles: bool, probe: ProbeResult | None) -> list[Finding]:
    files = probe.files if probe else {}
    origin = probe.image if probe else ""
    checks: list[tuple[str, str, Role, str]] = [("tcmalloc", distro.tcmalloc_path, "tcmalloc", "tcmalloc_path")]
    if compiles:
        checks.insert(0, ("numa-headers", NUMA_HEADER, "numa_headers", "packages.numa_headers"))
    return [
        _soften(
            gates.file_gate(
                gate=gate,
                path=path,
                present=files.get(path),
                packages=distro.packages[role],
                origin=origin,
                yaml_key=key,
                distro_name=distro.name,
            ),
            probe,
        )
        for gate, path, role, key in checks
    ]


# What a GPU build in wheel mode does not run: it installs PyPI's CUDA wheel and compiles nothing.
COMPILE_GATES = ("gcc", "nvcc-host-gcc", "cuda-glibc-rsqrt", "cmake", "python-cmake", "numa-headers", "ram")


def _cpuinfo_text() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def staged_sources(root: Path, recipe: Recipe) -> dict[str, str]:
    """The recipe's fetched sources that have a local copy now (cache or recipe path), with its origin."""
    out = {}
    for source in recipe.fetched_sources:
        try:
            out[source.name] = resolve_fetched(source, root, {}).origin
        except SourceUnavailable:
            continue
    return out


def _source_matches_wheel(recipe: Recipe) -> bool:
    pin = recipe.source.pypi if recipe.source else None
    return pin is not None and recipe.cuda is not None and pin.version == recipe.cuda.wheel_version


def _gpu_mode_finding(recipe: Recipe, cuda: CudaPlan, gpu_mode: GpuMode | None) -> Finding:
    origin = "--gpu-mode" if gpu_mode else f"recipes/{recipe.name}.yaml: cuda.mode"
    if cuda.mode == "wheel":
        message = (
            f"PyPI's CUDA wheel on {cuda.runtime_ref}: nothing is compiled, so the compile gates "
            f"({', '.join(COMPILE_GATES)}) do not apply"
        )
    else:
        message = f"compiled in {cuda.devel_ref} for TORCH_CUDA_ARCH_LIST={cuda.arch_list}"
    return passed("gpu-mode", f"{cuda.mode} (CUDA {cuda.version})", "wheel or source", origin, message)


def _rsqrt_finding(distro: Distro, probe: ProbeResult | None) -> Finding:
    assert distro.cuda is not None
    if probe is not None and probe.glibc:
        glibc, origin = probe.glibc, f"probe of {probe.image}: getconf GNU_LIBC_VERSION"
    else:
        glibc, origin = distro.toolchain.glibc, f"distros/{distro.name}.yaml: toolchain.glibc"
    return gates.glibc_rsqrt_gate(
        cuda_version=distro.cuda.version,
        glibc=glibc,
        glibc_origin=origin,
        fix_declared=distro.cuda.glibc_rsqrt_fix,
        distro_name=distro.name,
    )


def _nvcc_finding(distro: Distro, engine: Engine | None, toolchain: Toolchain, cuda: CudaPlan) -> Finding:
    assert distro.cuda is not None
    max_major: int | None = None
    max_source = f"CUDA {distro.cuda.version} → newest GCC table (builders/engines/vllm/gates.py CUDA_MAX_GCC)"
    # The devel base's own header decides where the base carries the toolkit (NVIDIA's images); a base whose
    # build stage installs it from NVIDIA's repository (Fedora) has none to read, and the table answers.
    base = cuda.devel_ref or distro.cuda.base_image
    read = probe_nvcc_max_gcc(engine, base, cuda_home=cuda.home) if engine else None
    if read and read[0] is not None:
        max_major, max_source = read[0], read[1]
    else:
        max_major = gates.max_gcc_for_cuda(distro.cuda.version)
    return gates.nvcc_host_gcc_gate(
        cuda_version=distro.cuda.version,
        host_gcc=toolchain.gcc.value,
        host_gcc_origin=toolchain.gcc.origin,
        max_major=max_major,
        max_source=max_source,
        family=distro.family,
        distro_name=distro.name,
    )


@dataclass(kw_only=True)
class VllmPreflight:
    """What vLLM's preflight phases share besides the common context: the CUDA part of the plan (None for a CPU
    image), the facts read from the vLLM source (None without one), the probe of the base the build starts from,
    and the toolchain the build would use, probed or declared."""

    ctx: PreflightContext
    cuda: CudaPlan | None = None
    facts: SourceFacts | None = None
    probe: ProbeResult | None = None
    toolchain: Toolchain | None = None

    @property
    def target(self) -> Target:
        return self.ctx.target

    @property
    def carries_vllm(self) -> bool:
        """The image carries vLLM (not the router alone): a toolchain, tcmalloc and the base probe matter."""
        return self.target.device != "none"


def _gpu_mode(v: VllmPreflight) -> None:
    target, recipe = v.target, v.target.recipe
    if target.cuda and target.distro.cuda is not None:
        # Only the mode and the bases are read from this plan; the torch gate judges torch from the real pin.
        options = PlanOptions(max_jobs=1, gpu_mode=v.ctx.gpu_mode, torch_version=recipe.torch.version or "0")
        v.cuda = make_vllm_plan(target.distro, recipe, options).cuda
    # gpu-wheel takes CUDA from PyPI's wheels on the distro's own base: it needs no cuda section.
    if target.cuda and v.cuda is None and not target.from_wheelhouse:
        v.ctx.findings.append(gates.no_cuda_gate(target.distro.name))
    if v.cuda is not None:
        v.ctx.findings.append(_gpu_mode_finding(recipe, v.cuda, v.ctx.gpu_mode))


def _source(v: VllmPreflight) -> None:
    ctx, target, recipe = v.ctx, v.target, v.target.recipe
    ctx.source = ctx.given_source
    # A GPU wheel's requires-python is the sdist's of the same release: the python gate reads it from there.
    if target.compiles or (target.gpu_wheel and _source_matches_wheel(recipe)):
        fetch_source(ctx)
        if ctx.source is None:
            ctx.findings += _source_unchecked(recipe, ctx.source_why, SOURCE_GATES if target.compiles else ("python",))
        else:
            v.facts = read_source_facts(ctx.source)
            ctx.version = v.facts.vllm_version
    elif target.gpu_wheel:
        pin = recipe.source.pypi if recipe.source else None
        ctx.findings.append(
            unchecked(
                "python",
                f"not evaluated: no sdist of the wheel's release ({recipe.cuda.wheel_version if recipe.cuda else '?'}) "
                f"pinned (source.pypi: {pin.version if pin else 'none'})",
                "the wheel's requires-python",
                f"recipes/{recipe.name}.yaml: source.pypi",
                "pin the sdist of the same vLLM release as cuda.wheel_version, so its requires-python can be read",
            )
        )


def _probe(v: VllmPreflight) -> None:
    ctx = v.ctx
    if v.carries_vllm:
        # A GPU build starts from the CUDA devel base (source) or the CUDA runtime base (wheel), not the distro's.
        image = (v.cuda.devel_ref or v.cuda.runtime_ref) if v.cuda else None
        v.probe, notes = _probe_findings(ctx.distro, v.target.device, ctx.engine, ctx.probe, image)
        ctx.findings += notes
    if v.probe is not None:
        ctx.mode, ctx.probe_image = "probed", v.probe.image
    v.toolchain, agreement = _toolchain(v.target, v.probe)
    if v.carries_vllm:
        ctx.findings += agreement


def _compile_gates(v: VllmPreflight) -> None:
    ctx, target, facts, toolchain = v.ctx, v.target, v.facts, v.toolchain
    assert toolchain is not None
    if not target.compiles or facts is None:
        return
    distro, recipe = target.distro, target.recipe
    device, arch = target.device, distro.arch
    ctx.findings += gates.gcc_gates(
        facts,
        gcc=toolchain.gcc.value,
        gcc_origin=toolchain.gcc.origin,
        device=device,
        arch=arch,
        distro_name=distro.name,
        alternatives=alternatives(ctx.distros, target),
        compiler_key="cuda.host_compiler" if target.cuda else "compiler_enable",
    )
    cmake = gates.cmake_gate(
        facts,
        cmake=toolchain.cmake.value,
        cmake_origin=toolchain.cmake.origin,
        cmake_from_pip=vllm_recipe(recipe).cmake_from_pip,
        recipe_name=recipe.name,
    )
    ctx.findings += [cmake] if cmake else []
    ctx.findings += gates.fetched_source_gates(
        facts.fetched_for(device, arch),
        recipe.fetched_sources,
        recipe.name,
        staged=staged_sources(ctx.root, recipe),
        fetch_command=f"forge fetch {distro.name} {recipe.target}",
    )
    if arch == "aarch64" and ctx.source is not None:
        plan_env = {**recipe.build_env, **isa_for(recipe.isa, arch)}
        ctx.findings += arm_gates(read_source_files(ctx.source), compile_env=plan_env, host_cpuinfo=_cpuinfo_text())


def _python(v: VllmPreflight) -> None:
    target, facts, toolchain = v.target, v.facts, v.toolchain
    assert toolchain is not None
    if facts is not None and (target.compiles or target.gpu_wheel):
        python = gates.python_gates(
            facts, python=toolchain.python.value, python_origin=toolchain.python.origin, distro_name=target.distro.name
        )
        v.ctx.findings += [f for f in python if target.compiles or f.gate not in COMPILE_GATES]


def _torch(v: VllmPreflight) -> None:
    ctx, toolchain = v.ctx, v.toolchain
    assert toolchain is not None
    if v.target.installs_torch:
        # The build's folder when none is given: the one `forge fetch DISTRO TARGET wheelhouse` fills.
        recipe = v.target.recipe
        wheelhouse = ctx.wheelhouse
        if not wheelhouse and recipe.wheelhouse is not None:
            wheelhouse = [wheelhouse_dir(ctx.root, v.target.distro, recipe)]
        ctx.findings += _torch_findings(
            v.facts, v.target, toolchain.python.value, wheelhouse, ctx.torch_index, ctx.torch_version
        )


def _files(v: VllmPreflight) -> None:
    if v.carries_vllm:
        v.ctx.findings += _file_findings(v.target.distro, v.target.compiles, v.probe)


def _cuda_compile(v: VllmPreflight) -> None:
    assert v.toolchain is not None
    if v.cuda is not None and v.target.compiles:
        v.ctx.findings.append(_nvcc_finding(v.target.distro, v.ctx.engine, v.toolchain, v.cuda))
        v.ctx.findings.append(_rsqrt_finding(v.target.distro, v.probe))


def _disk_and_ram(v: VllmPreflight) -> None:
    ctx = v.ctx
    measure_disk(ctx)
    report_disk(ctx)
    count_jobs(ctx, compiles=v.target.compiles)
    if not v.target.gpu_wheel:
        check_ram(ctx)


def _cpu(v: VllmPreflight) -> None:
    ctx, target = v.ctx, v.target
    if not target.cpu:
        return
    arch, recipe = target.distro.arch, target.recipe
    ctx.findings.append(
        gates.isa_gate(
            isa=isa_for(recipe.isa, arch),
            arch=arch,
            build_flags=ctx.host.cpu_flags,
            run_flags=ctx.run_flags,
            run_source=ctx.run_source,
            recipe_name=recipe.name,
            serve_test=recipe.serve_test,
        )
    )
    ctx.findings.append(gates.runtime_dtype_gate(arch=arch, run_flags=ctx.run_flags, run_source=ctx.run_source))


# vLLM's preflight, in the order its findings are reported.
PHASES = (_gpu_mode, _source, _probe, _compile_gates, _python, _torch, _files, _cuda_compile, _disk_and_ram, _cpu)


def preflight(ctx: PreflightContext) -> None:
    """Every gate for building a vLLM image (or the router's, which rides vLLM's CPU plan) on `ctx.distro` here. A
    failed gate never raises: the report says, and a gate that could not be evaluated makes it incomplete."""
    facts = VllmPreflight(ctx=ctx)
    for phase in PHASES:
        phase(facts)
