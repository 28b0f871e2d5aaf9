"""run_sweep with --repeat, its stack replaced by a stand-in that answers from real traffic records: the
interleaved running order, each repetition's seed reaching the traffic, the load average around each run,
and the claims and aggregate in sweep.json."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import cast

import pytest
from rich.console import Console
from smoke_stand_in import SmokeRunStandIn
from sweep_records import streamed

from builders.records import ReportInvalid
from builders.router.classes import RequestClass
from builders.smoke.plan import StackPlan
from builders.smoke.report import SmokeReport
from builders.smoke.stack import traffic_plan
from builders.sweep import run as sweep_run
from builders.sweep.definition import SweepSettings, load_sweep
from builders.sweep.repeat import repetition_seed
from builders.sweep.report_model import SweepReport
from builders.traffic.results import TrafficResult

ROOT = Path(__file__).resolve().parents[2]


class StandIn(SmokeRunStandIn):
    """SmokeRun's surface that run_sweep uses: it calls the traffic hook as SmokeRun does, then answers every
    planned class with four requests (shared's interactive ones too late for the 1 s SLO)."""

    def execute(self) -> SmokeReport:
        profile = self.options.profile
        plan = self.before_traffic(cast(StackPlan, None), "key", traffic_plan(profile, "test"))
        ran.append((profile.name, plan.seed))
        records = []
        for request_class in RequestClass:
            if plan.for_class(request_class).count == 0:
                continue
            ttft = 2.0 if profile.name == "shared" and request_class is RequestClass.INTERACTIVE else 0.05
            records += [streamed(request_class, i, ttft) for i in range(4)]
        self.results["main"] = TrafficResult.build(plan, records, wall_s=10.0, stopped_by="completed")
        return self.report


ran: list[tuple[str, int]] = []
"""(profile, traffic seed) of every stand-in run, in running order."""


def test_a_repeated_sweep_interleaves_reseeds_and_records_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran.clear()
    monkeypatch.setattr(sweep_run, "SmokeRun", StandIn)
    loads = iter(float(n) for n in range(100))
    monkeypatch.setattr(sweep_run, "load_average", lambda: next(loads))
    profiles = load_sweep(["shared", "class-aware", "slow-isolation"], root=ROOT)
    seed = traffic_plan(profiles[0].profile, "test").seed
    sweep_run.run_sweep(
        sweep_run.SweepOptions(
            profiles=profiles,
            report_dir=tmp_path,
            plots=False,
            settings=SweepSettings(calibrate=False),
            repeat=3,
        ),
        replicas=lambda *a: None,  # type: ignore[arg-type]
        router=lambda *a: None,  # type: ignore[arg-type]
        console=Console(file=io.StringIO()),
    )
    seeds = [seed, repetition_seed(seed, 1), repetition_seed(seed, 2)]
    assert ran == [
        ("shared", seeds[0]),
        ("class-aware", seeds[0]),
        ("slow-isolation", seeds[0]),
        ("class-aware", seeds[1]),
        ("slow-isolation", seeds[1]),
        ("shared", seeds[1]),
        ("slow-isolation", seeds[2]),
        ("shared", seeds[2]),
        ("class-aware", seeds[2]),
    ]
    written = json.loads((tmp_path / "sweep.json").read_text(encoding="utf-8"))
    assert written["repeat"] == 3 and written["seeds"] == seeds
    assert [r["order"] for r in written["repetitions"]][1] == ["class-aware", "slow-isolation", "shared"]
    # The first run's traffic started at load 0.0 and its run ended at 1.0; the second run's at 2.0 and 3.0.
    assert written["repetitions"][0]["profiles"]["shared"]["load_average_1m"] == {"start": 0.0, "end": 1.0}
    assert written["repetitions"][0]["profiles"]["class-aware"]["load_average_1m"] == {"start": 2.0, "end": 3.0}
    assert written["profiles"]["shared"]["seed"] == seed
    assert written["validity"]["valid"] and all(r["valid"] for r in written["repetitions"])
    assert written["aggregate"]["shared"]["classes"]["interactive"]["gate_passes"] == 0
    assert written["aggregate"]["shared"]["classes"]["interactive"]["runs"] == 3
    verdicts = {c["claim"]: c["verdict"] for c in written["claims"]}
    assert verdicts["shared fails the interactive gate"] == "holds"
    assert list(verdicts.values()).count("not run") == 2  # prefix-affinity is not in this sweep
    assert "## Claims" in (tmp_path / "sweep.md").read_text(encoding="utf-8")
    # The file run_sweep wrote reads back through its model, the claims' figures included; an edited one is
    # refused naming each field that is wrong.
    assert SweepReport.read(tmp_path / "sweep.json").as_json() == written
    written["claims"][0]["verdict"] = "probably"
    del written["aggregate"]["shared"]["classes"]["interactive"]["runs"]
    (tmp_path / "sweep.json").write_text(json.dumps(written), encoding="utf-8")
    with pytest.raises(ReportInvalid) as caught:
        SweepReport.read(tmp_path / "sweep.json")
    assert "sweep.json: claims.0.verdict: Input should be 'holds', 'does not hold'" in caught.value.message
    assert "sweep.json: aggregate.shared.classes.interactive.runs: Field required" in caught.value.message


class Interrupted(StandIn):
    """A profile run that Ctrl-C stops during its traffic, as SmokeRun records it in its own report."""

    def execute(self) -> SmokeReport:
        if self.options.profile.name != "class-aware":
            return super().execute()
        self.report.result, self.report.ended_in, self.running = "interrupted", "traffic", "teardown"
        raise KeyboardInterrupt


def test_an_interrupted_sweep_keeps_what_it_measured_and_names_the_profile_and_its_phase(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran.clear()
    monkeypatch.setattr(sweep_run, "SmokeRun", Interrupted)
    monkeypatch.setattr(sweep_run, "load_average", lambda: 1.0)
    with pytest.raises(KeyboardInterrupt):
        sweep_run.run_sweep(
            sweep_run.SweepOptions(
                profiles=load_sweep(["shared", "class-aware", "slow-isolation"], root=ROOT),
                report_dir=tmp_path,
                plots=False,
                settings=SweepSettings(calibrate=False),
            ),
            replicas=lambda *a: None,  # type: ignore[arg-type]
            router=lambda *a: None,  # type: ignore[arg-type]
            console=Console(file=io.StringIO()),
        )
    assert [name for name, _ in ran] == ["shared"]
    report = SweepReport.read(tmp_path / "sweep.json")
    assert (report.result, report.signal, report.ended_in, report.ended_in_phase) == (
        "interrupted",
        "SIGINT",
        "class-aware",
        "traffic",
    )
    assert list(report.profiles) == ["shared"] and report.claims is None and report.validity is None
    assert not (tmp_path / "sweep.md").exists()
