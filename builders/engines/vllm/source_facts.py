"""What a vLLM source tree or sdist demands of the build, each fact cited by file and line.

Nothing here knows vLLM's numbers: a release that raises a GCC gate, the CMake minimum or a torch pin changes
the facts read here, and so the gates, without a code change.
"""

from __future__ import annotations

import functools
import re
import tarfile
import tomllib
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field

from builders.config.models import Distro
from builders.engines.vllm.cmake_script import Branch, Located, Term, locate, tokenize
from builders.errors import SourceUnavailable

# Words in CMake conditions that tie a branch to a CPU architecture.
ARCH_WORDS: dict[str, str] = {
    "ENABLE_X86_ISA": "x86_64",
    "ASIMD_FOUND": "aarch64",
    "POWER9_FOUND": "ppc64le",
    "POWER10_FOUND": "ppc64le",
    "POWER11_FOUND": "ppc64le",
    "S390_FOUND": "s390x",
    "RVV_FP16_FOUND": "riscv64",
    "RVV_BF16_FOUND": "riscv64",
}
ARCH_PATTERNS: dict[str, str] = {
    "x86_64": "x86_64",
    "amd64": "x86_64",
    "aarch64": "aarch64",
    "arm64": "aarch64",
    "ppc64le": "ppc64le",
    "riscv64": "riscv64",
    "s390x": "s390x",
}
GPU_LANGS = {"CUDA": "cuda", "HIP": "rocm"}
ARCH_LABELS = {"x86_64": "x86", "aarch64": "Arm", "ppc64le": "POWER", "s390x": "s390x", "riscv64": "RISC-V"}
DEVICE_LABELS = {"cpu": "CPU", "cuda": "CUDA", "rocm": "ROCm", "tpu": "TPU", "xpu": "XPU"}

_GCC_IN_MESSAGE = re.compile(r"(?i)\b(?:gcc|g\+\+)(?:/g\+\+)?\s*(>=|>)\s*(\d+(?:\.\d+)*)")
_CMAKE_VARS = ("${CMAKE_CURRENT_LIST_DIR}/", "${CMAKE_SOURCE_DIR}/", "${CMAKE_CURRENT_SOURCE_DIR}/")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Scope(Strict):
    """Where a fact applies: empty tuples mean no restriction."""

    devices: tuple[str, ...] = Field(default=(), description="VLLM_TARGET_DEVICE values it applies to")
    not_devices: tuple[str, ...] = Field(default=(), description="devices it never applies to")
    arches: tuple[str, ...] = Field(default=(), description="CPU architectures it applies to")
    not_arches: tuple[str, ...] = Field(default=(), description="architectures it never applies to")

    def applies(self, device: str, arch: str) -> bool:
        return (
            (not self.devices or device in self.devices)
            and device not in self.not_devices
            and (not self.arches or arch in self.arches)
            and arch not in self.not_arches
        )

    @property
    def label(self) -> str:
        arch = "/".join(ARCH_LABELS.get(a, a) for a in self.arches) if 0 < len(self.arches) <= 2 else ""
        device = "/".join(DEVICE_LABELS.get(d, d) for d in self.devices)
        text = " ".join(p for p in (arch, device) if p)
        return text or "all"  # read as "vLLM's GCC gate for all targets"


