"""Ask the real base image what the build would get: one throwaway container, package-manager queries only.

The container asks apt/dnf which versions of the compiler, CMake and Python the archive offers, and which
files the NUMA-header and tcmalloc packages ship (apt-get download + dpkg-deb -c; dnf repoquery -l), without
installing anything, and prints `FORGE ...` lines that `parse_probe_output` reads.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from builders.config.models import Distro, Role
from builders.container import Engine, RunSpec
from builders.distros import family_for
from builders.errors import EngineError

# Roles whose versions the gates compare; installing them would take minutes, asking takes a second.
QUERY_ROLES: tuple[Role, ...] = ("c_compiler", "cmake", "python", "numa_headers", "tcmalloc")
# Roles whose file lists are checked: a few hundred kB to download.
INSTALL_ROLES: tuple[Role, ...] = ("numa_headers", "tcmalloc")
NUMA_HEADER = "/usr/include/numa.h"
HOST_CONFIG_PATHS = (
    "/usr/local/cuda/include/crt/host_config.h",
    "/usr/local/cuda/targets/x86_64-linux/include/crt/host_config.h",
    "/usr/local/cuda/targets/sbsa-linux/include/crt/host_config.h",
)


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    image: str
    packages: dict[str, str | None] = field(default_factory=dict)  # package -> candidate version
    resolved: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # gcc -> (gcc-12, its version)
    files: dict[str, bool] = field(default_factory=dict)
    errors: tuple[str, ...] = ()
    seconds: float = 0.0
    rc: int = 0
    glibc: str | None = None  # the base's own glibc (getconf GNU_LIBC_VERSION): its headers are the build's

    def version_of(self, packages: Sequence[str]) -> tuple[str, str] | None:
        """Lowest numeric version among these packages, following a metapackage to its versioned package
        (Ubuntu's gcc 4:11.2.0 depends on gcc-11 11.4.0, the compiler actually installed)."""
        best: tuple[tuple[int, ...], str, str] | None = None
        for pkg in packages:
            if pkg in self.resolved and self.resolved[pkg][1]:
                dep, raw = self.resolved[pkg]
                how = f"{dep} {raw}"
            elif self.packages.get(pkg):
                raw, how = self.packages[pkg], f"{pkg} {self.packages[pkg]}"
            else:
                continue
            number = numeric_version(raw or "")
            if number is None:
                continue
            key = tuple(int(p) for p in number.split("."))
            if best is None or key < best[0]:
                best = (key, number, how)
        return (best[1], best[2]) if best else None

    @property
    def archive_trouble(self) -> bool:
        """The package archive itself (update, extra repositories) failed: absent packages may exist after all."""
        return any(e.startswith("archive:") for e in self.errors)

    def missing(self, packages: Sequence[str]) -> list[str]:
        return [p for p in packages if p in self.packages and not self.packages[p]]


def numeric_version(raw: str) -> str | None:
    """4:12.2.0-3 -> 12.2.0; 3.25.1-1 -> 3.25.1; 14.2.1-1.el9 -> 14.2.1."""
    match = re.match(r"(?:\d+:)?(\d+(?:\.\d+)*)", raw.strip())
    return match.group(1) if match else None


def _packages(distro: Distro, roles: Sequence[Role]) -> list[str]:
    return family_for(distro).packages(roles)


def probe_packages(distro: Distro, *, device: str) -> tuple[list[str], list[str]]:
    """(packages to query, packages to install) for this distro and target device."""
    query = _packages(distro, QUERY_ROLES)
    if device == "cuda" and distro.cuda and distro.cuda.host_compiler:
        query += [p for p in distro.cuda.host_compiler.packages if p not in query]
    return query, _packages(distro, INSTALL_ROLES)


def probe_script(distro: Distro, *, device: str) -> str:
    """The shell the probe container runs; pure, so its shape is tested without an engine."""
    family = family_for(distro)
    query, install = probe_packages(distro, device=device)
    files = [NUMA_HEADER, distro.tcmalloc_path]
    qpkgs = " ".join(shlex.quote(p) for p in query)
    lines = ["set -u", 'echo "FORGE glibc $(getconf GNU_LIBC_VERSION 2>/dev/null)"']
    if family.package_manager == "apt-get":
        lines += [
            # Translations are 6 MB the probe never reads.
            "apt-get update -qq -o Acquire::Languages=none >/dev/null 2>&1 "
            '|| echo "FORGE error archive: apt-get update failed"',
            f"for p in {qpkgs}; do",
            "  v=$(apt-cache policy \"$p\" 2>/dev/null | awk '/Candidate:/ {print $2}')",
            '  [ "$v" = "(none)" ] && v=""',
            '  echo "FORGE pkg $p ${v:-none}"',
            # A metapackage (gcc) names the versioned package (gcc-12) the compiler really comes from.
            '  d=$(apt-cache depends "$p" 2>/dev/null | awk -v p="$p" '
            '\'$1=="Depends:" && index($2, p"-")==1 && substr($2, length(p)+2) ~ /^[0-9.]+$/ {print $2; exit}\')',
            '  if [ -n "$d" ]; then',
            "    dv=$(apt-cache policy \"$d\" 2>/dev/null | awk '/Candidate:/ {print $2}')",
            '    echo "FORGE dep $p $d ${dv:-none}"',
            "  fi",
            "done",
        ]
    else:
        setup = family.repo_setup_command()
        if setup:
            lines.append(f'( {setup} ) >/dev/null 2>&1 || echo "FORGE error archive: repository setup failed"')
        lines += [
            f"for p in {qpkgs}; do",
            "  v=$(dnf -q repoquery --latest-limit=1 --qf '%{version}\\n' \"$p\" 2>/dev/null | tail -n1)",
            '  echo "FORGE pkg $p ${v:-none}"',
            "done",
        ]
    ipkgs = " ".join(shlex.quote(p) for p in install)
    paths = " ".join(shlex.quote(p) for p in files)
    if family.package_manager == "apt-get":
        # Listing the packages' contents answers "would the build get this file" without dpkg's slow unpack.
        lines += [
            "mkdir -p /tmp/forge-debs && cd /tmp/forge-debs",
            f'apt-get download -qq {ipkgs} >/dev/null 2>&1 || echo "FORGE error files: apt-get download failed"',
            "contents() { for d in ./*.deb; do dpkg-deb -c \"$d\" 2>/dev/null; done | awk '{print substr($6, 2)}'; }",
        ]
    else:
        lines.append(f"contents() {{ dnf -q repoquery -l {ipkgs} 2>/dev/null; }}")
    lines += [
        "listing=$(contents)",
        f"for f in {paths}; do",
        '  if printf "%s\\n" "$listing" | grep -qxF "$f"; then echo "FORGE file $f yes";',
        '  else echo "FORGE file $f no"; fi',
        "done",
    ]
    return "\n".join(lines) + "\n"


def parse_probe_output(image: str, output: str, *, rc: int = 0, seconds: float = 0.0) -> ProbeResult:
    packages: dict[str, str | None] = {}
    resolved: dict[str, tuple[str, str | None]] = {}
    files: dict[str, bool] = {}
    errors: list[str] = []
    glibc: str | None = None
    for line in output.splitlines():
        parts = line.strip().split()
        if len(parts) < 2 or parts[0] != "FORGE":
            continue
        kind, rest = parts[1], parts[2:]
        if kind == "pkg" and len(rest) == 2:
            packages[rest[0]] = None if rest[1] == "none" else rest[1]
        elif kind == "dep" and len(rest) == 3:
            resolved[rest[0]] = (rest[1], None if rest[2] == "none" else rest[2])
        elif kind == "file" and len(rest) == 2:
            files[rest[0]] = rest[1] == "yes"
        elif kind == "error":
            errors.append(" ".join(rest))
        elif kind == "glibc" and rest:
            glibc = numeric_version(rest[-1])
    return ProbeResult(
        image=image,
        packages=packages,
        resolved=resolved,
        files=files,
        errors=tuple(errors),
        seconds=seconds,
        rc=rc,
        glibc=glibc,
    )


@dataclass(frozen=True, kw_only=True)
class ProbeUnavailable:
    image: str
    reason: str


def probe_base(
    engine: Engine, distro: Distro, *, device: str, image: str | None = None, timeout: float = 120
) -> ProbeResult | ProbeUnavailable:
    """Probe the image the build starts from (default: the distro's base; a GPU build's CUDA base) if the engine
    has it; never pulls (registries may be unreachable) or bootstraps."""
    image = image or distro.base.local_tag
    if not engine.image_exists(image):
        return ProbeUnavailable(
            image=image,
            reason=f"{image} is not in the engine (no registry pull or bootstrap is attempted by preflight)",
        )
    start = time.monotonic()
    try:
        rc, output = engine.run_once(
            RunSpec(image=image, command=["sh", "-c", probe_script(distro, device=device)]), timeout=timeout
        )
    except EngineError as exc:
        return ProbeUnavailable(image=image, reason=f"probe container failed: {exc.message}")
    result = parse_probe_output(image, output, rc=rc, seconds=time.monotonic() - start)
    if not any(result.packages.values()):
        # Every candidate empty means the archive was not reached, not that every package name is wrong.
        tail = "; ".join(result.errors) or " | ".join(output.strip().splitlines()[-3:])
        return ProbeUnavailable(image=image, reason=f"the base's package archive gave no answers (rc {rc}): {tail}")
    return result


def probe_nvcc_max_gcc(
    engine: Engine, image: str, *, cuda_home: str | None = None, timeout: float = 60
) -> tuple[int | None, str] | None:
    """The newest GCC major the CUDA base's nvcc accepts, read from its crt/host_config.h; None if no such base,
    or a base without the toolkit (one whose build stage installs it from NVIDIA's repository)."""
    from builders.engines.vllm.gates import max_gcc_from_host_config

    if not engine.image_exists(image):
        return None
    own = (f"{cuda_home}/include/crt/host_config.h",) if cuda_home else ()
    paths = " ".join(shlex.quote(p) for p in (*own, *HOST_CONFIG_PATHS))
    script = f'for f in {paths}; do if [ -f "$f" ]; then echo "FORGE path $f"; cat "$f"; exit 0; fi; done; exit 3'
    try:
        rc, output = engine.run_once(RunSpec(image=image, command=["sh", "-c", script]), timeout=timeout)
    except EngineError:
        return None
    if rc != 0:
        return None
    match = re.search(r"FORGE path (\S+)", output)
    where = f"{match.group(1) if match else 'crt/host_config.h'} in {image}"
    return max_gcc_from_host_config(output), where
