"""sgl-kernel's CPU kernels: the commit Forge pins, and what a checkout of it states about itself.

No PyPI release of `sgl-kernel` or `sglang-kernel` carries an sdist, so the kernels' source is a checkout of
sgl-project/sglang that the user passes (`--source sgl-kernel=PATH`). The pin is the commit that bumped sgl-kernel
to the version the pinned `sglang` sdist requires (0.5.10.post1's pyproject.toml: `sglang-kernel==0.4.1`), the
last release of SGLang with an sdist on PyPI. Later releases (0.5.11 on) ship wheels only, and their kernels moved
out of sgl-kernel/ into the sglang tree (python/sglang/kernels/aot/csrc/cpu), so a checkout of a later commit is
recognised by that layout and refused with the commit to check out instead.

What is pinned here as data was read at COMMIT; with a checkout at hand, preflight reads the same facts from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from builders.engines.sdist import find_line
from builders.errors import SourceUnavailable

NAME = "sgl-kernel"
REPOSITORY = "sgl-project/sglang"
COMMIT = "2c4fb88929c8e5d8d407c0d4b3c7111d9b824122"
VERSION = "0.4.1"
PINNED = f"{REPOSITORY}@{COMMIT}"

CPU_PROJECT = "pyproject_cpu.toml"
CPU_CMAKE = "csrc/cpu/CMakeLists.txt"
VEC_HEADER = "csrc/cpu/vec.h"
VERSION_FILE = "python/sgl_kernel/version.py"
# Where the kernels live from sglang 0.5.11 on (no sdist on PyPI): in the sglang tree, beside its Python package.
MOVED_CPU_CMAKE = "python/sglang/kernels/aot/csrc/cpu/CMakeLists.txt"

# At COMMIT: csrc/cpu/vec.h:3 defines CPU_CAPABILITY_AVX512 only under these macros, and without it the GEMM's
# scalar path raises "not implemented" at run time (csrc/cpu/gemm.cpp:209); csrc/cpu/CMakeLists.txt:90 compiles
# with -march=native, so the build host's CPU defines them or not.
PINNED_ISA_LINE = 3
PINNED_MARCH_LINE = 90
PINNED_ISA_MACROS = ("__AVX512F__", "__AVX512BF16__", "__AMX_BF16__")
# The /proc/cpuinfo flag each macro needs under -march=native (GCC defines the macro when the CPU has the flag).
MACRO_FLAGS = {
    "__AVX512F__": "avx512f",
    "__AVX512BW__": "avx512bw",
    "__AVX512VL__": "avx512vl",
    "__AVX512DQ__": "avx512dq",
    "__AVX512BF16__": "avx512_bf16",
    "__AVX512FP16__": "avx512_fp16",
    "__AVX512VNNI__": "avx512_vnni",
    "__AMX_TILE__": "amx_tile",
    "__AMX_BF16__": "amx_bf16",
    "__AMX_INT8__": "amx_int8",
}

_ISA_CONDITION = re.compile(r"^#if\s+(.*defined\(__\w+__\).*)$")
_MACRO = re.compile(r"defined\((__\w+__)\)")
_VERSION = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""")
_TORCH_PIN = re.compile(r"""["']torch==([^"';\s]+)["']""")


@dataclass(frozen=True, kw_only=True)
class Cited:
    """A value read from a file of the checkout, with where: `sgl-kernel/csrc/cpu/vec.h:3`."""

    value: str
    where: str


@dataclass(frozen=True, kw_only=True)
class KernelCheckout:
    """What a checkout's sgl-kernel/ states: its version, the torch its CPU project builds against, and the CPU
    macros its vectorised kernels need. A field is None where the checkout does not state it."""

    root: Path
    version: Cited | None
    torch: Cited | None
    isa_macros: tuple[str, ...]
    isa_where: str | None
    march_where: str | None


def cited(relative: str, line: int) -> str:
    return f"{PINNED} sgl-kernel/{relative}:{line}"


def pinned_isa_source() -> str:
    return (
        f"{cited(VEC_HEADER, PINNED_ISA_LINE)} (CPU_CAPABILITY_AVX512 needs {' && '.join(PINNED_ISA_MACROS)}) and "
        f"{CPU_CMAKE}:{PINNED_MARCH_LINE} (-march=native)"
    )