class CompilerGate(Strict):
    """A `message(FATAL_ERROR ...)` that stops the configure when the C++ compiler is the wrong version."""

    specifier: str = Field(description="versions of GCC that pass, as a PEP 440 specifier (>=12.3)")
    scope: Scope = Field(description="target devices and architectures the gate applies to")
    message: str = Field(description="the FATAL_ERROR text as CMake would print it")
    file: str = Field(description="file in the vLLM source, relative to its root")
    line: int = Field(description="line of the message() command")

    @property
    def source(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def required(self) -> str:
        return _pretty_spec(self.specifier)

    def admits(self, version: str) -> bool:
        return SpecifierSet(self.specifier).contains(version, prereleases=True)


class Cited(Strict):
    """A value read from one line of the source."""

    value: str = Field(description="the value, as written (3.26, cmake>=3.26.1, >=3.11,<3.15)")
    file: str = Field(description="file in the vLLM source")
    line: int = Field(description="line it was read from")

    @property
    def source(self) -> str:
        return f"{self.file}:{self.line}"


class TorchPin(Strict):
    requirement: str = Field(description="the requirement line (torch==2.14.0+cpu; platform_machine == ...)")
    version: str | None = Field(description="the exact version pinned with ==, or None when a range")
    specifier: str = Field(description="the version specifier")
    marker: str | None = Field(description="environment marker, if any")
    kind: str = Field(description="build: the torch compiled against; runtime: installed beside vLLM")
    device: str = Field(description="device the requirements file is for (cpu, cuda), or any for pyproject")
    file: str = Field(description="requirements file")
    line: int = Field(description="line in it")

    @property
    def source(self) -> str:
        return f"{self.file}:{self.line}"

    def applies(self, *, arch: str, python: str) -> bool:
        if self.marker is None:
            return True
        env = {
            "platform_machine": arch,
            "platform_system": "Linux",
            "sys_platform": "linux",
            "os_name": "posix",
            "python_version": python,
            "python_full_version": f"{python}.0",
            "implementation_name": "cpython",
            "platform_python_implementation": "CPython",
        }
        return bool(Marker(self.marker).evaluate(env))


class FetchedDependency(Strict):
    """A source CMake clones from the network during the build (FetchContent)."""

    name: str = Field(description="FetchContent name (oneDNN)")
    repository: str | None = Field(description="GIT_REPOSITORY or URL")
    tag: str | None = Field(description="GIT_TAG: tag or commit")
    scope: Scope = Field(description="architectures whose build fetches it")
    override_var: str = Field(description="variable that makes CMake use a local copy instead")
    override_honoured_at: str | None = Field(
        description="file:line where the source reads the override from the environment ($ENV{VAR}); None if never"
    )
    file: str = Field(description="file declaring the fetch")
    line: int = Field(description="line of the FetchContent command")

    @property
    def source(self) -> str:
        return f"{self.file}:{self.line}"


class SourceFacts(Strict):
    """Everything preflight reads from a vLLM source."""

    origin: str = Field(description="the directory or sdist read")
    vllm_version: str | None = Field(description="vLLM's version, from PKG-INFO or the sdist name")
    version_source: str | None = Field(description="where the version was read")
    compiler_gates: tuple[CompilerGate, ...] = Field(description="GCC version gates")
    cmake_minimum: Cited | None = Field(description="cmake_minimum_required VERSION in CMakeLists.txt")
    cmake_requirement: Cited | None = Field(description="cmake build requirement in pyproject.toml")
    requires_python: Cited | None = Field(description="requires-python in pyproject.toml")
    python_supported: Cited | None = Field(description="PYTHON_SUPPORTED_VERSIONS in CMakeLists.txt (space-joined)")
    torch_pins: tuple[TorchPin, ...] = Field(description="torch requirements by device and kind")
    fetched: tuple[FetchedDependency, ...] = Field(description="sources CMake fetches from the network")

    def gates_for(self, device: str, arch: str) -> list[CompilerGate]:
        return [g for g in self.compiler_gates if g.scope.applies(device, arch)]

    def pins_for(self, device: str, *, arch: str, python: str) -> list[TorchPin]:
        return [p for p in self.torch_pins if p.device == device and p.applies(arch=arch, python=python)]

    def fetched_for(self, device: str, arch: str) -> list[FetchedDependency]:
        return [f for f in self.fetched if f.scope.applies(device, arch)]


# --- reading files ---------------------------------------------------------------------------------------


def _wanted(rel: str) -> bool:
    path = PurePosixPath(rel)
    if rel in {"CMakeLists.txt", "pyproject.toml", "PKG-INFO"}:
        return True
    if path.parts[:1] == ("cmake",) and path.suffix == ".cmake":
        return True
    return path.parts[:1] == ("requirements",) and path.suffix == ".txt"


def read_source_files(source: Path) -> dict[str, str]:
    """The few files preflight reads, by path relative to the source root. An sdist is streamed once,
    reading only those members."""
    if not source.exists():
        raise SourceUnavailable(
            f"vLLM source {source} does not exist",
            hint="pass --source DIR_OR_SDIST, or run `forge fetch` to fill the source cache",
        )
    files: dict[str, str] = {}
    if source.is_dir():
        for path in sorted(source.rglob("*")):
            rel = path.relative_to(source).as_posix()
            if path.is_file() and _wanted(rel):
                files[rel] = path.read_text(encoding="utf-8", errors="replace")
    elif tarfile.is_tarfile(source):
        try:
            with tarfile.open(source, "r:*") as tar:
                for member in tar:
                    parts = PurePosixPath(member.name).parts
                    rel = "/".join(parts[1:])
                    if member.isfile() and len(parts) > 1 and _wanted(rel):
                        fh = tar.extractfile(member)
                        if fh is not None:
                            files[rel] = fh.read().decode("utf-8", errors="replace")
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise SourceUnavailable(
                f"{source}: not a readable sdist: {exc}",
                hint="fetch it again (`forge fetch`) or pass an unpacked source directory",
            ) from exc
    else:
        raise SourceUnavailable(
            f"{source} is neither a directory nor a .tar.gz sdist", hint="pass the vLLM source directory or its sdist"
        )
    if "CMakeLists.txt" not in files:
        raise SourceUnavailable(
            f"{source} has no top-level CMakeLists.txt: not a vLLM source tree",
            hint="pass the directory holding vLLM's CMakeLists.txt and pyproject.toml, or its sdist",
        )
    return files


def read_source_facts(source: Path) -> SourceFacts:
    files = read_source_files(source)
    version, version_source = _version(files, source)
    include_scopes = _include_scopes(files.get("CMakeLists.txt", ""))
    gates: list[CompilerGate] = []
    fetched: list[FetchedDependency] = []
    for rel in sorted(f for f in files if f == "CMakeLists.txt" or f.endswith(".cmake")):
        text = files[rel]
        located = locate(tokenize(text))
        outer = include_scopes.get(rel, ())
        gates += _compiler_gates(rel, located, outer)
        fetched += _fetches(rel, text, located, outer)
    pyproject = files.get("pyproject.toml", "")
    return SourceFacts(
        origin=str(source),
        vllm_version=version,
        version_source=version_source,
        compiler_gates=tuple(gates),
        cmake_minimum=_cmake_minimum(files.get("CMakeLists.txt", "")),
        cmake_requirement=_pyproject_build_requirement(pyproject, "cmake"),
        requires_python=_requires_python(pyproject),
        python_supported=_python_supported(files.get("CMakeLists.txt", "")),
        torch_pins=tuple(_torch_pins(files)),
        fetched=tuple(fetched),
    )


# --- version ---------------------------------------------------------------------------------------------


def _version(files: dict[str, str], source: Path) -> tuple[str | None, str | None]:
    for number, line in enumerate(files.get("PKG-INFO", "").splitlines(), start=1):
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip(), f"PKG-INFO:{number}"
        if not line.strip():
            break
    name = source.name
    for suffix in (".tar.gz", ".tgz", ".tar"):
        name = name.removesuffix(suffix)
    match = re.fullmatch(r"vllm[-_](\d[\w.+!-]*)", name)
    if match:
        return match.group(1), f"name of {source.name}"
    return None, None


# --- CMake -----------------------------------------------------------------------------------------------


def _strip_cmake_dir(path: str) -> str:
    for var in _CMAKE_VARS:
        path = path.replace(var, "")
    return path[2:] if path.startswith("./") else path


def _include_scopes(cmakelists: str) -> dict[str, tuple[Branch, ...]]:
    """Files CMakeLists.txt includes, with the branches around each include: cmake/cpu_extension.cmake is read
    only when VLLM_TARGET_DEVICE is cpu, so its gates are CPU gates."""
    scopes: dict[str, tuple[Branch, ...]] = {}
    for item in locate(tokenize(cmakelists)):
        if item.command.name == "include" and item.command.args:
            target = _strip_cmake_dir(item.command.args[0].text)
            if target.endswith(".cmake"):
                scopes.setdefault(target, item.branches)
    return scopes


def _arch_of(term: Term) -> set[str]:
    if term.op is None:
        arch = ARCH_WORDS.get(term.left)
        return {arch} if arch else set()
    if term.left == "CMAKE_SYSTEM_PROCESSOR" and term.op in {"MATCHES", "STREQUAL"} and term.right:
        return {arch for word, arch in ARCH_PATTERNS.items() if word in term.right}
    return set()


def _device_of(term: Term) -> str | None:
    if term.op != "STREQUAL" or term.right is None:
        return None
    if term.left == "VLLM_TARGET_DEVICE":
        return term.right.lower()
    if term.left == "VLLM_GPU_LANG":
        return GPU_LANGS.get(term.right.upper())
    return None


def scope_of(branches: Iterable[Branch], message: str = "") -> Scope:
    """Devices and architectures a command under these branches runs for.

    Positive arch words in one condition are OR-ed (x86_64 OR ENABLE_X86_ISA); nested conditions narrow.
    An else() after an arch-specific branch excludes that arch.
    """
    devices: set[str] = set()
    not_devices: set[str] = set()
    arches: set[str] | None = None
    not_arches: set[str] = set()
    for branch in branches:
        own: set[str] = set()
        for term in branch.condition:
            device = _device_of(term)
            if device:
                (not_devices if term.negated else devices).add(device)
            if term.negated:
                not_arches |= _arch_of(term)
            else:
                own |= _arch_of(term)
        for earlier in branch.earlier:
            for term in earlier:
                device = _device_of(term)
                if device and not term.negated and len(earlier) == 1:
                    not_devices.add(device)
                if not term.negated:
                    not_arches |= _arch_of(term)
        if own:
            arches = own if arches is None else (arches & own or own)
    if re.search(r"\bwith CUDA\b", message):
        devices.add("cuda")
    final_arches = tuple(sorted((arches or set()) - not_arches))
    return Scope(
        devices=tuple(sorted(devices)),
        not_devices=tuple(sorted(not_devices - devices)),
        arches=final_arches,
        not_arches=tuple(sorted(not_arches)) if not final_arches else (),
    )


def _message_text(item: Located) -> str:
    words = item.command.words()[1:]
    return re.sub(r"\s+", " ", "".join(words)).strip()


def _spec_from_terms(terms: list[Term]) -> str | None:
    """The GCC versions that pass, from the comparison whose truth leads to the FATAL_ERROR."""
    for term in reversed(terms):  # innermost first
        if term.left != "CMAKE_CXX_COMPILER_VERSION" or term.op is None or not term.right:
            continue
        value = term.right.strip('"')
        if not re.fullmatch(r"\d+(?:\.\d+)*", value):
            continue
        failing = {
            "VERSION_LESS": "<",
            "VERSION_LESS_EQUAL": "<=",
            "VERSION_GREATER": ">",
            "VERSION_GREATER_EQUAL": ">=",
        }.get(term.op)
        if failing is None:
            continue
        # The FATAL fires when the comparison is true (or false, under NOT); passing is its opposite.
        opposite = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}
        passing = failing if term.negated else opposite[failing]
        return f"{passing}{value}"
    return None


