"""The planted bugs: each layout's (see `Layout.bugs`) and the pool's, run against the cases.

A mutant is a layout, or the pool, with one planted bug. It is caught when at least one case fails against it,
and survives when every case passes: then the cases cannot tell that layout from a broken one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from builders.kvlab.cases import CASES, Case
from builders.kvlab.check import run_case
from builders.kvlab.kernel import KERNEL_BUGS
from builders.kvlab.layouts import LAYOUTS
from builders.kvlab.pool import POOL_BUGS

POOL_BUG_WHY = {
    "no-hit-cap": "lets a prefix hit cover the whole prompt, leaving no token to compute",
    "mru-eviction": "puts freed blocks at the head of the free queue, evicting the most recently used first",
    "window-frees-extra": "frees the block that holds the sliding window's first key",
    "append-not-atomic": "fails an append half way when blocks run out, keeping tokens the caller never wrote",
    "parentless-hash": "hashes a full block's tokens without its parent's hash, so equal blocks at other positions hit",
    "one-copy-per-hash": "caches only the first copy of a block, so evicting it loses a hash another copy still holds",
    "stale-hash-after-eviction": "leaves an evicted block in the cache map, so a hit serves a block holding other tokens",
    "hash-without-separator": "joins a block's token ids with nothing between them, so [1, 23] and [12, 3] collide",
    "free-keeps-request": "keeps a finished request's id registered, so a later request with that id is refused",
    "hit-skips-hole": "looks past an evicted block in a cached chain, serving later blocks after a gap",
}


@dataclass(frozen=True)
class Mutant:
    target: str
    """A layout's name, "pool", or "kernel" (the kernel every layout calls)."""
    bug: str
    why: str


def mutants() -> list[Mutant]:
    out = [Mutant(name, bug, why) for name, cls in LAYOUTS.items() for bug, why in cls.bugs.items()]
    out += [Mutant("kernel", bug, why) for bug, (_, why) in KERNEL_BUGS.items()]
    return out + [Mutant("pool", bug, POOL_BUG_WHY[bug]) for bug in POOL_BUGS]


@dataclass(frozen=True)
class MutantOutcome:
    mutant: Mutant
    caught_by: str | None
    detail: str
    cases_run: int


def run_mutant(mutant: Mutant, cases: Sequence[Case] = CASES) -> MutantOutcome:
    """Cases in order until one fails. A pool bug runs the pool cases and every layout case on `paged`; a kernel
    bug every layout case on every layout, and the oracle cases that call the kernel directly."""
    ran = 0
    if mutant.target == "pool":
        # The pool's own cases first, the seconds-long fuzz last: most pool bugs show in a direct case.
        cases = sorted(cases, key=lambda c: (c.target != "pool", "pool-invariants" in c.features))
    for case in cases:
        if mutant.target == "kernel":
            names = list(LAYOUTS) if case.target == "layouts" else [None] if case.target == "oracle" else []
            for name in names:
                outcome = run_case(case, name, kernel_bug=mutant.bug)
                ran += 1
                if not outcome.passed:
                    where = f"{case.name} on {name}" if name else case.name
                    return MutantOutcome(mutant, where, outcome.detail, ran)
            continue
        if mutant.target == "pool":
            if case.target not in ("pool", "layouts"):
                continue
            outcome = run_case(case, "paged", pool_bug=mutant.bug)
        else:
            if case.target != "layouts":
                continue
            outcome = run_case(case, mutant.target, layout_bug=mutant.bug)
        ran += 1
        if not outcome.passed:
            return MutantOutcome(mutant, case.name, outcome.detail, ran)
    return MutantOutcome(mutant, None, "every case passed", ran)