def flags_for(macros: tuple[str, ...]) -> tuple[str, ...]:
    """The cpuinfo flags under which GCC's -march=native defines `macros`; a macro Forge has no flag for is
    named as is, so it can never pass silently."""
    return tuple(MACRO_FLAGS.get(m, m) for m in macros)


def kernel_dir(path: Path) -> Path:
    """The sgl-kernel/ folder of `path`: the folder itself or a checkout's root holding it.

    Raises SourceUnavailable naming what the path holds instead: nothing, or the later layout."""
    if not path.is_dir():
        raise SourceUnavailable(f"--source {NAME}={path}: not a directory", hint=checkout_hint())
    for candidate in (path, path / "sgl-kernel"):
        if (candidate / CPU_CMAKE).is_file() and (candidate / CPU_PROJECT).is_file():
            return candidate
    if (path / MOVED_CPU_CMAKE).is_file():
        raise SourceUnavailable(
            f"--source {NAME}={path}: this checkout has the kernels in {MOVED_CPU_CMAKE.rsplit('/', 1)[0]}/, the "
            "layout of sglang 0.5.11 and later, which PyPI publishes as wheels only; the pinned sglang sdist "
            f"({VERSION}'s kernels) needs sgl-kernel/{CPU_CMAKE} from {PINNED}",
            hint=checkout_hint(),
        )
    raise SourceUnavailable(
        f"--source {NAME}={path}: neither it nor its sgl-kernel/ holds {CPU_CMAKE} and {CPU_PROJECT}",
        hint=checkout_hint(),
    )


def checkout_hint() -> str:
    return (
        f"check out {REPOSITORY} at {COMMIT} (sgl-kernel {VERSION}) and pass --source {NAME}=PATH, PATH being "
        "the checkout's root or its sgl-kernel/ folder"
    )


def _read(root: Path, relative: str) -> str | None:
    path = root / relative
    if not path.is_file():
        return None
    # Bounded: these are small text files; a 1 MiB cap keeps a wrong path from being read whole.
    with path.open("rb") as fh:
        return fh.read(1 << 20).decode("utf-8", errors="replace")


def read_checkout(path: Path) -> KernelCheckout:
    """Read the facts preflight checks from a checkout (`path`: its root or its sgl-kernel/ folder)."""
    root = kernel_dir(path)
    version = torch = None
    text = _read(root, VERSION_FILE)
    hit = find_line(text, _VERSION.pattern) if text else None
    if hit:
        version = Cited(value=hit[1].group(1), where=f"sgl-kernel/{VERSION_FILE}:{hit[0]}")
    text = _read(root, CPU_PROJECT)
    hit = find_line(text, _TORCH_PIN.pattern) if text else None
    if hit:
        torch = Cited(value=hit[1].group(1), where=f"sgl-kernel/{CPU_PROJECT}:{hit[0]}")
    macros: tuple[str, ...] = ()
    isa_where = None
    text = _read(root, VEC_HEADER)
    if text:
        lines = text.splitlines()
        for number, line in enumerate(lines, start=1):
            condition = _ISA_CONDITION.match(line.strip())
            following = lines[number].strip() if number < len(lines) else ""
            if condition and following == "#define CPU_CAPABILITY_AVX512":
                macros = tuple(_MACRO.findall(condition.group(1)))
                isa_where = f"sgl-kernel/{VEC_HEADER}:{number}"
                break
    text = _read(root, CPU_CMAKE)
    hit = find_line(text, r"-march=native") if text else None
    march_where = f"sgl-kernel/{CPU_CMAKE}:{hit[0]}" if hit else None
    return KernelCheckout(
        root=root, version=version, torch=torch, isa_macros=macros, isa_where=isa_where, march_where=march_where
    )


def required_version(pyproject: str) -> tuple[str, int] | None:
    """The sglang-kernel (or sgl-kernel) version an sglang pyproject.toml pins, and its line."""
    hit = find_line(pyproject, r"""["'](?:sglang|sgl)-kernel==([^"';\s]+)["']""")
    return (hit[1].group(1), hit[0]) if hit else None
