"""run_preflight: gather the facts (source, base probe, host, index), run every gate, report.

The build executor calls this as its first phase; `forge preflight` calls it on its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from builders.config import Project
from builders.config.models import Distro, GpuMode, Recipe, Role, TorchIndex
from builders.container import Engine
from builders.errors import SourceUnavailable
from builders.plan import CudaPlan, PlanOptions, cuda_torch, make_plan, native_module, torch_spec
from builders.platforms import isa_for
from builders.preflight import gates
from builders.preflight.arm_gates import arm_gates
from builders.preflight.findings import Finding, PreflightReport, passed, unchecked, warning
from builders.preflight.host import (
    GIB,
    HostFacts,
    derive_max_jobs,
    free_bytes,
    mount_for,
    read_host_facts,
)
from builders.preflight.inputs import PreflightInputs
from builders.preflight.probe import (
    NUMA_HEADER,
    ProbeResult,
    ProbeUnavailable,
    probe_base,
    probe_nvcc_max_gcc,
    probe_packages,
)
from builders.preflight.source_facts import SourceFacts, read_source_facts, read_source_files
from builders.preflight.torch_index import IndexListing, fetch_listing, local_listing, project_url
from builders.sources import cache_dir, fetch_sdist, resolve_fetched
from builders.target import Target

Progress = Callable[[str], None]


def default_source_path(project: Project, recipe: Recipe) -> Path | None:
    """The recipe's pinned sdist in the source cache (`forge fetch` puts it there), if present."""
    if recipe.source is None or recipe.source.pypi is None:
        return None
    pin = recipe.source.pypi
    path = cache_dir(project.root) / f"{pin.name}-{pin.version}.tar.gz"
    return path if path.is_file() else None


# The gates read from the vLLM source: without it none of them is evaluated.
SOURCE_GATES = ("gcc", "cmake", "python", "python-cmake", "fetched-source")


def _source_or_fetch(
    project: Project, recipe: Recipe, source: Path | None, fetch: bool, progress: Progress
) -> tuple[Path | None, str]:
    """The vLLM source to read: given, cached, or fetched now (sha256-checked, into `forge fetch`'s cache).
    Returns the path, or None and why it could not be had."""
    if source is not None:
        return source, ""
    cached = default_source_path(project, recipe)
    if cached is not None:
        return cached, ""
    pin = recipe.source.pypi if recipe.source else None
    if pin is None:
        return None, "the recipe pins no PyPI sdist"
    if not fetch:
        return None, "not in the source cache and fetching was not asked for"
    progress(
        f"preflight: fetching {pin.name} {pin.version} sdist from PyPI into {cache_dir(project.root)} (sha256-checked)"
    )
    start = time.monotonic()
    try:
        got = fetch_sdist(recipe, project.root)
    except SourceUnavailable as exc:
        progress(f"preflight: could not fetch {pin.name} {pin.version}: {exc.message}")
        return None, exc.message
    size = got.path.stat().st_size / 1e6
    progress(f"preflight: fetched {got.path.name} ({size:.0f} MB) in {time.monotonic() - start:.1f} s")
    return got.path, ""


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


def _alternatives(project: Project, target: Target) -> list[tuple[str, str]]:
    """Other distros' compilers, in the order a remedy should suggest them: the same family's default release (its
    stable one: Debian 14 is testing), the rest of the family (newest first), each other family's default, the rest."""
    distro = target.distro
    others = [d for d in project.distros.values() if d.name != distro.name]
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
    if not target.runs_vllm:
        return []
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