def _compiler_gates(rel: str, located: list[Located], outer: tuple[Branch, ...]) -> list[CompilerGate]:
    gates: list[CompilerGate] = []
    for item in located:
        cmd = item.command
        if cmd.name != "message" or not cmd.args or cmd.args[0].text.upper() != "FATAL_ERROR":
            continue
        terms = item.terms()
        if any(
            t.left == "CMAKE_CXX_COMPILER_ID"
            and t.op == "STREQUAL"
            and not t.negated
            and t.right
            and t.right.upper() != "GNU"
            for t in terms
        ):
            continue  # a gate for another compiler family
        message = _message_text(item)
        spec = _spec_from_terms(terms)
        if spec is None:
            match = _GCC_IN_MESSAGE.search(message)
            if match is None:
                continue
            spec = f"{match.group(1)}{match.group(2)}"
        gates.append(
            CompilerGate(
                specifier=spec,
                scope=scope_of((*outer, *item.branches), message),
                message=message,
                file=rel,
                line=cmd.line,
            )
        )
    return gates


def _cmake_minimum(text: str) -> Cited | None:
    for item in locate(tokenize(text)):
        if item.command.name == "cmake_minimum_required":
            words = item.command.words()
            if "VERSION" in words and words.index("VERSION") + 1 < len(words):
                value = words[words.index("VERSION") + 1].split("...", 1)[0]
                return Cited(value=value, file="CMakeLists.txt", line=item.command.line)
    return None


