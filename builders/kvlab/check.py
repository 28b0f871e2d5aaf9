"""Running the cases: a layout case once per layout, the others once, each to an Outcome."""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from builders.kvlab.cases import CASES, REQUIRED_FEATURES, Case, CaseFailed, Ctx, coverage
from builders.kvlab.layouts import LAYOUTS


@dataclass(frozen=True)
class Outcome:
    case: str
    layout: str | None
    passed: bool
    detail: str
    seconds: float
    comparisons: int
    worst_error: float


def run_case(
    case: Case,
    layout: str | None,
    *,
    layout_bug: str | None = None,
    pool_bug: str | None = None,
    kernel_bug: str | None = None,
) -> Outcome:
    ctx = Ctx(case, layout_name=layout or "paged", layout_bug=layout_bug, pool_bug=pool_bug, kernel_bug=kernel_bug)
    start = time.perf_counter()
    try:
        case.run(ctx)
        passed, detail = True, f"{ctx.comparisons} comparisons, max |error| {ctx.worst:.2g}"
    except (CaseFailed, AssertionError) as exc:
        passed, detail = False, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    except Exception as exc:  # a planted bug may crash a layout: that is a catch too, and says where
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        passed, detail = False, f"{type(exc).__name__}: {exc} ({frame.name}, line {frame.lineno})"
    return Outcome(case.name, layout, passed, detail, time.perf_counter() - start, ctx.comparisons, ctx.worst)


def runs(cases: Sequence[Case] = CASES, layouts: Iterable[str] = LAYOUTS) -> list[tuple[Case, str | None]]:
    names = list(layouts)
    return [(c, name) for c in cases for name in (names if c.target == "layouts" else [None])]


def run_all(cases: Sequence[Case] = CASES, layouts: Iterable[str] = LAYOUTS) -> list[Outcome]:
    return [run_case(c, layout) for c, layout in runs(cases, layouts)]


def uncovered() -> list[str]:
    return [feature for feature, names in coverage().items() if not names]


__all__ = ["REQUIRED_FEATURES", "Outcome", "run_all", "run_case", "uncovered"]
