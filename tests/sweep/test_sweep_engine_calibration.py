"""The engine axis calibrates each serving engine on its own replica: run_sweep with its stack replaced by a
stand-in and the measurement by one that answers per engine, the rates each engine's runs are offered, and what
sweep.json and the summary say."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console
from smoke_stand_in import SmokeRunStandIn
from sweep_records import streamed

from builders.router.classes import RequestClass
from builders.smoke.report import SmokeReport
from builders.smoke.stack import traffic_plan
from builders.sweep import run as sweep_run
from builders.sweep.calibrate import Capacity
from builders.sweep.definition import SweepSettings, load_sweep
from builders.sweep.report import summary_lines
from builders.sweep.report_model import SweepReport
from builders.traffic.plan import TrafficPlan
from builders.traffic.results import TrafficResult

ROOT = Path(__file__).resolve().parents[2]
# Prefill tokens/s of one replica by engine: SGLang's replica here is four times slower than vLLM's.
PREFILL = {"vllm": 8000.0, "sglang": 2000.0}
offered: dict[str, TrafficPlan] = {}


class StandIn(SmokeRunStandIn):
    """SmokeRun's surface run_sweep uses: the traffic hook with a plan whose first replica says its engine."""

    def execute(self) -> SmokeReport:
        profile = self.options.profile
        engine = next(iter(profile.pools.values())).engine
        replica = SimpleNamespace(label=f"{engine}/0", cpuset="0", url="http://127.0.0.1:1")
        plan = self.before_traffic(
            SimpleNamespace(replicas=[replica], profile=profile), "key", traffic_plan(profile, "t")
        )
        offered[profile.name] = plan
        records = [streamed(c, i, 0.05) for c in RequestClass if plan.for_class(c).count for i in range(4)]
        self.results["main"] = TrafficResult.build(plan, records, wall_s=10.0, stopped_by="completed")
        return self.report


def _measure(replica: Any, **_: Any) -> Capacity:
    engine = replica.label.split("/")[0]
    decode = {1: PREFILL[engine] / 100, 16: PREFILL[engine] / 10}
    return Capacity(
        replica=replica.label, cpus="0", prefill_tokens_per_s=PREFILL[engine], decode_tokens_per_s=decode, seconds=1
    )


def _sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, per_engine: bool) -> SweepReport:
    offered.clear()
    monkeypatch.setattr(sweep_run, "SmokeRun", StandIn)
    monkeypatch.setattr(sweep_run, "measure", _measure)
    monkeypatch.setattr(sweep_run, "load_average", lambda: 0.0)
    profiles = load_sweep(["shared", "class-aware"], root=ROOT, engines=["vllm", "sglang"])
    # The model as configured: no resize, so the rates alone carry each engine's capacity.
    settings = SweepSettings(calibrate_per_engine=per_engine, resize_model=False, max_scale=100, min_scale=0.0001)
    return sweep_run.run_sweep(
        sweep_run.SweepOptions(profiles=profiles, report_dir=tmp_path, plots=False, settings=settings),
        replicas=lambda *a: None,  # type: ignore[arg-type]
        router=lambda *a: None,  # type: ignore[arg-type]
        console=Console(file=io.StringIO()),
    )


def _rate(name: str) -> float:
    rate = offered[name].for_class(RequestClass.INTERACTIVE).rate_per_s
    assert rate is not None
    return rate


def test_each_engine_is_offered_the_same_share_of_its_own_capacity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = _sweep(tmp_path, monkeypatch, per_engine=True)
    assert list(offered) == ["shared", "shared@sglang", "class-aware", "class-aware@sglang"]
    calibration = report.calibration
    assert calibration.engine == "vllm" and calibration.capacity is not None
    assert calibration.capacity.replica == "vllm/0"
    own = (calibration.engines or {})["sglang"]
    assert own.capacity is not None and own.capacity.prefill_tokens_per_s == PREFILL["sglang"]
    assert own.applied_factor is not None and calibration.applied_factor is not None
    # Every rate scales by one factor per engine, and both land on load_fraction of their own capacity.
    assert _rate("shared@sglang") / _rate("shared") == pytest.approx(
        own.applied_factor / calibration.applied_factor, rel=1e-3
    )
    assert _rate("shared@sglang") < _rate("shared") and _rate("class-aware@sglang") == _rate("shared@sglang")
    assert own.sizing is not None and calibration.sizing is not None
    assert own.sizing.expected_utilisation == pytest.approx(calibration.sizing.expected_utilisation, rel=0.05)
    written = json.loads((tmp_path / "sweep.json").read_text(encoding="utf-8"))
    assert written["calibration"]["engines"]["sglang"]["engine"] == "sglang"
    # What sweep.json holds reads back through the report's model, the per-engine calibration included.
    assert (SweepReport.read(tmp_path / "sweep.json").calibration.engines or {})["sglang"].engine == "sglang"
    assert any(line.startswith("calibration of sglang on sglang/0") for line in summary_lines(report))
    assert any(line.startswith("calibration of vllm on vllm/0") for line in summary_lines(report))


def test_without_per_engine_calibration_every_engine_gets_the_first_engines_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = _sweep(tmp_path, monkeypatch, per_engine=False)
    assert report.calibration.engines is None and len(report.calibration.measurements or []) == 1
    assert "engines" not in json.loads((tmp_path / "sweep.json").read_text(encoding="utf-8"))["calibration"]
    assert _rate("shared@sglang") == _rate("shared")