def _python_supported(text: str) -> Cited | None:
    for item in locate(tokenize(text)):
        words = item.command.words()
        if item.command.name == "set" and words[:1] == ["PYTHON_SUPPORTED_VERSIONS"]:
            return Cited(value=" ".join(words[1:]), file="CMakeLists.txt", line=item.command.line)
    return None


def _fetches(rel: str, text: str, located: list[Located], outer: tuple[Branch, ...]) -> list[FetchedDependency]:
    out: list[FetchedDependency] = []
    lines = text.splitlines()
    # Tags are often set a few lines above (set(CUTLASS_REVISION "v4.2.1")); resolve single-valued set()s.
    values = {
        i.command.args[0].text: i.command.args[1].text
        for i in located
        if i.command.name == "set" and len(i.command.args) == 2
    }
    for item in located:
        cmd = item.command
        if cmd.name not in {"fetchcontent_declare", "fetchcontent_populate"} or not cmd.args:
            continue
        words = cmd.words()
        keyed = {words[i]: words[i + 1] for i in range(1, len(words) - 1) if words[i].isupper()}
        repository = keyed.get("GIT_REPOSITORY") or keyed.get("URL")
        if repository is None:
            continue  # a declaration pointing at a local SOURCE_DIR: the override, not a fetch
        name = words[0]
        var = f"FETCHCONTENT_SOURCE_DIR_{name.upper()}"
        # Forge hands local copies over in the environment; a source that stops reading $ENV{VAR} ignores them.
        honoured = next((f"{rel}:{n}" for n, line in enumerate(lines, start=1) if f"$ENV{{{var}}}" in line), None)
        out.append(
            FetchedDependency(
                name=name,
                repository=repository,
                tag=_substitute(keyed.get("GIT_TAG"), values),
                scope=scope_of((*outer, *item.branches)),
                override_var=var,
                override_honoured_at=honoured,
                file=rel,
                line=cmd.line,
            )
        )
    return out


