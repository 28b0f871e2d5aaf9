"""The gates: pure functions from facts (source, distro, recipe, host, probe) to findings.

No gate reads a file, calls an engine or the network; the runner gathers facts and hands them in, so each
gate is tested in milliseconds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from builders.config.models import FetchedSource
from builders.engines.vllm.source_facts import CompilerGate, FetchedDependency, SourceFacts
from builders.engines.vllm.torch_index import IndexListing, matching_wheels, pythons_offered, versions_offered
from builders.gates.findings import Finding, blocker, passed, unchecked, warning
from builders.gates.host import GIB
from builders.serving_dtype import NATIVE_BF16_FLAGS, CpuHost, choose_dtype


def _version(text: str) -> Version | None:
    match = re.match(r"\d+(?:\.\d+)*", text.strip())
    if not match:
        return None
    try:
        return Version(match.group(0))
    except InvalidVersion:
        return None


def _minimum(spec: str) -> str | None:
    try:
        for s in SpecifierSet(spec):
            if s.operator in {">=", ">"}:
                return s.version
    except InvalidSpecifier:
        return None
    return None


def _gb(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# --- compiler --------------------------------------------------------------------------------------------


def gcc_gates(
    facts: SourceFacts,
    *,
    gcc: str,
    gcc_origin: str,
    device: str,
    arch: str,
    distro_name: str,
    alternatives: Sequence[tuple[str, str]] = (),
    compiler_key: str = "compiler_enable",
) -> list[Finding]:
    """Each GCC gate of the source that applies to this device and arch, against the compiler the build uses.

    alternatives: (distro, its GCC) in order of preference, offered when the gate fails.
    """
    out: list[Finding] = []
    for gate in facts.gates_for(device, arch):
        out.append(
            _gcc_gate(
                gate,
                gcc=gcc,
                gcc_origin=gcc_origin,
                distro_name=distro_name,
                alternatives=alternatives,
                compiler_key=compiler_key,
            )
        )
    return out


def _gcc_gate(
    gate: CompilerGate,
    *,
    gcc: str,
    gcc_origin: str,
    distro_name: str,
    alternatives: Sequence[tuple[str, str]],
    compiler_key: str,
) -> Finding:
    found = f"GCC {gcc}"
    first_sentence = gate.message.split(". ", 1)[0].rstrip(".")
    what = f"vLLM's GCC gate for {gate.scope.label} targets: “{first_sentence}”"
    version = _version(gcc)
    if version is not None and gate.admits(str(version)):
        return passed("gcc", found, gate.required, gate.source, f"{what}; {found} from {gcc_origin}")
    better = [
        f"{name} (GCC {v})"
        for name, v in alternatives
        if name != distro_name and (pv := _version(v)) is not None and gate.admits(str(pv))
    ][:2]
    minimum = _minimum(gate.specifier) or gate.specifier
    remedy = (f"use {' or '.join(better)}, or " if better else "") + (
        f"a newer compiler: install GCC {minimum} or later and declare it as {compiler_key} in "
        f"distros/{distro_name}.yaml"
    )
    return blocker(
        "gcc",
        found,
        gate.required,
        gate.source,
        remedy,
        f"{what}; {found} from {gcc_origin} fails it, so CMake would stop at configure",
    )


# CUDA release → newest GCC major its nvcc accepts: the N of crt/host_config.h's `#if __GNUC__ > N`, whose
# #error reads "unsupported GNU version! gcc versions later than N are not supported!". nvcc 13.0's own header
# says 15 (read from a real 13.0 toolkit); the installation guides' tables lag behind the header. Used only
# when no CUDA base is at hand to read host_config.h from.
CUDA_MAX_GCC: tuple[tuple[tuple[int, int], int], ...] = (
    ((11, 0), 9),
    ((11, 1), 10),
    ((11, 4), 11),
    ((12, 0), 12),
    ((12, 4), 13),
    ((12, 8), 14),
    ((13, 0), 15),
)
# Packages that bring an older GCC beside the default one, per family, for the remedy.
OLDER_GCC_PACKAGES = {
    "fedora": "gcc{n} gcc{n}-c++",
    "ubi": "gcc-toolset-{n}-gcc gcc-toolset-{n}-gcc-c++",
    "debian": "gcc-{n} g++-{n}",
    "ubuntu": "gcc-{n} g++-{n}",
}
OLDER_GXX_PATH = {
    "fedora": "/usr/bin/g++-{n}",
    "ubi": "/opt/rh/gcc-toolset-{n}/root/usr/bin/g++",
    "debian": "/usr/bin/g++-{n}",
    "ubuntu": "/usr/bin/g++-{n}",
}


def max_gcc_for_cuda(cuda_version: str) -> int | None:
    match = re.match(r"(\d+)\.(\d+)", cuda_version)
    if not match:
        return None
    key = (int(match.group(1)), int(match.group(2)))
    best = None
    for release, gcc in CUDA_MAX_GCC:
        if release <= key:
            best = gcc
    return best


def max_gcc_from_host_config(text: str) -> int | None:
    """The N in host_config.h's `#if __GNUC__ > N` that rejects newer GCCs.

    The header compares __GNUC__ in more than one place; the limit is the comparison whose #error follows
    (`unsupported GNU version!`), else the first one."""
    guards = list(re.finditer(r"#\s*if\s+__GNUC__\s*>\s*(\d+)", text))
    for guard in guards:
        following = text[guard.end() : guard.end() + 400]
        error = re.search(r"#\s*(error|endif)", following)
        line = following[error.start() :].split("\n", 1)[0] if error else ""
        if error and error.group(1) == "error" and "unsupported GNU version" in line:
            return int(guard.group(1))
    return int(guards[0].group(1)) if guards else None


def nvcc_host_gcc_gate(
    *,
    cuda_version: str,
    host_gcc: str,
    host_gcc_origin: str,
    max_major: int | None,
    max_source: str,
    family: str,
    distro_name: str,
) -> Finding:
    found = f"GCC {host_gcc} as nvcc's host compiler"
    if max_major is None:
        return unchecked(
            "nvcc-host-gcc",
            found,
            "unknown",
            max_source,
            f"check CUDA {cuda_version}'s crt/host_config.h for the newest GCC it accepts",
            f"no known host-compiler limit for CUDA {cuda_version}",
        )
    required = f"GCC ≤ {max_major}.x (CUDA {cuda_version})"
    version = _version(host_gcc)
    if version is not None and version.major <= max_major:
        return passed("nvcc-host-gcc", found, required, max_source, f"{found} from {host_gcc_origin}")
    pkgs = OLDER_GCC_PACKAGES.get(family, "gcc-{n} g++-{n}").format(n=max_major)
    gxx = OLDER_GXX_PATH.get(family, "/usr/bin/g++-{n}").format(n=max_major)
    remedy = (
        f"install {pkgs} compat packages (or an older GCC's) and set CUDAHOSTCXX={gxx}: declare them as "
        f"cuda.host_compiler in distros/{distro_name}.yaml"
    )
    return blocker(
        "nvcc-host-gcc",
        found,
        required,
        max_source,
        remedy,
        f"nvcc {cuda_version} rejects GCC newer than {max_major} (`unsupported GNU version!`); "
        f"{found} from {host_gcc_origin}",
    )


# glibc 2.42 declares the C23 rsqrt and rsqrtf in bits/mathcalls.h (line 206 in 2.42 and 2.43), __THROW (noexcept
# in C++); nvcc 13.0's crt/math_functions.h (lines 629 and 653) declares the same functions without an exception
# specification, so every .cu that includes <cmath> stops with the error below. No release after 13.0 is assumed
# affected: raise CUDA_RSQRT_LAST when one is seen failing the same way.
GLIBC_RSQRT_FIRST = (2, 42)
CUDA_RSQRT_LAST = (13, 0)
RSQRT_SOURCE = "crt/math_functions.h:629,653 (CUDA {cuda}) vs bits/mathcalls.h:206 (glibc {glibc})"
RSQRT_ERROR = 'error: exception specification is incompatible with that of previous function "rsqrt"'


def _major_minor(text: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", text.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def glibc_rsqrt_gate(
    *, cuda_version: str, glibc: str, glibc_origin: str, fix_declared: bool, distro_name: str
) -> Finding:
    """nvcc's own headers against the distro's glibc headers: a clash no compiler choice avoids."""
    found = f"glibc {glibc} with CUDA {cuda_version}"
    required = (
        f"glibc < {'.'.join(map(str, GLIBC_RSQRT_FIRST))}, CUDA > {'.'.join(map(str, CUDA_RSQRT_LAST))}, or the fix"
    )
    source = RSQRT_SOURCE.format(cuda=cuda_version, glibc=glibc)
    yaml_key = f"cuda.glibc_rsqrt_fix in distros/{distro_name}.yaml"
    g, c = _major_minor(glibc), _major_minor(cuda_version)
    if g is None or c is None:
        return unchecked(
            "cuda-glibc-rsqrt",
            found,
            required,
            source,
            f"check whether nvcc stops at `{RSQRT_ERROR}`; if it does, set {yaml_key}",
            f"versions not understood (glibc from {glibc_origin})",
        )
    if g < GLIBC_RSQRT_FIRST or c > CUDA_RSQRT_LAST:
        return passed("cuda-glibc-rsqrt", found, required, source, f"no rsqrt clash (glibc from {glibc_origin})")
    if fix_declared:
        return passed(
            "cuda-glibc-rsqrt",
            found,
            required,
            source,
            f"{yaml_key} is set: the build declares rsqrt/rsqrtf as glibc does before compiling",
        )
    return blocker(
        "cuda-glibc-rsqrt",
        found,
        required,
        source,
        f"set {yaml_key} (the build then gives CUDA's rsqrt/rsqrtf glibc's exception specification), "
        "use a CUDA base newer than 13.0, or a distro whose glibc is older than 2.42",
        f"every .cu file would stop at `{RSQRT_ERROR}` (glibc from {glibc_origin})",
    )


# --- cmake, python ---------------------------------------------------------------------------------------


def cmake_gate(
    facts: SourceFacts, *, cmake: str, cmake_origin: str, cmake_from_pip: bool, recipe_name: str
) -> Finding | None:
    gate = facts.cmake_minimum
    pip_req = facts.cmake_requirement.value if facts.cmake_requirement else None
    if gate is None:
        if pip_req is None:
            return None
        minimum = _minimum(pip_req.split("cmake", 1)[-1]) or "?"
        source = facts.cmake_requirement.source if facts.cmake_requirement else ""
    else:
        minimum, source = gate.value, gate.source
    pip_req = pip_req or f"cmake>={minimum}"
    found = f"CMake {cmake}"
    required = f"≥ {minimum}"
    version, needed = _version(cmake), _version(minimum)
    if version is not None and needed is not None and version >= needed:
        return passed("cmake", found, required, source, f"cmake_minimum_required; {found} from {cmake_origin}")
    why = f"{found} from {cmake_origin} is older than cmake_minimum_required({minimum})"
    if cmake_from_pip:
        return warning(
            "cmake",
            found,
            required,
            source,
            f"applied automatically: recipes/{recipe_name}.yaml has cmake_from_pip: true, so the build "
            f'runs pip install "{pip_req}"',
            why,
        )
    return blocker(
        "cmake",
        found,
        required,
        source,
        f'pip install "{pip_req}" in the build: pass --cmake-from-pip (or set cmake_from_pip: true in '
        f"recipes/{recipe_name}.yaml for every build), or use a distro whose CMake is ≥ {minimum}",
        why,
    )


def python_gates(facts: SourceFacts, *, python: str, python_origin: str, distro_name: str) -> list[Finding]:
    out: list[Finding] = []
    found = f"Python {python}"
    remedy = (
        f"use a distro whose Python is supported, or point python_executable in distros/{distro_name}.yaml "
        "at a newer interpreter (python3.12 on UBI 9)"
    )
    if facts.requires_python:
        spec = facts.requires_python.value
        try:
            ok = SpecifierSet(spec).contains(python, prereleases=True)
        except InvalidSpecifier:
            ok = True
        if ok:
            out.append(passed("python", found, spec, facts.requires_python.source, f"{found} from {python_origin}"))
        else:
            out.append(
                blocker(
                    "python",
                    found,
                    spec,
                    facts.requires_python.source,
                    remedy,
                    f"vLLM's requires-python excludes {found} from {python_origin}",
                )
            )
    if facts.python_supported:
        supported = facts.python_supported.value.split()
        required = "one of " + ", ".join(supported)
        short = ".".join(python.split(".")[:2])
        if short in supported:
            out.append(
                passed(
                    "python-cmake",
                    found,
                    required,
                    facts.python_supported.source,
                    "PYTHON_SUPPORTED_VERSIONS, checked by CMake at configure",
                )
            )
        else:
            out.append(
                blocker(
                    "python-cmake",
                    found,
                    required,
                    facts.python_supported.source,
                    remedy,
                    "CMake's find_python_from_executable rejects interpreters outside this list",
                )
            )
    return out


# --- torch -----------------------------------------------------------------------------------------------


def torch_wheel_gate(
    *,
    version: str,
    pin_source: str,
    python: str,
    arch: str,
    index_name: str,
    listing: IndexListing,
    recipe_name: str,
    glibc: str | None = None,
) -> Finding:
    cp = "cp" + python.replace(".", "")
    required = f"torch=={version} wheel for {cp} {arch}"
    other_indexes = "pypi or wheelhouse" if index_name.startswith("pytorch") else "another index"
    if not listing.reachable:
        return unchecked(
            "torch-wheel",
            f"index unreachable: {listing.error}",
            required,
            pin_source,
            f"not checked, not passed: make {listing.url} reachable from the build, or pass --torch-index "
            f"({other_indexes}; torch.index in recipes/{recipe_name}.yaml makes it the default)",
            f"could not ask {index_name} ({listing.url}) for torch {version}",
        )
    wheels = matching_wheels(listing.files, project="torch", version=version, python=python, arch=arch, glibc=glibc)
    if wheels:
        return passed(
            "torch-wheel",
            f"{len(wheels)} wheel(s) on {index_name}: {wheels[0]}",
            required,
            pin_source,
            f"asked {listing.url}",
        )
    offered = pythons_offered(listing.files, project="torch", version=version, arch=arch)
    if offered:
        found = f"torch {version} on {index_name} only for {', '.join(offered)} ({arch})"
        remedy = f"use a distro whose Python is one of {', '.join(offered)}, or another torch version"
    else:
        versions = versions_offered(listing.files, "torch")
        newest = ", ".join(versions[-3:]) or "none"
        found = f"no torch {version} for {arch} on {index_name} (newest: {newest})"
        remedy = (
            "pass --torch-version with one that exists, or --torch-index pypi / pytorch-cpu (PyPI has no +cpu "
            f"local versions; PyTorch's own index does); torch.version and torch.index in recipes/{recipe_name}.yaml "
            "make it the default"
        )
    return blocker("torch-wheel", found, required, pin_source, remedy, f"asked {listing.url}")


# --- files in the base -----------------------------------------------------------------------------------


def file_gate(
    *, gate: str, path: str, present: bool | None, packages: Sequence[str], origin: str, yaml_key: str, distro_name: str
) -> Finding:
    pkgs = " ".join(packages) or "(none)"
    source = f"distros/{distro_name}.yaml: {yaml_key}"
    if present is None:
        return unchecked(
            gate,
            f"not probed: declared {pkgs}",
            path,
            source,
            f"load or bootstrap the base (`forge bootstrap {distro_name}`) and rerun to check the real archive",
            "the base image was not at hand, so nobody looked for the file",
        )
    if present:
        return passed(gate, f"{path} shipped by {pkgs}", path, source, f"checked in {origin}'s archive")
    return blocker(
        gate,
        f"{path} not shipped by {pkgs}",
        path,
        source,
        f"fix {yaml_key} in distros/{distro_name}.yaml to the package (or path) that provides it",
        f"checked in {origin}'s archive",
    )


# --- ISA -------------------------------------------------------------------------------------------------

# Recipe ISA settings → /proc/cpuinfo flags the built kernels then execute unconditionally.
ISA_SETTING_FLAGS: dict[str, tuple[str, ...]] = {
    "VLLM_CPU_AVX2": ("avx2",),
    "VLLM_CPU_AVX512": ("avx512f", "avx512vl", "avx512bw", "avx512dq"),
    "VLLM_CPU_AVX512BF16": ("avx512_bf16",),
    "VLLM_CPU_AVX512VNNI": ("avx512_vnni",),
    "VLLM_CPU_AMXBF16": ("amx_bf16", "amx_tile"),
    # Cross-compiles every x86 variant, chosen at run time: needs only the x86 floor below.
    "VLLM_CPU_X86": (),
    "VLLM_CPU_ARM_BF16": ("bf16",),
    "VLLM_CPU_ARM_I8MM": ("i8mm",),
}
# vLLM's x86 CPU image dispatches at run time between AMX, AVX512 and AVX2 kernels (vllm/platforms/cpu.py
# import_kernels); the AVX2 variant (-mavx2 -mf16c) is the floor every run host needs.
ISA_FLOOR: dict[str, tuple[str, ...]] = {"x86_64": ("avx2", "f16c")}


def _enabled(value: str) -> bool:
    return value.strip().lower() in {"1", "true", "on", "yes"}


def isa_gate(
    *,
    isa: Mapping[str, str],
    arch: str,
    build_flags: frozenset[str],
    run_flags: frozenset[str],
    run_source: str,
    recipe_name: str,
    serve_test: bool,
) -> Finding:
    settings = {k: v for k, v in isa.items() if _enabled(v)}
    unknown = [k for k in settings if k not in ISA_SETTING_FLAGS]
    needed = set(ISA_FLOOR.get(arch, ()))
    for key in settings:
        needed |= set(ISA_SETTING_FLAGS.get(key, ()))
    source = f"recipes/{recipe_name}.yaml: isa" if settings else "vllm/platforms/cpu.py run-time dispatch"
    found_settings = ", ".join(f"{k}={v}" for k, v in isa.items()) or "no ISA settings"
    required = " ".join(sorted(needed)) or "none"
    if unknown:
        return warning(
            "isa",
            found_settings,
            required,
            source,
            f"check {', '.join(unknown)}: preflight does not know which instructions it enables",
            "unknown ISA setting",
        )
    missing_run = sorted(needed - run_flags) if run_flags else []
    missing_build = sorted(needed - build_flags) if build_flags else []
    if missing_run:
        return warning(
            "isa",
            f"run host ({run_source}) lacks {' '.join(missing_run)}",
            required,
            source,
            f"drop the settings needing {' '.join(missing_run)} from recipes/{recipe_name}.yaml isa, "
            "or run the image on a CPU that has them",
            f"the image would execute instructions the run host lacks ({found_settings})",
        )
    if missing_build and serve_test:
        return warning(
            "isa",
            f"build host lacks {' '.join(missing_build)}",
            required,
            source,
            "the image's test stage runs on the build host: build where the CPU has them, "
            f"or set serve_test: false in recipes/{recipe_name}.yaml",
            f"the test stage would hit illegal instructions ({found_settings})",
        )
    return passed("isa", found_settings, required, source, f"run host flags from {run_source}")


def runtime_dtype_gate(*, arch: str, run_flags: frozenset[str], run_source: str) -> Finding:
    """Which dtype the run host's replicas will serve (builders/serving_dtype.py), said before the build:
    bfloat16 with native BF16, float32 without it, never a silent fifty-fold slowdown."""
    needed = " or ".join(NATIVE_BF16_FLAGS.get(arch, ("bf16",)))
    required = f"{needed} for bfloat16 serving"
    source = f"run host {run_source}; builders/serving_dtype.py NATIVE_BF16_FLAGS"
    if not run_flags:
        # As the ISA gate: nothing to judge; the replicas make the same choice when they start.
        return passed("runtime-dtype", "no CPU flags read", required, source, "the replicas choose when they start")
    choice = choose_dtype("auto", CpuHost(arch=arch, model="the run host", flags=run_flags, source=run_source))
    found = " ".join(choice.host.bf16_flags) or f"none of {needed}"
    return passed("runtime-dtype", found, required, source, f"replicas serve {choice.dtype} ({choice.reason})")


# --- fetched sources -------------------------------------------------------------------------------------


def fetched_source_gates(
    deps: Sequence[FetchedDependency],
    declared: Sequence[FetchedSource],
    recipe_name: str,
    *,
    staged: Mapping[str, str],
    fetch_command: str = "forge fetch DISTRO TARGET",
) -> list[Finding]:
    """staged: declared source name → where its local copy comes from (cache, recipe path), for those that
    have one now. Declared is not staged: the build would stop at its sources phase."""
    out: list[Finding] = []
    by_var = {d.cmake_var: d for d in declared}
    for dep in deps:
        what = f"{dep.name} {dep.tag or ''}".strip()
        required = f"{what} staged locally ({dep.override_var})"
        mine = by_var.get(dep.override_var)
        if mine is None:
            out.append(
                warning(
                    "fetched-source",
                    f"CMake would clone {dep.repository} during the build",
                    required,
                    dep.source,
                    f"add {dep.name} to fetched_sources in recipes/{recipe_name}.yaml (cmake_var {dep.override_var}) "
                    "so `forge fetch` stages it; build hosts often cannot reach GitHub",
                    "the build's network access decides whether this works",
                )
            )
        elif dep.override_honoured_at is None:
            out.append(
                warning(
                    "fetched-source",
                    f"source never reads $ENV{{{dep.override_var}}}",
                    required,
                    dep.source,
                    f"pass -D{dep.override_var}=<dir> in CMAKE_ARGS instead of the environment",
                    "the staged copy would be ignored and CMake would clone from the network",
                )
            )
        elif mine.name not in staged:
            out.append(
                warning(
                    "fetched-source",
                    f"{mine.name} declared but not staged: no local copy yet",
                    required,
                    dep.source,
                    f"`{fetch_command} {mine.name}` stores it, or `forge build … --source {mine.name}=PATH` "
                    "points at a checkout",
                    "the build stops at its sources phase without it",
                )
            )
        else:
            out.append(
                passed(
                    "fetched-source",
                    f"{mine.name} staged ({staged[mine.name]})",
                    required,
                    dep.source,
                    f"read from the environment at {dep.override_honoured_at}",
                )
            )
    return out


# --- declared vs probed ----------------------------------------------------------------------------------


def _agrees(declared: str, probed: str) -> bool:
    want = declared.split(".")
    have = probed.split(".")
    return have[: len(want)] == want


def declared_vs_probed(
    *, distro_name: str, declared: Mapping[str, str], probed: Mapping[str, tuple[str, str]]
) -> list[Finding]:
    """A YAML fact the real base contradicts is worth knowing, though the probe's number is what the gates use."""
    out: list[Finding] = []
    for key, want in declared.items():
        if key not in probed:
            continue
        have, how = probed[key]
        numeric = _version(have)
        short = ".".join(str(p) for p in numeric.release[: len(want.split("."))]) if numeric else have
        source = f"distros/{distro_name}.yaml: {key}"
        if _agrees(want, short):
            out.append(passed("declared-vs-probed", f"{key} {have} ({how})", f"declared {want}", source))
        else:
            out.append(
                warning(
                    "declared-vs-probed",
                    f"{key} {have} ({how})",
                    f"declared {want}",
                    source,
                    f"update {key} in distros/{distro_name}.yaml to {short}",
                    "the gates use the probed version",
                )
            )
    return out


# --- distro file problems the probe or the target reveals ------------------------------------------------


def missing_package_gate(package: str, role: str, distro_name: str, image: str) -> Finding:
    return blocker(
        "package",
        f"{package}: no installation candidate in {image}",
        f"{package} installable",
        f"distros/{distro_name}.yaml: packages.{role}",
        f"fix packages.{role} in distros/{distro_name}.yaml (look the name up with apt-cache search / dnf search)",
        "the build's package install step would fail",
    )


def no_cuda_gate(distro_name: str) -> Finding:
    return blocker(
        "cuda",
        "no cuda section",
        "cuda: base_image, version",
        f"distros/{distro_name}.yaml",
        f"add a cuda section to distros/{distro_name}.yaml, or build a CPU target on it",
        "a CUDA target needs a CUDA toolkit base for this distro",
    )
