"""sccache's counters as the compile step prints them (containers/scripts/compiler_cache.py `stop`): one JSON
record between two marker lines, with a segment per backend the compile used (the shared one, then the local
folder after a fallback) and the events that name what failed."""

from __future__ import annotations

import json
import re
from typing import NotRequired, TypedDict

from builders.errors import UsageError

BEGIN = "FORGE-SCCACHE-STATS-BEGIN"
END = "FORGE-SCCACHE-STATS-END"
_BUILDKIT_PREFIX = re.compile(r"^#\d+ \d+\.\d+ ")
_COUNTERS = ("requests", "hits", "misses", "errors", "writes", "not_cacheable")


class BackendEntry(TypedDict):
    """One backend's counters over the compile (the report's BackendCounters); ccache gives the first four."""

    requests: NotRequired[int]
    hits: int
    misses: int
    errors: int
    writes: NotRequired[int]
    not_cacheable: NotRequired[int]
    hit_rate: float | None


class CompilerCacheEntry(TypedDict):
    """The compile's launcher and what each backend gave (the report's CompilerCacheRecord)."""

    launcher: str
    backend: str
    endpoint: str
    backends: dict[str, BackendEntry]
    fallback: list[str]


def record_block(log: str) -> str | None:
    """The text between the last BEGIN/END pair, BuildKit's step prefixes removed; None without one."""
    block: list[str] | None = None
    found: str | None = None
    for raw in log.splitlines():
        line = _BUILDKIT_PREFIX.sub("", raw).rstrip("\r")
        if line == BEGIN:
            block = []
        elif line == END and block is not None:
            found, block = "\n".join(block), None
        elif block is not None:
            block.append(line)
    return found


def parse_record(text: str, *, where: str = "build log") -> CompilerCacheEntry:
    """The record as the report keeps it: per backend its counters and hit rate, and the fallback events."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{where}: the compiler cache's counters are not JSON ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise UsageError(f"{where}: the compiler cache's counters have no segments")
    sums: dict[str, dict[str, int]] = {}
    for segment in data["segments"]:
        name = str(segment.get("backend", "?"))
        summed = sums.setdefault(name, dict.fromkeys(_COUNTERS, 0))
        for key in _COUNTERS:
            summed[key] += int(segment.get(key) or 0)
    backends: dict[str, BackendEntry] = {}
    for name, c in sums.items():
        total = c["hits"] + c["misses"]
        backends[name] = {
            "requests": c["requests"],
            "hits": c["hits"],
            "misses": c["misses"],
            "errors": c["errors"],
            "writes": c["writes"],
            "not_cacheable": c["not_cacheable"],
            "hit_rate": round(c["hits"] / total, 4) if total else None,
        }
    return {
        "launcher": "sccache",
        "backend": str(data.get("backend", "?")),
        "endpoint": str(data.get("endpoint", "")),
        "backends": backends,
        "fallback": [str(e) for e in data.get("events") or []],
    }


def record_from_log(log: str, *, where: str = "build log") -> CompilerCacheEntry | None:
    block = record_block(log)
    return None if block is None else parse_record(block, where=where)
