"""llama.cpp's preflight gates, read from its own CMake in the pinned sdist and cited by file and line.

- cmake: `cmake_minimum_required(VERSION x...y)` of the top CMakeLists.txt against the distro's CMake;
- compiler: the C/C++ standards ggml/CMakeLists.txt sets (REQUIRED) against the GCC the build uses;
- isa-options: every ISA option the recipe passes is an `option(GGML_…)` of this llama.cpp's ggml/CMakeLists.txt;
- isa: the instruction sets those options compile in are on the CPU that runs the image (its test stage here).
"""

from __future__ import annotations

import re
from pathlib import Path

from builders.engines.llama_cpp.tree import GGML_ISA_FLAGS, VENDORED, read_member
from builders.engines.sdist import find_line
from builders.gates.context import PreflightContext
from builders.gates.findings import Finding, blocker, passed, unchecked, warning

# The oldest GCC whose libstdc++ gives a C++ standard in full, <filesystem> included without -lstdc++fs (GCC 9
# release notes); llama.cpp's common library and server use std::filesystem.
GCC_FOR_CXX = {17: 9, 20: 11, 23: 13}
GATES = ("cmake", "compiler", "isa-options", "isa")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def _cite(sdist: Path, relative: str, line: int) -> str:
    return f"{sdist.name}: {VENDORED}/{relative}:{line}"


def preflight(inputs: PreflightContext) -> list[Finding]:
    recipe, distro, sdist = inputs.recipe, inputs.distro, inputs.source
    if sdist is None:
        return [
            unchecked(
                gate,
                f"not evaluated: {inputs.source_why}",
                "read from llama.cpp's CMake",
                f"recipes/{recipe.name}.yaml: source.pypi",
                f"run `forge fetch {distro.name} {recipe.target}` (or let the build fetch it), then preflight again",
            )
            for gate in GATES
        ]
    top = read_member(sdist, "CMakeLists.txt")
    ggml = read_member(sdist, "ggml/CMakeLists.txt")
    return [
        _cmake_gate(inputs, sdist, top),
        _compiler_gate(inputs, sdist, ggml),
        *_isa_gates(inputs, sdist, ggml),
    ]


def _cmake_gate(inputs: PreflightContext, sdist: Path, text: str) -> Finding:
    distro = inputs.distro
    found_at = find_line(text, r"cmake_minimum_required\s*\(\s*VERSION\s+(\d+(?:\.\d+)*)")
    if found_at is None:
        return unchecked(
            "cmake",
            "not evaluated: no cmake_minimum_required in the top CMakeLists.txt",
            "≥ llama.cpp's minimum",
            f"{sdist.name}: {VENDORED}/CMakeLists.txt",
            "read the tree's CMakeLists.txt; Forge's reader needs updating for this release",
        )
    line, match = found_at
    minimum, cmake = match.group(1), distro.toolchain.cmake
    source = _cite(sdist, "CMakeLists.txt", line)
    found, required = f"CMake {cmake}", f"≥ {minimum}"
    if _version(cmake) >= _version(minimum):
        return passed(
            "cmake", found, required, source, f"cmake_minimum_required; {found} from distros/{distro.name}.yaml"
        )
    return blocker(
        "cmake",
        found,
        required,
        source,
        f"use a distro whose CMake is ≥ {minimum}, or install a newer CMake in the toolchain stage",
        f"{found} from distros/{distro.name}.yaml is older than cmake_minimum_required({minimum})",
    )


