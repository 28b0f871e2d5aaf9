"""Calibration's arithmetic and the validity floor, on real traffic plans and real request records."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

from builders.errors import ConfigError
from builders.router.classes import ALL_CLASSES, RequestClass
from builders.smoke.stack import traffic_plan
from builders.sweep.calibrate import (
    Capacity,
    LoadSize,
    ModelSize,
    arrivals_within,
    offered_work,
    scale_traffic,
    size_load,
    smaller_model,
    work_of,
)
from builders.sweep.definition import load_sweep, load_sweep_settings
from builders.sweep.report import class_rows, judge_validity, render_markdown, summary_lines
from builders.sweep.report_model import Calibration, ModelSizeRecord, Resize
from builders.sweep.run import model_size, resized
from builders.traffic.plan import TrafficPlan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_records import profile_run, sweep_of
from test_sweep_report import result as two_class_result

ROOT = Path(__file__).resolve().parents[2]


def capacity(prefill: float, decode: float) -> Capacity:
    return Capacity(
        replica="shared/0",
        cpus="0",
        prefill_tokens_per_s=prefill,
        decode_tokens_per_s={1: decode / 4, 16: decode},
        seconds=1.0,
    )


def sweep_traffic() -> TrafficPlan:
    shared = load_sweep(["shared"], root=ROOT)[0]
    return traffic_plan(shared.profile, str(shared.path))


def test_work_is_each_rate_times_its_prompt_at_the_prefill_rate_plus_its_output_at_the_decode_rate() -> None:
    plan = sweep_traffic()
    expected = 0.0
    for c in ALL_CLASSES:
        cp = plan.for_class(c)
        turns = plan.agent.turns if c is RequestClass.AGENT else 1
        assert cp.rate_per_s is not None
        expected += cp.rate_per_s * turns * (plan.prompt_tokens_at_most(c) / 1000.0 + cp.max_tokens / 200.0)
    assert offered_work(plan, capacity(1000.0, 200.0)) == pytest.approx(expected)
    # Twice the capacity: half the replica-seconds for the same plan.
    assert offered_work(plan, capacity(2000.0, 400.0)) == pytest.approx(expected / 2)


def test_scaling_keeps_the_arrivals_spread_over_the_whole_deadline() -> None:
    plan = sweep_traffic()
    down = scale_traffic(plan, 0.25)
    assert down.interactive.rate_per_s == pytest.approx(plan.interactive.rate_per_s * 0.25)  # type: ignore[operator]
    assert down.interactive.count == plan.interactive.count
    up = scale_traffic(plan, 10.0)
    assert up.long_prefill.rate_per_s == pytest.approx(plan.long_prefill.rate_per_s * 10)  # type: ignore[operator]
    assert up.long_prefill.count == math.ceil(plan.long_prefill.count * 10)
    assert up.max_total_requests == plan.max_total_requests * 10
    # Work scales with the rates, so the factor calibration picks lands the estimate on the fraction.
    cap = capacity(800.0, 150.0)
    assert offered_work(down, cap) == pytest.approx(offered_work(plan, cap) * 0.25)


def test_the_sweep_settings_are_read_from_common_yaml_and_bad_keys_name_the_file() -> None:
    settings = load_sweep_settings(ROOT)
    assert settings.calibrate and settings.load_fraction == 0.5 and settings.served_floor == 0.5
    assert not load_sweep_settings(ROOT, changes={"sweep": {"calibrate": False}}).calibrate
    with pytest.raises(ConfigError, match=r"common.yaml: sweep.load_fractoin"):
        load_sweep_settings(ROOT, changes={"sweep": {"load_fractoin": 0.4}})


def test_a_reference_that_answers_under_the_floor_makes_the_run_invalid() -> None:
    # The forced overload's shape: almost every request of the reference timed out.
    overloaded = two_class_result([None, None, 0.5], [None, None])
    healthy = two_class_result([0.1, 0.2, 0.3], [1.0, None])
    profiles = {"shared": profile_run(class_rows(overloaded)), "class-aware": profile_run(class_rows(healthy))}
    verdict = judge_validity(profiles, reference="shared", floor=0.5, names=list(profiles))
    assert not verdict.valid and verdict.served_fraction == 0.2 and "1 of 5" in verdict.why
    text = render_markdown(sweep_of(profiles, load="x", validity=verdict))
    assert "INVALID RUN: shared answered 1 of 5" in text
    # Without shared, the first profile that ran is the reference; 4 of 5 answered clears the floor.
    verdict = judge_validity(
        {"class-aware": profiles["class-aware"]}, reference="shared", floor=0.5, names=["class-aware"]
    )
    assert verdict.valid and verdict.reference == "class-aware" and verdict.served_fraction == 0.8


def test_a_reference_sent_nothing_or_absent_is_never_valid() -> None:
    assert not judge_validity({}, reference="shared", floor=0.5, names=[]).valid
    nothing = two_class_result([], [])
    verdict = judge_validity(
        {"shared": profile_run(class_rows(nothing))}, reference="shared", floor=0.0, names=["shared"]
    )
    assert not verdict.valid and verdict.served_fraction == 0.0


def test_an_invalid_sweep_has_an_exit_code_of_its_own() -> None:
    # Every module that defines an error kind is imported, so that its exit code counts too.
    import builders.kvlab.command
    import builders.repro.errors  # noqa: F401
    from builders.errors import ForgeError, SweepInvalid

    def kinds(cls: type[ForgeError]) -> list[type[ForgeError]]:
        return [cls, *(k for sub in cls.__subclasses__() for k in kinds(sub))]

    others = {k.exit_code for k in kinds(ForgeError) if k is not SweepInvalid and "exit_code" in vars(k)}
    assert SweepInvalid.exit_code == 15 and SweepInvalid.exit_code not in others


@pytest.mark.parametrize(
    "flag",
    [
        ["--rate-scale", "0"],
        ["--load-fraction", "-1"],
        ["--model-size", "250x3"],
        ["--model-size", "256"],
        ["--repeat", "0"],
    ],
)
def test_bad_load_flags_are_refused_before_anything_starts(flag: list[str]) -> None:
    from builders.cli import main
    from builders.errors import UsageError

    assert main(["--root", str(ROOT), "sweep", "no-such-image", *flag]) == UsageError.exit_code


# The capacity the calibrated image run measured on this 2-core AVX2 host (docs/serving-sweep.md):
# the configured load was 5.4x what two replicas sustain.
SLOW_HOST = Capacity(
    replica="shared/0", cpus="0", prefill_tokens_per_s=226.0, decode_tokens_per_s={1: 16.3, 16: 90.8}, seconds=25.8
)


def sized(plan: TrafficPlan, cap: Capacity, **overrides: float) -> LoadSize:
    settings: dict[str, Any] = {
        "replicas_worth": 2.0,
        "load_fraction": 0.5,
        "min_arrivals": 8,
        "max_window_s": 120.0,
        "min_scale": 0.01,
        "max_scale": 4.0,
    } | overrides
    return size_load(plan, cap, **settings)


def test_an_overloaded_host_thins_no_class_below_its_minimum_and_takes_the_rest_off_the_model() -> None:
    plan = sweep_traffic()
    size = sized(plan, SLOW_HOST)
    # Thinning alone (x0.093) would leave long_prefill and batch with nothing in the window, as it did.
    assert size.wanted_factor == pytest.approx(0.5 / size.configured_utilisation)
    thinned = scale_traffic(plan, size.wanted_factor)
    assert min(arrivals_within(thinned, c, plan.deadline_s) for c in ALL_CLASSES) < 8
    assert size.rate_factor == size.floor_factor > size.wanted_factor
    assert plan.deadline_s < size.window_s <= 120.0 + 1.0
    # The seeded arrivals the runner will send (same seed, scaled rates, the stretched window).
    driven = scale_traffic(plan, size.rate_factor, window_s=size.window_s)
    assert driven.deadline_s == size.window_s
    for c in ALL_CLASSES:
        assert arrivals_within(driven, c, driven.deadline_s) == size.arrivals[c.value] >= 8
    # The least frequent class is exactly at its minimum: the rates were thinned as far as allowed.
    assert min(size.arrivals.values()) == 8
    # What is left over comes off the prefill work: the estimate with the cut lands on the fraction.
    work = work_of(driven, SLOW_HOST)
    assert size.model_ratio < 1
    assert (work.prefill * size.model_ratio + work.decode) / 2 == pytest.approx(0.5)
    assert size.expected_utilisation == pytest.approx(0.5)


def test_a_host_with_room_to_spare_keeps_the_model_and_raises_the_rates_within_the_cap() -> None:
    plan = sweep_traffic()
    fast = Capacity(
        replica="shared/0", cpus="0", prefill_tokens_per_s=1e5, decode_tokens_per_s={1: 500.0, 16: 4000.0}, seconds=1
    )
    size = sized(plan, fast)
    assert size.model_ratio == 1.0 and size.rate_factor == size.wanted_factor == 4.0
    assert size.window_s == plan.deadline_s
    assert size.expected_utilisation == pytest.approx(size.configured_utilisation * 4.0)


def test_a_class_configured_with_fewer_requests_than_the_minimum_is_held_to_its_own_count() -> None:
    plan = sweep_traffic()
    few = plan.model_copy(update={"batch": plan.batch.model_copy(update={"count": 3})})
    size = sized(few, SLOW_HOST)
    assert size.arrivals["batch"] == 3
    assert min(v for k, v in size.arrivals.items() if k != "batch") >= 8


def test_decode_alone_over_the_fraction_asks_for_the_smallest_model() -> None:
    plan = sweep_traffic()
    slow_decode = Capacity(
        replica="shared/0", cpus="0", prefill_tokens_per_s=226.0, decode_tokens_per_s={1: 1.0, 16: 4.0}, seconds=1
    )
    size = sized(plan, slow_decode)
    assert size.model_ratio == 0.0 and size.expected_utilisation > 0.5
    current = ModelSize(hidden_size=1024, num_hidden_layers=8)
    assert smaller_model(current, size.model_ratio) == ModelSize(hidden_size=256, num_hidden_layers=1)


@pytest.mark.parametrize(
    ("ratio", "expected"),
    [
        (1.0, (1024, 8)),
        (0.5, (1024, 4)),  # half the layers is exactly half the cost
        (0.125, (1024, 1)),
        (0.1, (640, 2)),  # 2 x 640^2 is closer under 0.1 x 8 x 1024^2 than 1 x 896^2
        (0.04, (256, 5)),
        (0.001, (256, 1)),  # nothing fits: the smallest
    ],
)
def test_the_resized_model_is_the_largest_that_costs_at_most_the_ratio(ratio: float, expected: tuple[int, int]) -> None:
    current = ModelSize(hidden_size=1024, num_hidden_layers=8)
    smaller = smaller_model(current, ratio)
    assert (smaller.hidden_size, smaller.num_hidden_layers) == expected
    assert smaller.cost <= max(ratio * current.cost, ModelSize(hidden_size=256, num_hidden_layers=1).cost)


def test_a_resized_profile_serves_the_smaller_model_and_keeps_everything_else() -> None:
    shared = load_sweep(["shared"], root=ROOT)[0]
    small = resized(shared, ModelSize(hidden_size=256, num_hidden_layers=5))
    assert model_size(small) == ModelSize(hidden_size=256, num_hidden_layers=5)
    assert small.profile.pools == shared.profile.pools and small.profile.traffic == shared.profile.traffic
    assert small.profile.model.max_model_len == shared.profile.model.max_model_len
    assert model_size(shared) == ModelSize(hidden_size=1024, num_hidden_layers=8)


def test_the_report_says_what_calibration_kept_and_what_it_took_off() -> None:
    size = sized(sweep_traffic(), SLOW_HOST)
    calibration = Calibration(
        calibrated=True,
        capacity=SLOW_HOST.as_json(),
        configured_utilisation=round(size.configured_utilisation, 3),
        replicas_worth=2.0,
        applied_factor=size.rate_factor,
        load_fraction=0.5,
        clamped=True,
        sizing=size.as_json(),
        window_s=round(size.window_s, 1),
        resized=[
            Resize.model_validate(
                {
                    "from": {"hidden_size": 1024, "num_hidden_layers": 8},
                    "to": {"hidden_size": 256, "num_hidden_layers": 5},
                }
            )
        ],
    )
    model = ModelSizeRecord(hidden_size=256, num_hidden_layers=5)
    lines = summary_lines(sweep_of({}, calibration=calibration, model=model, repetitions=[]))
    text = "\n".join(lines)
    assert "(held up by the per-class floor)" in text
    assert f"arrivals in the {round(size.window_s, 1):g} s window (min 8): interactive " in text
    assert f"batch {size.arrivals['batch']}" in text
    assert "8 layers of 1024 -> 5 of 256" in text
