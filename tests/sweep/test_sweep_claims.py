"""A repeated sweep and the seed's claims, on class rows built from real traffic records: the interleaved
order, the repetitions' seeds, medians and spreads, and every claim's verdicts (holds, does not hold, noise,
not run)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sweep_records import profile_run, repetition, streamed

from builders.router.classes import RequestClass
from builders.sweep import claims
from builders.sweep.repeat import aggregate, load_average, repetition_seed, schedule
from builders.sweep.report import class_rows
from builders.sweep.report_model import Claim, ProfileRun, ProfileSpread, Spread, SpreadFigure
from builders.sweep.run import repetitions_validity
from builders.traffic.plan import TrafficPlan
from builders.traffic.results import TrafficResult

INTER, RAG, SLOW = RequestClass.INTERACTIVE, RequestClass.RAG, RequestClass.SLOW_STREAM
PLAN = TrafficPlan.model_validate(
    {
        "model": "m",
        "max_model_len": 1024,
        "interactive": {"count": 4, "rate_per_s": 1.0, "max_tokens": 4, "slo": {"ttft_p99_ms": 500}},
        "rag": {"count": 4, "rate_per_s": 1.0, "max_tokens": 4, "slo": {"ttft_p99_ms": 1000}},
        "slow_stream": {"count": 4, "rate_per_s": 1.0, "max_tokens": 4, "slo": {"ttft_p99_ms": 1000}},
    }
)
FAST = {INTER: 0.1, RAG: 0.2, SLOW: 0.2}


def run(**ttfts: float | None) -> ProfileRun:
    """One profile run's record: four requests per class, each answered after the class's TTFT (seconds;
    None: every request failed); classes not named answer fast."""
    by_class = {c: ttfts.get(c.value, FAST[c]) for c in (INTER, RAG, SLOW)}
    records = [streamed(c, i, t) for c, t in by_class.items() for i in range(4)]
    return profile_run(class_rows(TrafficResult.build(PLAN, records, wall_s=10.0, stopped_by="completed")))


def sweep(*repetitions: dict[str, ProfileRun]) -> dict[str, ProfileSpread]:
    """The aggregate of repetitions, each {profile: run(...)}, all valid."""
    return aggregate([repetition(i, p, valid=True) for i, p in enumerate(repetitions)])


def verdict(check: Callable[[claims.Aggregate], Claim], agg: dict[str, ProfileSpread]) -> str:
    result = check(agg)
    # What sweep.json holds reads back as the same claim.
    assert Claim.model_validate_json(result.model_dump_json(by_alias=True)) == result
    return result.verdict


def test_repetitions_rotate_the_profiles_order_by_one() -> None:
    assert schedule(3, 3) == [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (1, 0), (2, 2), (2, 0), (2, 1)]
    # With as many repetitions as profiles, every profile runs first (and last) exactly once.
    firsts = [p for r, p in schedule(4, 4) if (r, p) == next(x for x in schedule(4, 4) if x[0] == r)]
    assert sorted(firsts) == [0, 1, 2, 3]
    assert schedule(2, 1) == [(0, 0), (0, 1)]


def test_repetition_seeds_are_derived_from_the_common_seed_and_the_index() -> None:
    assert repetition_seed(11, 0) == 11
    seeds = [repetition_seed(11, r) for r in range(5)]
    assert seeds == [repetition_seed(11, r) for r in range(5)]
    assert len(set(seeds)) == 5
    assert repetition_seed(12, 1) != repetition_seed(11, 1)
    assert all(0 <= s < 2**31 for s in seeds)


def test_load_average_reads_the_first_field(tmp_path: Path) -> None:
    path = tmp_path / "loadavg"
    path.write_text("3.25 2.00 1.50 2/300 4242\n", encoding="utf-8")
    assert load_average(path) == 3.25
    assert load_average(tmp_path / "missing") is None


def test_median_and_spread_over_repetitions() -> None:
    agg = sweep({"shared": run(rag=0.3)}, {"shared": run(rag=0.1)}, {"shared": run(rag=0.2)})
    ttft = agg["shared"].classes["rag"].ttft_p99_ms
    assert ttft.n == 3 and ttft.min == pytest.approx(100, abs=1)
    assert ttft.median == pytest.approx(200, abs=1) and ttft.max == pytest.approx(300, abs=1)
    assert agg["shared"].classes["interactive"].gate_passes == 3
    assert agg["shared"].gates_passed.median == 3.0


def test_an_invalid_repetition_is_reported_and_left_out_of_the_medians() -> None:
    reps = [
        repetition(0, {"shared": run(rag=0.2)}),
        repetition(1, {"shared": run(interactive=None, rag=None, slow_stream=None)}),
        repetition(2, {"shared": run(rag=0.4)}),
    ]
    validity = repetitions_validity(reps, floor=0.5)
    assert validity.valid and [r.valid for r in reps] == [True, False, True]
    assert "2 of 3 repetitions valid" in validity.why and "repetition 1" in validity.why
    agg = aggregate(reps)
    assert agg["shared"].classes["rag"].ttft_p99_ms.n == 2
    assert agg["shared"].classes["interactive"].runs == 2
    assert not repetitions_validity(reps[1:2], floor=0.5).valid


def test_noise_is_overlapping_ranges_or_a_small_single_run_difference() -> None:
    def spread(*values: float) -> Spread:
        median = sorted(values)[len(values) // 2]
        return Spread(median=median, min=min(values), max=max(values), n=len(values), values=list(values))

    assert claims.compare(spread(100, 200), spread(150, 300), lower_is_better=True) == "noise"
    assert claims.compare(spread(100, 140), spread(150, 300), lower_is_better=True) == "better"
    assert claims.compare(spread(100, 140), spread(150, 300), lower_is_better=False) == "worse"
    assert claims.compare(spread(100), spread(105), lower_is_better=True) == "noise"
    assert claims.compare(spread(100), spread(120), lower_is_better=True) == "better"
    assert claims.compare(claims.NOTHING, spread(1), lower_is_better=True) == "missing"


def test_shared_fails_interactive() -> None:
    check = claims.shared_fails_interactive
    assert verdict(check, sweep({"shared": run(interactive=2.0)})) == claims.HOLDS
    assert verdict(check, sweep({"shared": run()})) == claims.DOES_NOT_HOLD
    assert verdict(check, sweep({"shared": run(interactive=2.0)}, {"shared": run()})) == claims.NOISE
    assert verdict(check, sweep({"class-aware": run()})) == claims.NOT_RUN


def test_prefix_affinity_improves_rag_beyond_noise() -> None:
    check = claims.prefix_affinity_improves_rag
    better = sweep(
        {"shared": run(rag=0.8), "prefix-affinity": run(rag=0.2)},
        {"shared": run(rag=0.9), "prefix-affinity": run(rag=0.3)},
    )
    assert verdict(check, better) == claims.HOLDS
    figure = check(better).numbers["prefix-affinity rag ttft_p99_ms"]
    assert isinstance(figure, SpreadFigure) and figure.median == pytest.approx(250, abs=1)
    worse = sweep({"shared": run(rag=0.2), "prefix-affinity": run(rag=0.8)})
    assert verdict(check, worse) == claims.DOES_NOT_HOLD
    overlapping = sweep(
        {"shared": run(rag=0.5), "prefix-affinity": run(rag=0.3)},
        {"shared": run(rag=0.4), "prefix-affinity": run(rag=0.6)},
    )
    assert verdict(check, overlapping) == claims.NOISE
    # One run each, 4 % apart: under the 10 % margin.
    assert verdict(check, sweep({"shared": run(rag=0.50), "prefix-affinity": run(rag=0.48)})) == claims.NOISE
    assert verdict(check, sweep({"prefix-affinity": run(rag=0.1)})) == claims.NOT_RUN


def test_slow_isolation_improves_slow_stream() -> None:
    check = claims.slow_isolation_improves_slow_stream
    assert verdict(check, sweep({"shared": run(slow_stream=0.9), "slow-isolation": run()})) == claims.HOLDS
    assert verdict(check, sweep({"shared": run(), "slow-isolation": run(slow_stream=0.9)})) == claims.DOES_NOT_HOLD
    assert verdict(check, sweep({"slow-isolation": run()})) == claims.NOT_RUN


def test_neither_specialist_passes_every_class() -> None:
    check = claims.neither_specialist_passes_everything
    both_fail = sweep({"prefix-affinity": run(interactive=2.0), "slow-isolation": run(rag=3.0)})
    assert verdict(check, both_fail) == claims.HOLDS
    failing = check(both_fail).numbers["classes not passed in every repetition"]
    assert isinstance(failing, dict) and failing["slow-isolation"] == ["rag"]
    one_passes = sweep({"prefix-affinity": run(), "slow-isolation": run(rag=3.0)})
    assert verdict(check, one_passes) == claims.DOES_NOT_HOLD
    mixed = sweep(
        {"prefix-affinity": run(interactive=2.0), "slow-isolation": run(rag=3.0)},
        {"prefix-affinity": run(interactive=2.0), "slow-isolation": run()},
    )
    assert verdict(check, mixed) == claims.NOISE
    assert verdict(check, sweep({"prefix-affinity": run(interactive=2.0)})) == claims.NOT_RUN


def test_class_aware_passes_interactive_and_has_the_best_balance() -> None:
    check = claims.class_aware_best_balance
    best = sweep({"shared": run(interactive=2.0), "class-aware": run()})
    assert verdict(check, best) == claims.HOLDS
    balances = check(best).numbers["balance (gates passed, mean goodput)"]
    assert isinstance(balances, dict) and balances["class-aware"][0] == 3.0
    interactive_fails = sweep({"shared": run(interactive=2.0), "class-aware": run(interactive=2.0, rag=3.0)})
    assert verdict(check, interactive_fails) == claims.DOES_NOT_HOLD
    beaten = sweep({"latency": run(), "class-aware": run(rag=3.0)})
    assert verdict(check, beaten) == claims.DOES_NOT_HOLD
    # Same gates passed, goodput equal: the tie cannot be broken.
    tied = sweep({"latency": run(), "class-aware": run()})
    assert verdict(check, tied) == claims.NOISE
    assert verdict(check, sweep({"class-aware": run()})) == claims.NOT_RUN
    assert verdict(check, sweep({"shared": run()})) == claims.NOT_RUN


def test_class_aware_isolates_slow_clients_unless_worse_beyond_noise() -> None:
    check = claims.class_aware_isolates_slow_clients
    assert verdict(check, sweep({"shared": run(slow_stream=0.9), "class-aware": run()})) == claims.HOLDS
    # 4 % slower in one run: inside the margin, so no worse beyond noise.
    assert (
        verdict(check, sweep({"shared": run(slow_stream=0.50), "class-aware": run(slow_stream=0.52)})) == claims.HOLDS
    )
    worse = sweep({"shared": run(), "class-aware": run(slow_stream=3.0)})
    assert verdict(check, worse) == claims.DOES_NOT_HOLD
    assert verdict(check, sweep({"class-aware": run()})) == claims.NOT_RUN


def test_no_claim_holds_on_an_empty_sweep() -> None:
    assert [c.verdict for c in claims.judge({})] == [claims.NOT_RUN] * len(claims.CLAIMS)
    lines = claims.claim_lines(claims.judge(sweep({"shared": run(interactive=2.0)})))
    assert lines[0].startswith("claim: shared fails the interactive gate: HOLDS (")
    assert "NOT RUN" in lines[2]
