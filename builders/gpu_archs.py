"""Which GPUs an image's CUDA kernels run on, read from the binaries with NVIDIA's cuobjdump.

A library's fatbin holds SASS (machine code for one architecture, `sm_XY`) and PTX (virtual code the driver
compiles at load time, `compute_XY`). The rules the CUDA driver applies, which every check here follows:
- SASS `sm_XY` runs on a GPU of capability X.Z with Z >= Y: binary compatibility holds within a major only
  (an sm_80 cubin runs on an A10's 8.6, never on a 9.0 H100).
- SASS `sm_XYa` (architecture-specific: Hopper's wgmma, Blackwell's tcgen05) runs on X.Y alone.
- SASS `sm_XYf` (family-specific, CUDA 12.9+) runs on X.Z with Z >= Y.
- PTX `compute_XY` JITs on any GPU of capability >= X.Y, of any later major; PTX can never go backwards.
- PTX of an `a` arch JITs on X.Y alone; of an `f` arch, within its family like its SASS.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from builders.errors import ConfigError, ForgeError

Kind = Literal["sass", "ptx"]

# `ELF file    1: _C.abi3.1.sm_90a.cubin` / `PTX file    1: libnvjpeg.so.1.sm_121.ptx`: the arch is the last
# dotted part before the extension; the name before it is the library's own and may hold dots.
_ENTRY = re.compile(r"^(?P<what>ELF|PTX) file\s+\d+:\s+(?P<name>\S+)\.(?P<arch>sm_\d+[a-z]?)\.(?:cubin|ptx)\s*$")
# What cuobjdump says, on stderr or stdout and with exit 255, for a file without the kind of code asked for.
_NO_CODE = ("does not contain device code", "No PTX file found", "No ELF file found")


@dataclass(frozen=True, order=True)
class Capability:
    """A GPU's compute capability, as nvidia-smi's compute_cap and TORCH_CUDA_ARCH_LIST write it (9.0)."""

    major: int
    minor: int

    @classmethod
    def parse(cls, text: str, *, where: str) -> Capability:
        m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", text)
        if not m:
            raise ConfigError(
                f"{where}: {text!r} is not a compute capability", hint="write it as MAJOR.MINOR, e.g. 9.0"
            )
        return cls(int(m[1]), int(m[2]))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


@dataclass(frozen=True, order=True)
class Arch:
    """One architecture a fatbin carries code for: sm_90a is Arch(9, 0, "a")."""

    major: int
    minor: int
    suffix: Literal["", "a", "f"] = ""

    @classmethod
    def parse(cls, text: str) -> Arch:
        m = re.fullmatch(r"(?:sm_|compute_)(\d+?)(\d)([af]?)", text)
        if not m:
            raise ValueError(f"{text!r} is not an arch such as sm_90 or sm_90a")
        suffixes: dict[str, Literal["", "a", "f"]] = {"": "", "a": "a", "f": "f"}
        return cls(int(m[1]), int(m[2]), suffixes[m[3]])

    @property
    def capability(self) -> Capability:
        return Capability(self.major, self.minor)

    def sass_runs_on(self, gpu: Capability) -> bool:
        if self.suffix == "a":
            return gpu == self.capability
        return gpu.major == self.major and gpu.minor >= self.minor

    def ptx_jits_on(self, gpu: Capability) -> bool:
        if self.suffix == "a":
            return gpu == self.capability
        if self.suffix == "f":
            return gpu.major == self.major and gpu.minor >= self.minor
        return gpu >= self.capability

    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}{self.suffix}"

    def compute(self) -> str:
        """The name of PTX for this arch: compute_100, as nvcc's -gencode arch= and the driver name it."""
        return f"compute_{self.major}{self.minor}{self.suffix}"

    def __str__(self) -> str:
        return self.sm()