def _compiler_gate(inputs: PreflightContext, sdist: Path, text: str) -> Finding:
    distro = inputs.distro
    found_at = find_line(text, r"set\s*\(\s*CMAKE_CXX_STANDARD\s+(\d+)\s*\)")
    if found_at is None:
        return unchecked(
            "compiler",
            "not evaluated: ggml/CMakeLists.txt sets no CMAKE_CXX_STANDARD",
            "a C++ compiler for llama.cpp's standard",
            f"{sdist.name}: {VENDORED}/ggml/CMakeLists.txt",
            "read the tree's ggml/CMakeLists.txt; Forge's reader needs updating for this release",
        )
    line, match = found_at
    standard = int(match.group(1))
    needed = GCC_FOR_CXX.get(standard)
    enable = distro.compiler_enable
    gcc, origin = (
        (enable.gcc, f"distros/{distro.name}.yaml: compiler_enable")
        if enable
        else (distro.toolchain.gcc, f"distros/{distro.name}.yaml: toolchain.gcc")
    )
    source = _cite(sdist, "ggml/CMakeLists.txt", line)
    found = f"GCC {gcc}"
    if needed is None:
        return warning(
            "compiler",
            found,
            f"C++{standard}",
            source,
            f"add C++{standard} to GCC_FOR_CXX in builders/engines/llama_cpp/gates.py",
            f"Forge has no GCC minimum on record for C++{standard}",
        )
    required = f"≥ {needed} (C++{standard}, CMAKE_CXX_STANDARD_REQUIRED)"
    if _version(gcc)[:1] >= (needed,):
        return passed("compiler", found, required, source, f"C++{standard} with {found} from {origin}")
    return blocker(
        "compiler",
        found,
        required,
        source,
        f"enable a newer GCC (compiler_enable in distros/{distro.name}.yaml), or use a newer distro",
        f"llama.cpp requires C++{standard}; {found} from {origin} predates GCC {needed}",
    )


def _isa_gates(inputs: PreflightContext, sdist: Path, text: str) -> list[Finding]:
    recipe = inputs.recipe
    enabled = [key for key, value in recipe.isa.items() if value == "ON"]
    out: list[Finding] = []
    missing_options: list[str] = []
    cited: list[str] = []
    for key in [*enabled, "GGML_NATIVE"]:
        found_at = find_line(text, rf"option\s*\(\s*{key}\s")
        if found_at is None:
            missing_options.append(key)
        else:
            cited.append(f"{key}:{found_at[0]}")
    where = f"{sdist.name}: {VENDORED}/ggml/CMakeLists.txt"
    if missing_options:
        out.append(
            blocker(
                "isa-options",
                f"no option({', '.join(missing_options)}) in this llama.cpp",
                "every ISA option the recipe passes exists",
                where,
                f"drop or rename {missing_options[0]} in recipes/{recipe.name}.yaml isa",
                "CMake would ignore an unknown option, and the binary would be built without that instruction set",
            )
        )
    else:
        out.append(
            passed(
                "isa-options",
                f"GGML_NATIVE=OFF; ON: {' '.join(k.removeprefix('GGML_') for k in enabled) or 'none'}",
                "options of ggml's CPU backend",
                f"{where} lines {', '.join(cited)}",
                "the build host's CPU does not choose the instruction sets: GGML_NATIVE is OFF",
            )
        )
    needed = sorted({flag for key in enabled for flag in GGML_ISA_FLAGS[key]})
    lacking = [flag for flag in needed if flag not in inputs.run_flags]
    found = f"{inputs.run_source}: {'lacks ' + ', '.join(lacking) if lacking else 'has ' + ', '.join(needed)}"
    required = ", ".join(needed) or "none"
    source = f"recipes/{recipe.name}.yaml: isa (GGML options compile these instruction sets in unconditionally)"
    if not lacking:
        out.append(passed("isa", found, required, source, "the image's llama-server runs on this CPU"))
    elif recipe.serve_test:
        out.append(
            blocker(
                "isa",
                found,
                required,
                source,
                f"turn {', '.join(k for k in enabled if set(GGML_ISA_FLAGS[k]) & set(lacking))} OFF in "
                f"recipes/{recipe.name}.yaml isa, or build where the image will run",
                "the test stage would die with SIGILL (illegal instruction) on this CPU",
            )
        )
    else:
        out.append(
            warning(
                "isa",
                found,
                required,
                source,
                "run the image only on CPUs with these instruction sets",
                "this CPU cannot run the image",
            )
        )
    return out
