"""The seed's claims about the serving sweep, each judged on a sweep's aggregate (builders/sweep/repeat.py).

Every claim ends in one verdict with the numbers it was judged on: HOLDS, DOES_NOT_HOLD, NOISE ("cannot be
told apart from noise") or NOT_RUN (a profile it needs was not in the sweep, or measured nothing; never
"holds" then). Noise, for one metric of two profiles: with at least two valid repetitions of each, their
ranges (min-max over the repetitions) overlap; with one, the difference is under MARGIN of the larger value.
A gate is noise when it passed in some valid repetitions and failed in others.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

from builders.sweep.report_model import Claim, ClassSpread, Figure, ProfileSpread, Spread, SpreadFigure, Verdict

HOLDS: Verdict = "holds"
DOES_NOT_HOLD: Verdict = "does not hold"
NOISE: Verdict = "cannot be told apart from noise"
NOT_RUN: Verdict = "not run"
MARGIN = 0.10
"""The relative difference under which two single-run values cannot be told apart."""

SHARED = "shared"
CLASS_AWARE = "class-aware"
PREFIX_AFFINITY = "prefix-affinity"
SLOW_ISOLATION = "slow-isolation"
INTERACTIVE = "interactive"
RAG = "rag"
SLOW_STREAM = "slow_stream"

Aggregate = Mapping[str, ProfileSpread]
Compared = Literal["better", "worse", "noise", "missing"]
Metric = Literal["ttft_p99_ms", "itl_p99_ms", "goodput"]
NOTHING = Spread(median=None, min=None, max=None, n=0, values=[])
"""The spread of a class no valid repetition measured."""


def compare(ours: Spread, theirs: Spread, *, lower_is_better: bool) -> Compared:
    """Whether `ours` (a repeat.spread) is better or worse than `theirs` beyond noise (module docstring)."""
    a, b = ours.median, theirs.median
    if not ours.n or not theirs.n or a is None or b is None:
        return "missing"
    if ours.n >= 2 and theirs.n >= 2:
        assert ours.min is not None and ours.max is not None and theirs.min is not None and theirs.max is not None
        if ours.min <= theirs.max and theirs.min <= ours.max:
            return "noise"
    elif abs(a - b) < MARGIN * max(abs(a), abs(b)) or a == b:
        return "noise"
    return "better" if (a < b) == lower_is_better else "worse"


def gate(entry: ClassSpread | None) -> str:
    """A class's gate over the valid repetitions: pass (every one), fail (none), mixed, or missing."""
    if entry is None or not entry.runs:
        return "missing"
    passes, runs = entry.gate_passes, entry.runs
    return "pass" if passes == runs else "fail" if passes == 0 else "mixed"


def passes_every_class(profile: ProfileSpread) -> str:
    """pass when every class's gate passed in every repetition, fail when one class failed in all, else mixed."""
    gates = [gate(entry) for entry in profile.classes.values()]
    if gates and all(g == "pass" for g in gates):
        return "pass"
    return "fail" if "fail" in gates or not gates else "mixed"


def balance(profile: ProfileSpread) -> tuple[float, float]:
    """The balance key (docs/serving-sweep.md): class gates passed, then mean goodput, over the medians."""
    return (profile.gates_passed.median or 0.0, profile.mean_goodput.median or 0.0)


def spread_of(entry: ClassSpread | None, metric: Metric) -> Spread:
    return NOTHING if entry is None else getattr(entry, metric)


def numbers(agg: Aggregate, profile: str, class_name: str, *metrics: Metric) -> dict[str, Figure]:
    entry = agg[profile].classes.get(class_name)
    out: dict[str, Figure] = {f"{profile} {class_name} gate": gate(entry)}
    for name in metrics:
        value = spread_of(entry, name)
        n = value.n if entry is not None else None
        out[f"{profile} {class_name} {name}"] = SpreadFigure(median=value.median, min=value.min, max=value.max, n=n)
    return out


def verdict(claim: str, result: Verdict, figures: Mapping[str, Figure]) -> Claim:
    return Claim(claim=claim, verdict=result, numbers=dict(figures))


def _missing(claim: str, agg: Aggregate, needs: tuple[str, ...]) -> Claim | None:
    absent = [name for name in needs if name not in agg]
    if absent:
        return verdict(claim, NOT_RUN, {"missing profiles": absent})
    return None


def _from_gate(state: str, *, holds_when: str) -> Verdict:
    if state in ("missing",):
        return NOT_RUN
    if state == "mixed":
        return NOISE
    return HOLDS if state == holds_when else DOES_NOT_HOLD


def shared_fails_interactive(agg: Aggregate) -> Claim:
    claim = "shared fails the interactive gate"
    if (missing := _missing(claim, agg, (SHARED,))) is not None:
        return missing
    figures = numbers(agg, SHARED, INTERACTIVE, "ttft_p99_ms", "itl_p99_ms", "goodput")
    return verdict(claim, _from_gate(gate(agg[SHARED].classes.get(INTERACTIVE)), holds_when="fail"), figures)