def parse_listing(text: str, kind: Kind, *, where: str) -> frozenset[Arch]:
    """The archs in one `cuobjdump --list-elf` (kind sass) or `--list-ptx` (kind ptx) output.

    A line that is neither an entry nor cuobjdump's "no device code" note is an error naming it: a format this
    parser does not know must not read as "no kernels"."""
    want = "ELF" if kind == "sass" else "PTX"
    archs: set[Arch] = set()
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or any(note in line for note in _NO_CODE):
            continue
        m = _ENTRY.match(line)
        if not m:
            raise ForgeError(
                f"{where}:{number}: cuobjdump printed {line.strip()!r}, not an ELF/PTX entry",
                hint="this cuobjdump's output format is new to Forge: report it with the line above",
            )
        if m["what"] != want:
            raise ForgeError(f"{where}:{number}: a {m['what']} entry in a --list-{'elf' if kind == 'sass' else 'ptx'}")
        archs.add(Arch.parse(m["arch"]))
    return frozenset(archs)


@dataclass(frozen=True, kw_only=True)
class LibraryArchs:
    """The archs one shared library carries, as cuobjdump lists them."""

    library: str  # path inside the image or wheel, e.g. vllm/_C_stable_libtorch.abi3.so
    sass: frozenset[Arch] = field(default_factory=frozenset)
    ptx: frozenset[Arch] = field(default_factory=frozenset)

    @property
    def has_device_code(self) -> bool:
        return bool(self.sass or self.ptx)

    def runs_on(self, gpu: Capability) -> str | None:
        """How this library's kernels reach the GPU: "sm_90 SASS", "compute_90 PTX (JIT)", or None."""
        sass = sorted((a for a in self.sass if a.sass_runs_on(gpu)), reverse=True)
        if sass:
            return f"{sass[0]} SASS"
        ptx = sorted((a for a in self.ptx if a.ptx_jits_on(gpu)), reverse=True)
        if ptx:
            return f"{ptx[0].compute()} PTX (JIT)"
        return None

    def to_json(self) -> dict[str, list[str]]:
        # PTX as compute_XY: what it is called everywhere else (cuobjdump lists it under the sm_ name of its file).
        return {"sass": [a.sm() for a in sorted(self.sass)], "ptx": [a.compute() for a in sorted(self.ptx)]}

    @classmethod
    def from_json(cls, library: str, data: object, *, where: str) -> LibraryArchs:
        if not isinstance(data, dict) or not all(isinstance(data.get(k, []), list) for k in ("sass", "ptx")):
            raise ConfigError(f"{where}: {library}: expected {{sass: [...], ptx: [...]}}")
        try:
            return cls(
                library=library,
                sass=frozenset(Arch.parse(str(a)) for a in data.get("sass", [])),
                ptx=frozenset(Arch.parse(str(a)) for a in data.get("ptx", [])),
            )
        except ValueError as exc:
            raise ConfigError(f"{where}: {library}: {exc}") from exc


def read_library(cuobjdump: Path, library: Path, *, name: str | None = None) -> LibraryArchs:
    """Run cuobjdump on one library; a file without device code reads as empty, any other failure is an error."""
    found: dict[Kind, frozenset[Arch]] = {}
    flags: tuple[tuple[Kind, str], ...] = (("sass", "--list-elf"), ("ptx", "--list-ptx"))
    for kind, flag in flags:
        try:
            proc = subprocess.run([str(cuobjdump), flag, str(library)], capture_output=True, text=True, check=False)
        except OSError as exc:
            raise ForgeError(
                f"{cuobjdump}: cannot run it ({exc.strerror})", hint="install nvidia-cuda-cuobjdump"
            ) from exc
        text = proc.stdout + proc.stderr
        if proc.returncode != 0 and not any(note in text for note in _NO_CODE):
            raise ForgeError(f"cuobjdump {flag} {library} exited {proc.returncode}: {text.strip()[:300]}")
        found[kind] = parse_listing(text, kind, where=f"cuobjdump {flag} {library}")
    return LibraryArchs(library=name or library.name, sass=found["sass"], ptx=found["ptx"])


