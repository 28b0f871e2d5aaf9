"""A repeated sweep: the interleaved order of profile runs, each repetition's traffic seed, the host's load
average around each run, and the median and spread (min-max) of every profile × class over the repetitions."""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# What is summarised per profile × class; each a key of report.class_rows and the quantile read from it.
METRICS: dict[str, tuple[str, str | None]] = {
    "ttft_p99_ms": ("ttft_ms", "p99"),
    "itl_p99_ms": ("itl_ms", "p99"),
    "goodput": ("goodput", None),
}
LOADAVG = Path("/proc/loadavg")


def schedule(profiles: int, repeat: int) -> list[tuple[int, int]]:
    """(repetition, profile index) in the order they run: repetition r runs the profiles rotated left by r,
    so no profile always runs first (on a cold host) or last (after the others have heated it)."""
    return [(r, (r + i) % profiles) for r in range(repeat) for i in range(profiles)]


def repetition_seed(seed: int, repetition: int) -> int:
    """The traffic seed of one repetition: the common seed for the first (a single run sends what it always
    did), a hash of (seed, repetition) after it, so every repetition draws other arrivals and prompts."""
    if repetition == 0:
        return seed
    digest = hashlib.sha256(f"forge-sweep:{seed}:{repetition}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def load_average(path: Path = LOADAVG) -> float | None:
    """The host's 1-minute load average, or None where /proc/loadavg cannot be read (not Linux)."""
    try:
        return float(path.read_text(encoding="utf-8").split()[0])
    except (OSError, ValueError, IndexError):
        return None


def metric(row: Mapping[str, Any], name: str) -> float | None:
    key, quantile = METRICS[name]
    value = row.get(key)
    if quantile is not None:
        value = (value or {}).get(quantile)
    return None if value is None else float(value)


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """Median, min and max of the measured values (None, a class with no answer, is left out), and their
    count; every value too, so a claim can compare ranges."""
    measured = [v for v in values if v is not None]
    if not measured:
        return {"median": None, "min": None, "max": None, "n": 0, "values": []}
    return {
        "median": round(statistics.median(measured), 4),
        "min": min(measured),
        "max": max(measured),
        "n": len(measured),
        "values": measured,
    }


def aggregate(repetitions: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per profile over the valid repetitions: per class (`classes`) each metric's spread and how many times
    its gate passed (`gate_passes` of `runs`); and the spread of two per-repetition numbers, the count of
    classes whose gate passed (`gates_passed`) and the mean goodput over classes (`mean_goodput`)."""
    rows: dict[str, dict[str, list[Mapping[str, Any]]]] = {}
    for repetition in repetitions:
        if not repetition.get("valid", True):
            continue
        for name, profile in repetition["profiles"].items():
            for class_name, row in profile["classes"].items():
                rows.setdefault(name, {}).setdefault(class_name, []).append(row)
    out: dict[str, dict[str, Any]] = {}
    for name, classes in rows.items():
        by_class = {
            class_name: {
                **{m: spread([metric(r, m) for r in runs]) for m in METRICS},
                "gate_passes": sum(bool(r["gate_passed"]) for r in runs),
                "runs": len(runs),
            }
            for class_name, runs in classes.items()
        }
        per_run = [
            profile["classes"]
            for repetition in repetitions
            if repetition.get("valid", True) and (profile := repetition["profiles"].get(name))
        ]
        out[name] = {
            "classes": by_class,
            "gates_passed": spread([float(sum(bool(r["gate_passed"]) for r in c.values())) for c in per_run]),
            "mean_goodput": spread(
                [statistics.fmean(r["goodput"] for r in c.values()) if c else None for c in per_run]
            ),
        }
    return out