def class_aware_best_balance(agg: Aggregate) -> Claim:
    """Class-aware passes interactive's gate and no other profile's balance beats it beyond noise."""
    claim = "class-aware passes the interactive gate and has the best balance"
    if (missing := _missing(claim, agg, (CLASS_AWARE,))) is not None:
        return missing
    others = [name for name in agg if name != CLASS_AWARE]
    if not others:
        return verdict(claim, NOT_RUN, {"missing profiles": ["any profile to compare with"]})
    ours = agg[CLASS_AWARE]
    figures = numbers(agg, CLASS_AWARE, INTERACTIVE, "ttft_p99_ms", "goodput")
    figures["balance (gates passed, mean goodput)"] = {name: balance(agg[name]) for name in agg}
    interactive = _from_gate(gate(ours.classes.get(INTERACTIVE)), holds_when="pass")
    if interactive != HOLDS:
        return verdict(claim, interactive, figures)
    outcomes: list[Compared] = []
    for name in others:
        by_gates = compare(ours.gates_passed, agg[name].gates_passed, lower_is_better=False)
        if by_gates == "noise" and ours.gates_passed.median == agg[name].gates_passed.median:
            # The same number of gates: goodput breaks the tie.
            by_gates = compare(ours.mean_goodput, agg[name].mean_goodput, lower_is_better=False)
        outcomes.append(by_gates)
    figures["against"] = {name: str(outcome) for name, outcome in zip(others, outcomes, strict=True)}
    if "worse" in outcomes:
        return verdict(claim, DOES_NOT_HOLD, figures)
    if "noise" in outcomes or "missing" in outcomes:
        return verdict(claim, NOISE, figures)
    return verdict(claim, HOLDS, figures)


def _improves(claim: str, agg: Aggregate, candidate: str, class_name: str) -> Claim:
    """`candidate`'s TTFT p99 of `class_name` is lower than shared's beyond noise."""
    if (missing := _missing(claim, agg, (candidate, SHARED))) is not None:
        return missing
    figures = numbers(agg, candidate, class_name, "ttft_p99_ms", "goodput")
    figures |= numbers(agg, SHARED, class_name, "ttft_p99_ms", "goodput")
    ours = agg[candidate].classes.get(class_name)
    theirs = agg[SHARED].classes.get(class_name)
    outcome = compare(spread_of(ours, "ttft_p99_ms"), spread_of(theirs, "ttft_p99_ms"), lower_is_better=True)
    result: Verdict = {"better": HOLDS, "worse": DOES_NOT_HOLD, "noise": NOISE, "missing": NOT_RUN}[outcome]
    return verdict(claim, result, figures)


def prefix_affinity_improves_rag(agg: Aggregate) -> Claim:
    return _improves("prefix-affinity improves RAG over shared (RAG TTFT p99)", agg, PREFIX_AFFINITY, RAG)


def slow_isolation_improves_slow_stream(agg: Aggregate) -> Claim:
    claim = "slow-isolation improves slow_stream over shared (slow_stream TTFT p99)"
    return _improves(claim, agg, SLOW_ISOLATION, SLOW_STREAM)


def neither_specialist_passes_everything(agg: Aggregate) -> Claim:
    claim = "neither prefix-affinity nor slow-isolation passes every class"
    if (missing := _missing(claim, agg, (PREFIX_AFFINITY, SLOW_ISOLATION))) is not None:
        return missing
    states = {name: passes_every_class(agg[name]) for name in (PREFIX_AFFINITY, SLOW_ISOLATION)}
    failing = {name: sorted(c for c, e in agg[name].classes.items() if gate(e) != "pass") for name in states}
    figures: dict[str, Figure] = {"passes every class": states, "classes not passed in every repetition": failing}
    if "pass" in states.values():
        return verdict(claim, DOES_NOT_HOLD, figures)
    return verdict(claim, NOISE if "mixed" in states.values() else HOLDS, figures)


def class_aware_isolates_slow_clients(agg: Aggregate) -> Claim:
    """slow_stream's goodput and TTFT p99 under class-aware no worse than under shared beyond noise."""
    claim = "class-aware isolates slow clients (slow_stream goodput and TTFT p99 no worse than shared's)"
    if (missing := _missing(claim, agg, (CLASS_AWARE, SHARED))) is not None:
        return missing
    figures = numbers(agg, CLASS_AWARE, SLOW_STREAM, "ttft_p99_ms", "goodput")
    figures |= numbers(agg, SHARED, SLOW_STREAM, "ttft_p99_ms", "goodput")
    ours = agg[CLASS_AWARE].classes.get(SLOW_STREAM)
    theirs = agg[SHARED].classes.get(SLOW_STREAM)
    outcomes = [
        compare(spread_of(ours, "ttft_p99_ms"), spread_of(theirs, "ttft_p99_ms"), lower_is_better=True),
        compare(spread_of(ours, "goodput"), spread_of(theirs, "goodput"), lower_is_better=False),
    ]
    if "missing" in outcomes:
        return verdict(claim, NOT_RUN, figures)
    return verdict(claim, DOES_NOT_HOLD if "worse" in outcomes else HOLDS, figures)


CLAIMS: tuple[Callable[[Aggregate], Claim], ...] = (
    shared_fails_interactive,
    class_aware_best_balance,
    prefix_affinity_improves_rag,
    slow_isolation_improves_slow_stream,
    neither_specialist_passes_everything,
    class_aware_isolates_slow_clients,
)


def judge(agg: Aggregate) -> list[Claim]:
    """Every claim's verdict on a sweep's aggregate, in the seed's order."""
    return [check(agg) for check in CLAIMS]


def claim_lines(claims: list[Claim]) -> list[str]:
    """One line per claim: its verdict and the medians it was judged on."""
    lines = []
    for entry in claims:
        figures = "; ".join(f"{k}: {_short(v)}" for k, v in entry.numbers.items())
        lines.append(f"claim: {entry.claim}: {entry.verdict.upper()} ({figures})")
    return lines


def _short(value: Figure | tuple[float, float]) -> str:
    if isinstance(value, SpreadFigure):
        if value.median is None:
            return "-"
        if (value.n or 1) > 1 and value.min is not None and value.max is not None:
            return f"{value.median:g} [{value.min:g}-{value.max:g}]"
        return f"{value.median:g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_short(v)}" for k, v in value.items())
    if isinstance(value, tuple):
        return "/".join(f"{v:g}" for v in value)
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "none"
    return str(value)