# Kernels every model needs: _C holds the cache, norm and activation ops, _moe_C the MoE routing, libtorch_cuda
# torch's own CUDA operators. The attention
# backends (fa2 for 8.x, fa3 for 9.0a only, FlashMLA, ...) are picked per GPU at start-up, so one that lacks a
# GPU's arch is a backend vLLM will not choose, not a crash: they are recorded, not gated.
CORE_LIBRARIES = ("_C", "_C_stable_libtorch", "_moe_C", "_moe_C_stable_libtorch", "libtorch_cuda")


def library_stem(library: str) -> str:
    """vllm/_C_stable_libtorch.abi3.so → _C_stable_libtorch."""
    return Path(library).name.split(".", 1)[0]


def core(libraries: Iterable[LibraryArchs]) -> list[LibraryArchs]:
    """The libraries a GPU must be covered by: vLLM's core ones where present, else every one with device code."""
    libs = [lib for lib in libraries if lib.has_device_code]
    chosen = [lib for lib in libs if library_stem(lib.library) in CORE_LIBRARIES]
    return chosen or libs


def parse_arch_list(text: str, *, where: str) -> list[tuple[Capability, bool]]:
    """TORCH_CUDA_ARCH_LIST ("7.5 8.0;9.0+PTX") → [(capability, with PTX)]."""
    out: list[tuple[Capability, bool]] = []
    for item in re.split(r"[\s;,]+", text.strip()):
        if not item:
            continue
        # The whole entry as written: `9.0+PTX+PTX` is refused as itself, not as the `9.0+PTX` left after
        # one suffix came off.
        entry = re.fullmatch(r"(\d+\.\d+)[af]?(\+PTX)?", item)
        if entry is None:
            raise ConfigError(
                f"{where}: {item!r} is not a compute capability",
                hint="write each as MAJOR.MINOR, optionally with a or f, then +PTX once: 9.0, 9.0a, 12.0+PTX",
            )
        out.append((Capability.parse(entry[1], where=where), entry[2] is not None))
    if not out:
        raise ConfigError(f"{where}: the arch list is empty", hint='list capabilities, e.g. "8.0 9.0 10.0"')
    return out


def declared_library(arch_list: str, *, where: str) -> LibraryArchs:
    """An arch list as one library: what a build was asked for, before cuobjdump has read what it made."""
    entries = parse_arch_list(arch_list, where=where)
    return LibraryArchs(
        library=f"arch_list ({where})",
        sass=frozenset(Arch(c.major, c.minor) for c, _ in entries),
        ptx=frozenset(Arch(c.major, c.minor) for c, ptx in entries if ptx),
    )


@dataclass(frozen=True, kw_only=True)
class Gap:
    library: str
    capability: Capability
    sass: tuple[str, ...]
    ptx: tuple[str, ...]

    def message(self) -> str:
        return (
            f"{self.library} has no kernels for {self.capability}: SASS {' '.join(self.sass) or 'none'}, "
            f"PTX {' '.join(self.ptx) or 'none'}"
        )


def coverage_gaps(libraries: Iterable[LibraryArchs], arch_list: str, *, where: str) -> list[Gap]:
    """Each (core library, arch of arch_list) pair whose GPU no SASS runs on and no PTX JITs to."""
    gaps: list[Gap] = []
    caps = [c for c, _ in parse_arch_list(arch_list, where=where)]
    for lib in core(libraries):
        for cap in caps:
            if lib.runs_on(cap) is None:
                gaps.append(
                    Gap(
                        library=lib.library,
                        capability=cap,
                        sass=tuple(a.sm() for a in sorted(lib.sass)),
                        ptx=tuple(a.compute() for a in sorted(lib.ptx)),
                    )
                )
    return gaps


