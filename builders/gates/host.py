"""Facts about the machine preflight runs on: memory, cores, CPU flags, mounts and free space.

Parsers take text so tests feed them files written into tmp_path; readers default to the live /proc and /sys.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3
# cgroup v1 reports "no limit" as a page-aligned number near 2**63.
_UNLIMITED = 2**60


@dataclass(frozen=True, kw_only=True)
class Memory:
    available: int  # bytes a build may use now
    total: int  # bytes of RAM (or the cgroup limit, when lower)
    source: str  # where the number came from, for a finding's source column


@dataclass(frozen=True, kw_only=True)
class Mount:
    device: str
    mountpoint: str
    fstype: str
    options: tuple[str, ...]

    @property
    def size_bytes(self) -> int | None:
        """tmpfs size= option (k/m/g suffixes or bytes); None when absent (then it is half of RAM)."""
        for opt in self.options:
            if opt.startswith("size="):
                return parse_size(opt[5:])
        return None


def parse_size(text: str) -> int | None:
    match = re.fullmatch(r"(\d+)([kKmMgGtT%]?)", text.strip())
    if not match or match.group(2) == "%":
        return None
    factor = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}[match.group(2).lower()]
    return int(match.group(1)) * factor


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as bytes by key."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r"(\w+(?:\(\w+\))?):\s+(\d+)(?:\s+kB)?", line)
        if match:
            value = int(match.group(2))
            out[match.group(1)] = value * 1024 if line.rstrip().endswith("kB") else value
    return out


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max" or not text.isdigit():
        return None
    value = int(text)
    return None if value >= _UNLIMITED else value


def cgroup_memory(root: Path = Path("/sys/fs/cgroup")) -> tuple[int, int, str] | None:
    """(limit, usage, file) of the memory cgroup this process runs in, v2 first; None when unlimited."""
    candidates = [
        (root / "memory.max", root / "memory.current"),
        (root / "memory" / "memory.limit_in_bytes", root / "memory" / "memory.usage_in_bytes"),
    ]
    for limit_file, usage_file in candidates:
        limit = _read_int(limit_file)
        if limit is not None:
            return limit, _read_int(usage_file) or 0, str(limit_file)
    return None


def read_memory(meminfo: Path = Path("/proc/meminfo"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> Memory:
    info = parse_meminfo(meminfo.read_text())
    available = info.get("MemAvailable", info.get("MemFree", 0))
    total = info.get("MemTotal", available)
    source = f"host {meminfo} MemAvailable"
    cgroup = cgroup_memory(cgroup_root)
    if cgroup is not None:
        limit, usage, where = cgroup
        if limit - usage < available:
            available, source = max(limit - usage, 0), f"cgroup {where}"
        total = min(total, limit)
    return Memory(available=available, total=total, source=source)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def parse_cpu_flags(cpuinfo: str) -> frozenset[str]:
    """Flags of the first processor in /proc/cpuinfo (x86 `flags`, Arm `Features`)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in {"flags", "Features"}:
            return frozenset(value.split())
    return frozenset()


def read_cpu_flags(path: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    return parse_cpu_flags(path.read_text())


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mounts(text: str) -> list[Mount]:
    mounts: list[Mount] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            mounts.append(
                Mount(
                    device=_unescape(parts[0]),
                    mountpoint=_unescape(parts[1]),
                    fstype=parts[2],
                    options=tuple(parts[3].split(",")),
                )
            )
    return mounts


def mount_for(path: Path, mounts: list[Mount]) -> Mount | None:
    """The mount a path lives on: the longest mountpoint that contains it; the last one wins when stacked."""
    resolved = existing_ancestor(path).resolve()
    best: Mount | None = None
    for mount in mounts:
        point = Path(mount.mountpoint)
        if (resolved == point or point in resolved.parents) and (
            best is None or len(mount.mountpoint) >= len(best.mountpoint)
        ):
            best = mount
    return best


def existing_ancestor(path: Path) -> Path:
    """The path itself or its nearest existing parent: a scratch dir not made yet will live on the parent's disk."""
    current = path.absolute()
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def free_bytes(path: Path) -> tuple[int, Path]:
    where = existing_ancestor(path)
    st = os.statvfs(where)
    return st.f_bavail * st.f_frsize, where


def derive_max_jobs(mem_bytes: int | None = None, cores: int | None = None, per_job_gb: float = 3.0) -> int:
    """Parallel compile jobs that fit: one per core, no more than memory / peak RSS per job, at least one.

    Unset arguments are read from this host (available memory, usable cores); the planner and the RAM gate
    share this one rule.
    """
    mem = read_memory().available if mem_bytes is None else mem_bytes
    cpus = usable_cores() if cores is None else cores
    per_job = max(per_job_gb, 0.1) * GIB
    return max(1, min(max(cpus, 1), int(mem // per_job)))


@dataclass(frozen=True, kw_only=True)
class HostFacts:
    memory: Memory
    cores: int
    cpu_flags: frozenset[str]
    mounts: tuple[Mount, ...]


def read_host_facts() -> HostFacts:
    try:
        mounts_text = Path("/proc/mounts").read_text()
    except OSError:
        mounts_text = ""
    try:
        flags = read_cpu_flags()
    except OSError:
        flags = frozenset()
    return HostFacts(
        memory=read_memory(), cores=usable_cores(), cpu_flags=flags, mounts=tuple(parse_mounts(mounts_text))
    )