def _disk_findings(
    recipe: Recipe, engine: Engine | None, scratch_dir: Path, host: HostFacts
) -> tuple[list[Finding], int]:
    """Layer storage and scratch space; returns the findings and the RAM a tmpfs scratch dir would take."""
    out: list[Finding] = []
    res = recipe.resources
    yaml = f"recipes/{recipe.name}.yaml"
    root = engine.root_dir if engine else None
    if root and Path(root).is_dir():
        free, where = free_bytes(Path(root))
        out.append(
            gates.disk_gate(
                gate="disk-layers",
                where=str(where),
                free=free,
                need_gb=res.disk_gb,
                need_source=f"{yaml}: resources.disk_gb",
                remedy=f"free space under {root} (`docker builder prune`, `docker image prune`) or move the engine's "
                "data-root to a bigger disk",
            )
        )
    elif root:
        out.append(
            unchecked(
                "disk-layers",
                f"engine data root {root} not visible from here",
                f"≥ {res.disk_gb:g} GiB",
                f"{yaml}: resources.disk_gb",
                f"check free space where the engine keeps {root}",
                "the engine runs elsewhere (a VM or remote host): its disk was not checked",
            )
        )
    else:
        out.append(
            unchecked(
                "disk-layers",
                "no engine connected",
                f"≥ {res.disk_gb:g} GiB",
                f"{yaml}: resources.disk_gb",
                "start the engine and rerun to check its layer storage",
            )
        )
    free, where = free_bytes(scratch_dir)
    out.append(
        gates.disk_gate(
            gate="disk-scratch",
            where=str(where),
            free=free,
            need_gb=res.scratch_gb,
            need_source=f"{yaml}: resources.scratch_gb",
            remedy=f"pass --scratch-dir on a filesystem with ≥ {res.scratch_gb:g} GiB free",
        )
    )
    mount = mount_for(scratch_dir, list(host.mounts))
    out.append(
        gates.tmpfs_gate(
            scratch_dir=scratch_dir,
            mount=mount,
            need_gb=res.scratch_gb,
            mem_total=host.memory.total,
            need_source=f"{yaml}: resources.scratch_gb",
        )
    )
    out += _builder_scratch_findings(engine, scratch_dir, host, res.scratch_gb, f"{yaml}: resources.scratch_gb")
    reserved = int(res.scratch_gb * GIB) if mount is not None and mount.fstype == "tmpfs" else 0
    return out, reserved


def _builder_scratch_findings(
    engine: Engine | None, scratch_dir: Path, host: HostFacts, need_gb: float, need_source: str
) -> list[Finding]:
    """Where the engine's builder stages on this host (buildah: TMPDIR, else /var/tmp), when not the scratch dir's
    filesystem: it holds each layer's tarball while it is committed, and is a tmpfs on some hosts."""
    out: list[Finding] = []
    scratch_mount = mount_for(scratch_dir, list(host.mounts))
    for folder in engine.facts.scratch_dirs if engine else ():
        path = Path(folder)
        mount = mount_for(path, list(host.mounts))
        if not path.is_dir() or (mount is not None and mount == scratch_mount):
            continue
        free, where = free_bytes(path)
        remedy = f"give the builder a disk-backed TMPDIR with ≥ {need_gb:g} GiB free"
        out.append(
            gates.disk_gate(
                gate="disk-builder-scratch",
                where=str(where),
                free=free,
                need_gb=need_gb,
                need_source=need_source,
                remedy=remedy,
            )
        )
        if mount is not None and mount.fstype == "tmpfs":
            out.append(
                warning(
                    "builder-scratch-tmpfs",
                    f"{folder} on tmpfs {mount.mountpoint}",
                    "disk-backed builder scratch dir",
                    "host /proc/mounts; podman info store.imageCopyTmpDir",
                    remedy,
                    "the builder stages layers in RAM the compile jobs need",
                )
            )
    return out


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


def _jobs(recipe: Recipe, compiles: bool, max_jobs: int | None, usable: int, cores: int) -> tuple[int, str]:
    if not compiles:
        return 1, "no compile: one install step"
    if max_jobs is not None:
        return max_jobs, "--max-jobs"
    if recipe.max_jobs is not None:
        return recipe.max_jobs, f"recipes/{recipe.name}.yaml: max_jobs"
    jobs = derive_max_jobs(usable, cores, recipe.resources.ram_per_job_gb)
    return jobs, f"derived from {usable / GIB:.1f} GiB and {cores} core(s)"


# What a GPU build in wheel mode does not run: it installs PyPI's CUDA wheel and compiles nothing.
COMPILE_GATES = ("gcc", "nvcc-host-gcc", "cuda-glibc-rsqrt", "cmake", "python-cmake", "numa-headers", "ram")


def gpu_plan(distro: Distro, recipe: Recipe, gpu_mode: GpuMode | None) -> CudaPlan | None:
    """The CUDA part of the plan the build would make (mode, bases); None where the distro has no cuda section."""
    if not Target.resolve(distro, recipe).cuda or distro.cuda is None:
        return None
    # Only the mode and the bases are read from this plan; the torch gate judges torch from the real pin.
    options = PlanOptions(max_jobs=1, gpu_mode=gpu_mode, torch_version=recipe.torch.version or "0")
    return make_plan(distro, recipe, options).cuda


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