# NVIDIA's cuobjdump as a PyPI wheel (290 kB), pinned: the reader's results must not move with a new release.
CUOBJDUMP_WHEEL = (
    "nvidia-cuda-cuobjdump==13.5.37",
    "38780fee50863252a0b8926357faa91615ca1c8346490563f33a06100cd73f58",
)


def wheel_cache(root: Path) -> Path:
    """Where GPU tool wheels are kept, beside the source cache (FORGE_CACHE or .forge/cache)."""
    return Path(os.environ.get("FORGE_CACHE", root / ".forge" / "cache")) / "gpu-wheels"


def fetch_wheel(requirement: str, sha256: str, cache: Path) -> Path:
    """One x86_64 wheel, no dependencies, from the configured index into cache; its sha256 checked."""
    name, _, version = requirement.partition("==")
    stem = name.replace("-", "_") + "-" + version + "-"
    found = list(cache.glob(stem + "*.whl")) if cache.is_dir() else []
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--platform",
             "manylinux2014_x86_64", "--python-version", "3.12", "-d", str(cache), requirement],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        found = list(cache.glob(stem + "*.whl"))
        if proc.returncode != 0 or not found:
            raise ForgeError(
                f"pip download {requirement} failed: {(proc.stderr or proc.stdout).strip()[-400:]}",
                hint="PyPI (or the index pip is configured with) must be reachable",
            )
    wheel = found[0]
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != sha256:
        raise ForgeError(f"{wheel}: sha256 {digest}, pinned {sha256}", hint=f"delete {wheel} and fetch it again")
    return wheel


def unpacked_wheel(wheel: Path) -> Path:
    """The wheel unpacked beside itself (once), with the executable bit pip would not keep for a zip member."""
    dest = wheel.with_suffix("")
    if not dest.is_dir():
        tmp = dest.with_name(dest.name + ".partial")
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp)
        for tool in tmp.rglob("bin/*"):
            tool.chmod(0o755)
        tmp.rename(dest)
    return dest


# nvcc as PyPI's wheels, for `forge gpu probe` where the host has none: the compiler driver with ptxas and
# fatbinary, cicc (nvvm) and the headers a .cu includes. CUDA 13.0 Update 1's, pinned: its PTX (ISA 9.0) JITs on
# every CUDA 13 driver (580 on), where a newer nvcc's PTX would be refused by those drivers. About 101 MB.
NVCC_WHEELS = (
    ("nvidia-cuda-nvcc==13.0.88", "56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03"),
    ("nvidia-nvvm==13.0.88", "c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0"),
    ("nvidia-cuda-crt==13.0.88", "2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4"),
    ("nvidia-cuda-runtime==13.0.88", "422a38f7c739ecbdd3a4b6ec7ed0a1d74db43d8e9bc26685f3d845638922b178"),
)


def nvcc_from_pypi(cache: Path) -> Path:
    """nvcc of NVCC_WHEELS, the wheels unpacked into one tree (once): nvcc finds cicc and the headers beside it."""
    wheels = [fetch_wheel(requirement, sha256, cache) for requirement, sha256 in NVCC_WHEELS]
    dest = cache / ("nvcc-" + NVCC_WHEELS[0][0].partition("==")[2])
    if not dest.is_dir():
        tmp = dest.with_name(dest.name + ".partial")
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as z:
                z.extractall(tmp)
        for tool in (*tmp.rglob("bin/*"), *tmp.rglob("nvvm/bin/*")):
            if tool.is_file():
                tool.chmod(0o755)
        tmp.rename(dest)
    (tool,) = dest.rglob("bin/nvcc")
    return tool


def cuobjdump_from_pypi(cache: Path) -> Path:
    tree = unpacked_wheel(fetch_wheel(*CUOBJDUMP_WHEEL, cache))
    (tool,) = tree.rglob("bin/cuobjdump")
    return tool
