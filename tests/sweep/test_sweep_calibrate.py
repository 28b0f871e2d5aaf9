"""Calibration's arithmetic and the validity floor, on real traffic plans and real request records."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from builders.errors import ConfigError
from builders.router.classes import ALL_CLASSES, RequestClass
from builders.smoke.stack import traffic_plan
from builders.sweep.calibrate import Capacity, offered_work, scale_traffic
from builders.sweep.definition import load_sweep, load_sweep_settings
from builders.sweep.report import class_rows, judge_validity, render_markdown
from builders.traffic.plan import TrafficPlan

sys.path.insert(0, str(Path(__file__).resolve().parent))
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
    profiles = {"shared": {"classes": class_rows(overloaded)}, "class-aware": {"classes": class_rows(healthy)}}
    verdict = judge_validity(profiles, reference="shared", floor=0.5, names=list(profiles))
    assert not verdict["valid"] and verdict["served_fraction"] == 0.2 and "1 of 5" in verdict["why"]
    text = render_markdown({"load": "x", "profiles": profiles, "validity": verdict})
    assert "INVALID RUN: shared answered 1 of 5" in text
    # Without shared, the first profile that ran is the reference; 4 of 5 answered clears the floor.
    verdict = judge_validity(
        {"class-aware": profiles["class-aware"]}, reference="shared", floor=0.5, names=["class-aware"]
    )
    assert verdict["valid"] and verdict["reference"] == "class-aware" and verdict["served_fraction"] == 0.8


def test_a_reference_sent_nothing_or_absent_is_never_valid() -> None:
    assert not judge_validity({}, reference="shared", floor=0.5, names=[])["valid"]
    nothing = two_class_result([], [])
    verdict = judge_validity(
        {"shared": {"classes": class_rows(nothing)}}, reference="shared", floor=0.0, names=["shared"]
    )
    assert not verdict["valid"] and verdict["served_fraction"] == 0.0


def test_an_invalid_sweep_has_an_exit_code_of_its_own() -> None:
    # Every module that defines an error kind is imported, so that its exit code counts too.
    import builders.kvlab.command
    import builders.repro.errors  # noqa: F401
    from builders.errors import ForgeError, SweepInvalid

    def kinds(cls: type[ForgeError]) -> list[type[ForgeError]]:
        return [cls, *(k for sub in cls.__subclasses__() for k in kinds(sub))]

    others = {k.exit_code for k in kinds(ForgeError) if k is not SweepInvalid and "exit_code" in vars(k)}
    assert SweepInvalid.exit_code == 15 and SweepInvalid.exit_code not in others


@pytest.mark.parametrize("flag", [["--rate-scale", "0"], ["--load-fraction", "-1"]])
def test_bad_load_flags_are_refused_before_anything_starts(flag: list[str]) -> None:
    from builders.cli import main
    from builders.errors import UsageError

    assert main(["--root", str(ROOT), "sweep", "no-such-image", *flag]) == UsageError.exit_code