def run_preflight(
    project: Project,
    distro: Distro,
    recipe: Recipe,
    *,
    engine: Engine | None,
    source: Path | None,
    max_jobs: int | None,
    scratch_dir: Path,
    probe: bool = True,
    run_host_flags: frozenset[str] | None = None,
    run_host_source: str | None = None,
    wheelhouse: Sequence[Path] = (),
    host: HostFacts | None = None,
    gpu_mode: GpuMode | None = None,
    torch_index: TorchIndex | None = None,
    torch_version: str | None = None,
    fetch: bool = False,
    progress: Progress = lambda _line: None,
    local_sources: Mapping[str, Path] | None = None,
) -> PreflightReport:
    """Every gate for building `recipe` on `distro` here. A failed gate never raises: the report says, and a gate
    that could not be evaluated makes it incomplete, never clear.

    gpu_mode: for device=cuda recipes, overrides the recipe's cuda.mode (wheel: no compile gates).
    torch_index, torch_version: what the build was told (--torch-index, --torch-version), else the recipe's.
    fetch: download the pinned vLLM sdist into the source cache when it is not there (progress says so).
    local_sources: the other --source NAME=PATH checkouts, for a kind=native engine's gates (sgl-kernel).
    Raises SourceUnavailable only when an explicitly given source cannot be read.
    """
    start = time.monotonic()
    host = host or read_host_facts()
    target = Target.resolve(distro, recipe, gpu_mode=gpu_mode)
    if target.native:
        return _native_preflight(
            project,
            distro,
            recipe,
            engine=engine,
            source=source,
            max_jobs=max_jobs,
            scratch_dir=scratch_dir,
            run_flags=run_host_flags if run_host_flags is not None else host.cpu_flags,
            run_source=run_host_source or "build host /proc/cpuinfo",
            host=host,
            fetch=fetch,
            progress=progress,
            start=start,
            local_sources=local_sources or {},
        )
    device, arch = target.device, distro.arch
    findings: list[Finding] = []
    cuda = gpu_plan(distro, recipe, gpu_mode)
    # gpu-wheel takes CUDA from PyPI's wheels on the distro's own base: it needs no cuda section.
    if target.cuda and cuda is None and not target.from_wheelhouse:
        findings.append(gates.no_cuda_gate(distro.name))
    gpu_wheel, compiles = target.gpu_wheel, target.compiles
    if cuda is not None:
        findings.append(_gpu_mode_finding(recipe, cuda, gpu_mode))

    facts: SourceFacts | None = None
    source_path = source
    # A GPU wheel's requires-python is the sdist's of the same release: the python gate reads it from there.
    if compiles or (gpu_wheel and _source_matches_wheel(recipe)):
        source_path, why = _source_or_fetch(project, recipe, source, fetch, progress)
        if source_path is None:
            findings += _source_unchecked(recipe, why, SOURCE_GATES if compiles else ("python",))
        else:
            facts = read_source_facts(source_path)
    elif gpu_wheel:
        pin = recipe.source.pypi if recipe.source else None
        findings.append(
            unchecked(
                "python",
                f"not evaluated: no sdist of the wheel's release ({recipe.cuda.wheel_version if recipe.cuda else '?'}) "
                f"pinned (source.pypi: {pin.version if pin else 'none'})",
                "the wheel's requires-python",
                f"recipes/{recipe.name}.yaml: source.pypi",
                "pin the sdist of the same vLLM release as cuda.wheel_version, so its requires-python can be read",
            )
        )

    probe_result: ProbeResult | None = None
    if target.runs_vllm:
        # A GPU build starts from the CUDA devel base (source) or the CUDA runtime base (wheel), not the distro's.
        image = (cuda.devel_ref or cuda.runtime_ref) if cuda else None
        probe_result, notes = _probe_findings(distro, device, engine, probe, image)
        findings += notes
    toolchain, agreement = _toolchain(target, probe_result)
    if target.runs_vllm:
        findings += agreement

    if compiles and facts is not None:
        findings += gates.gcc_gates(
            facts,
            gcc=toolchain.gcc.value,
            gcc_origin=toolchain.gcc.origin,
            device=device,
            arch=arch,
            distro_name=distro.name,
            alternatives=_alternatives(project, target),
            compiler_key="cuda.host_compiler" if target.cuda else "compiler_enable",
        )
        cmake = gates.cmake_gate(
            facts,
            cmake=toolchain.cmake.value,
            cmake_origin=toolchain.cmake.origin,
            cmake_from_pip=recipe.cmake_from_pip,
            recipe_name=recipe.name,
        )
        findings += [cmake] if cmake else []
        findings += gates.fetched_source_gates(
            facts.fetched_for(device, arch),
            recipe.fetched_sources,
            recipe.name,
            staged=staged_sources(project.root, recipe),
            fetch_command=f"forge fetch {distro.name} {recipe.target}",
        )
        if arch == "aarch64" and source_path is not None:
            plan_env = {**recipe.build_env, **isa_for(recipe.isa, arch)}
            findings += arm_gates(read_source_files(source_path), compile_env=plan_env, host_cpuinfo=_cpuinfo_text())
    if facts is not None and (compiles or gpu_wheel):
        python = gates.python_gates(
            facts, python=toolchain.python.value, python_origin=toolchain.python.origin, distro_name=distro.name
        )
        findings += [f for f in python if compiles or f.gate not in COMPILE_GATES]
    if target.installs_torch:
        findings += _torch_findings(facts, target, toolchain.python.value, wheelhouse, torch_index, torch_version)
    if target.runs_vllm:
        findings += _file_findings(distro, compiles, probe_result)
    if cuda is not None and compiles:
        findings.append(_nvcc_finding(distro, engine, toolchain, cuda))
        findings.append(_rsqrt_finding(distro, probe_result))

    disk, reserved = _disk_findings(recipe, engine, scratch_dir, host)
    findings += disk
    jobs, jobs_origin = _jobs(recipe, compiles, max_jobs, max(host.memory.available - reserved, 0), host.cores)
    if not gpu_wheel:
        findings.append(_ram_finding(recipe, host, jobs, jobs_origin, reserved))
    if target.cpu:
        findings.append(
            gates.isa_gate(
                isa=isa_for(recipe.isa, arch),
                arch=arch,
                build_flags=host.cpu_flags,
                run_flags=run_host_flags if run_host_flags is not None else host.cpu_flags,
                run_source=run_host_source or "build host /proc/cpuinfo",
                recipe_name=recipe.name,
                serve_test=recipe.serve_test,
            )
        )
        findings.append(
            gates.runtime_dtype_gate(
                arch=arch,
                run_flags=run_host_flags if run_host_flags is not None else host.cpu_flags,
                run_source=run_host_source or "build host /proc/cpuinfo",
            )
        )

    return PreflightReport.from_findings(
        findings,
        distro=distro.name,
        target=recipe.target,
        recipe=recipe.name,
        mode="probed" if probe_result else "declared",
        seconds=time.monotonic() - start,
        vllm_version=facts.vllm_version if facts else None,
        source=str(source_path) if source_path else None,
        max_jobs=jobs,
        probe_image=probe_result.image if probe_result else None,
    )