def _substitute(value: str | None, values: dict[str, str]) -> str | None:
    if value is None:
        return None
    return re.sub(r"\$\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), value)


# --- pyproject and requirements --------------------------------------------------------------------------


def _line_of(text: str, needle: str) -> int:
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number
    return 0


def _pyproject_build_requirement(text: str, project: str) -> Cited | None:
    if not text:
        return None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None
    for req in data.get("build-system", {}).get("requires", []):
        try:
            parsed = Requirement(req)
        except InvalidRequirement:
            continue
        if canonicalize_name(parsed.name) == project:
            return Cited(value=req, file="pyproject.toml", line=_line_of(text, f'"{req}"'))
    return None


def _requires_python(text: str) -> Cited | None:
    if not text:
        return None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None
    value = data.get("project", {}).get("requires-python")
    if not isinstance(value, str):
        return None
    return Cited(value=value, file="pyproject.toml", line=_line_of(text, "requires-python"))


def _requirement_lines(text: str) -> Iterable[tuple[int, str]]:
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-")):
            yield number, line


def _torch_pin(line: str, *, kind: str, device: str, file: str, number: int) -> TorchPin | None:
    try:
        req = Requirement(line)
    except InvalidRequirement:
        return None
    if canonicalize_name(req.name) != "torch":
        return None
    exact = [s.version for s in req.specifier if s.operator in {"==", "==="}]
    return TorchPin(
        requirement=line,
        version=exact[0] if exact else None,
        specifier=str(req.specifier),
        marker=str(req.marker) if req.marker else None,
        kind=kind,
        device=device,
        file=file,
        line=number,
    )


def _torch_pins(files: dict[str, str]) -> list[TorchPin]:
    pins: list[TorchPin] = []
    for rel in sorted(files):
        path = PurePosixPath(rel)
        if path.parts[:1] != ("requirements",) or path.suffix != ".txt" or len(path.parts) > 3:
            continue
        kind = "build" if path.parts[1:2] == ("build",) and len(path.parts) == 3 else "runtime"
        if kind == "runtime" and len(path.parts) != 2:
            continue
        for number, line in _requirement_lines(files[rel]):
            pin = _torch_pin(line, kind=kind, device=path.stem, file=rel, number=number)
            if pin:
                pins.append(pin)
    pyproject = files.get("pyproject.toml", "")
    if pyproject:
        try:
            requires = tomllib.loads(pyproject).get("build-system", {}).get("requires", [])
        except tomllib.TOMLDecodeError:
            requires = []
        for req in requires:
            pin = _torch_pin(
                req, kind="build", device="any", file="pyproject.toml", number=_line_of(pyproject, f'"{req}"')
            )
            if pin:
                pins.append(pin)
    return pins


def _pretty_spec(spec: str) -> str:
    try:
        parts = sorted(SpecifierSet(spec), key=lambda s: s.operator, reverse=True)
    except InvalidSpecifier:
        return spec
    symbols = {">=": "≥", "<=": "≤", "==": "=", "!=": "≠"}
    return ", ".join(f"{symbols.get(s.operator, s.operator)} {s.version}" for s in parts)


def read_pins(source: Path, distro: Distro, device: str) -> tuple[str | None, str | None]:
    """vLLM's torch pin for this device, arch and Python, and vLLM's version, read from the source itself: the one
    reading the build, the lock and rendering share."""
    if source.is_file():
        stat = source.stat()
        facts = _archive_facts(source.resolve(), stat.st_size, stat.st_mtime_ns)
    else:
        facts = read_source_facts(source)
    pins = [p.version for p in facts.pins_for(device, arch=distro.arch, python=distro.build_python[0]) if p.version]
    return (pins[0] if pins else None), facts.vllm_version


@functools.lru_cache(maxsize=4)
def _archive_facts(path: Path, size: int, mtime_ns: int) -> SourceFacts:
    """An sdist's facts, read once per file version: `forge render` asks for every distro's pins from the same
    tarball, and walking its ~10,000 members takes seconds each time. Size and mtime are in the key so a file
    replaced in place is read again."""
    return read_source_facts(path)
