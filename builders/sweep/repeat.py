"""A repeated sweep: the interleaved order of profile runs, each repetition's traffic seed, the host's load
average around each run, and the median and spread (min-max) of every profile × class over the repetitions."""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

from builders.sweep.report_model import ClassRow, ClassSpread, ProfileSpread, Repetition, Spread

# What is summarised per profile × class, read from each run's row (report.class_rows).
METRICS: dict[str, Callable[[ClassRow], float | None]] = {
    "ttft_p99_ms": lambda row: row.ttft_ms.p99,
    "itl_p99_ms": lambda row: row.itl_ms.p99,
    "goodput": lambda row: row.goodput,
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


def metric(row: ClassRow, name: str) -> float | None:
    value = METRICS[name](row)
    return None if value is None else float(value)


def spread(values: Sequence[float | None]) -> Spread:
    """Median, min and max of the measured values (None, a class with no answer, is left out), and their
    count; every value too, so a claim can compare ranges."""
    measured = [v for v in values if v is not None]
    if not measured:
        return Spread(median=None, min=None, max=None, n=0, values=[])
    return Spread(
        median=round(statistics.median(measured), 4),
        min=min(measured),
        max=max(measured),
        n=len(measured),
        values=measured,
    )


def aggregate(repetitions: Sequence[Repetition]) -> dict[str, ProfileSpread]:
    """Per profile over the valid repetitions: per class (`classes`) each metric's spread and how many times
    its gate passed (`gate_passes` of `runs`); and the spread of two per-repetition numbers, the count of
    classes whose gate passed (`gates_passed`) and the mean goodput over classes (`mean_goodput`)."""
    valid = [r for r in repetitions if r.valid is not False]
    rows: dict[str, dict[str, list[ClassRow]]] = {}
    for repetition in valid:
        for name, profile in repetition.profiles.items():
            for class_name, row in profile.classes.items():
                rows.setdefault(name, {}).setdefault(class_name, []).append(row)
    out: dict[str, ProfileSpread] = {}
    for name, classes in rows.items():
        by_class = {
            class_name: ClassSpread(
                ttft_p99_ms=spread([metric(r, "ttft_p99_ms") for r in runs]),
                itl_p99_ms=spread([metric(r, "itl_p99_ms") for r in runs]),
                goodput=spread([metric(r, "goodput") for r in runs]),
                gate_passes=sum(r.gate_passed for r in runs),
                runs=len(runs),
            )
            for class_name, runs in classes.items()
        }
        per_run = [run.classes for repetition in valid if (run := repetition.profiles.get(name))]
        out[name] = ProfileSpread(
            classes=by_class,
            gates_passed=spread([float(sum(r.gate_passed for r in c.values())) for c in per_run]),
            mean_goodput=spread([statistics.fmean(r.goodput for r in c.values()) if c else None for c in per_run]),
        )
    return out