def _native_preflight(
    project: Project,
    distro: Distro,
    recipe: Recipe,
    *,
    engine: Engine | None,
    source: Path | None,
    max_jobs: int | None,
    scratch_dir: Path,
    run_flags: frozenset[str],
    run_source: str,
    host: HostFacts,
    fetch: bool,
    progress: Progress,
    start: float,
    local_sources: Mapping[str, Path],
) -> PreflightReport:
    """Another engine's gates come from its module, read from its own build files; disk and RAM are the same
    gates as every build's."""
    source_path, why = _source_or_fetch(project, recipe, source, fetch, progress)
    # The same order as vLLM's path: a tmpfs scratch dir's reservation comes off the RAM the jobs may use.
    disk, reserved = _disk_findings(recipe, engine, scratch_dir, host)
    jobs, jobs_origin = _jobs(recipe, True, max_jobs, max(host.memory.available - reserved, 0), host.cores)
    # Loaded by name, as the plan loads the engine's planner: engine packages import preflight, not the reverse.
    engine_preflight: Callable[[PreflightInputs], list[Finding]] = native_module(recipe).ENGINE.preflight
    findings = engine_preflight(
        PreflightInputs(
            distro=distro,
            recipe=recipe,
            host=host,
            source=source_path,
            source_why=why,
            max_jobs=jobs,
            run_flags=run_flags,
            run_source=run_source,
            local_sources=local_sources,
        )
    )
    findings += disk
    findings.append(_ram_finding(recipe, host, jobs, jobs_origin, reserved))
    return PreflightReport.from_findings(
        findings,
        distro=distro.name,
        target=recipe.target,
        recipe=recipe.name,
        mode="declared",
        seconds=time.monotonic() - start,
        source=str(source_path) if source_path else None,
        max_jobs=jobs,
    )


def _ram_finding(recipe: Recipe, host: HostFacts, jobs: int, jobs_origin: str, reserved: int) -> Finding:
    """RAM for the compile jobs: the same gate for every engine's build."""
    return gates.ram_gate(
        memory=host.memory,
        max_jobs=jobs,
        jobs_origin=jobs_origin,
        per_job_gb=recipe.resources.ram_per_job_gb,
        per_job_source=f"recipes/{recipe.name}.yaml: resources.ram_per_job_gb",
        cores=host.cores,
        reserved=reserved,
        reserved_why="the tmpfs scratch dir" if reserved else "",
    )


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
    max_source = f"CUDA {distro.cuda.version} → newest GCC table (builders/preflight/gates.py CUDA_MAX_GCC)"
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
