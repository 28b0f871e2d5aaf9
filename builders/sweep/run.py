"""Run a sweep: each profile in turn on the same image, the same seeded traffic, one report."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from builders import interrupt
from builders.errors import SmokeFailed
from builders.router.classes import RequestClass
from builders.smoke.plan import StackPlan
from builders.smoke.profile import parse_cpuset
from builders.smoke.runtimes import ReplicaRuntime, RouterRuntime
from builders.smoke.stack import SmokeOptions, SmokeRun, traffic_plan
from builders.sweep.calibrate import describe_rates, measure, offered_work, scale_traffic
from builders.sweep.definition import SweepProfile, SweepSettings
from builders.sweep.report import class_rows, compare_to, judge_validity, render_markdown, write_plots
from builders.traffic.plan import TrafficPlan

REFERENCE = "shared"
SWEEP_FILES = ("sweep.json", "sweep.md", "ttft-cdf.png", "goodput.png")
WORK_CONSERVING = "work-conserving"


@dataclass(frozen=True, kw_only=True)
class SweepOptions:
    profiles: list[SweepProfile]
    report_dir: Path
    base_port: int | None = None
    plots: bool = True
    settings: SweepSettings = field(default_factory=SweepSettings)
    rate_scale: float = 1.0
    """A further factor on every rate after calibration (--rate-scale: a forced overload is 10)."""


def describe_load(first: SweepProfile, plan: TrafficPlan | None = None) -> str:
    """The offered load in words: every open-loop class's rate, the duration and the CPU budget."""
    plan = plan or traffic_plan(first.profile, str(first.path))
    return f"{describe_rates(plan)}; {plan.deadline_s:g} s, seed {plan.seed}; {first.cpu_budget} CPUs per profile"


@dataclass(kw_only=True)
class LoadSizer:
    """Measures one replica of the first profile that starts, then gives every profile the same scaled plan."""

    options: SweepOptions
    console: Console
    record: dict[str, Any]
    factor: float | None = None

    def batch_sizes(self) -> tuple[int, ...]:
        # The largest batch every profile's pools allow (interactive-tuned pools take 16), and one stream.
        seqs = [p.max_num_seqs for sp in self.options.profiles for p in sp.profile.pools.values() if p.max_num_seqs]
        return (1, min(seqs) if seqs else 16)

    def __call__(self, plan: StackPlan, api_key: str, traffic: TrafficPlan) -> TrafficPlan:
        settings = self.options.settings
        if self.factor is None:
            if not settings.calibrate:
                self.factor = 1.0
                self.record.update({"calibrated": False, "factor": 1.0})
            else:
                self.factor = self._calibrate(plan, api_key, traffic)
        factor = self.factor * self.options.rate_scale
        self.record["rate_scale"] = self.options.rate_scale
        self.record["applied_factor"] = round(factor, 4)
        return scale_traffic(traffic, factor) if factor != 1.0 else traffic

    def _calibrate(self, plan: StackPlan, api_key: str, traffic: TrafficPlan) -> float:
        settings = self.options.settings
        replica = plan.replicas[0]
        # Half the context: a long prompt, with room to spare whatever the tokenizer makes of the words.
        prompt = min(traffic.prompt_tokens_at_most(RequestClass.LONG_PREFILL), traffic.max_model_len // 2)
        self.console.print(f"calibration: measuring {replica.label} (cpus {replica.cpuset}) of {plan.profile.name}")
        capacity = measure(
            replica, api_key=api_key, traffic=traffic, prompt_tokens=prompt, batch_sizes=self.batch_sizes()
        )
        replica_cpus = len(parse_cpuset(replica.cpuset)) if replica.cpuset else 1
        replicas_worth = self.options.profiles[0].cpu_budget / replica_cpus
        work = offered_work(traffic, capacity)
        utilisation = work / replicas_worth if replicas_worth else float("inf")
        wanted = settings.load_fraction / utilisation if utilisation else settings.max_scale
        factor = min(max(wanted, settings.min_scale), settings.max_scale)
        self.record.update(
            {
                "calibrated": True,
                "capacity": capacity.as_json(),
                "configured_load": describe_rates(traffic),
                "configured_utilisation": round(utilisation, 3),
                "load_fraction": settings.load_fraction,
                "replicas_worth": replicas_worth,
                "factor": round(factor, 4),
                "clamped": factor != wanted,
            }
        )
        self.console.print(
            f"calibration: prefill {capacity.prefill_tokens_per_s:.0f} tok/s, decode "
            + ", ".join(f"{v:.0f} tok/s at batch {b}" for b, v in sorted(capacity.decode_tokens_per_s.items()))
            + f"; the configured load is {utilisation:.2f}x of {replicas_worth:g} replica(s): rates x{factor:.3g} "
            f"for {settings.load_fraction:g} of capacity"
        )
        return factor


def run_sweep(
    options: SweepOptions,
    *,
    replicas: Callable[[str, str | None, Path, Path], ReplicaRuntime],
    router: Callable[[Path], RouterRuntime],
    console: Console,
) -> dict[str, Any]:
    """Drive every profile; a profile whose gates fail is a result, one that cannot start is recorded as
    failed with its reason and the sweep goes on."""
    started = datetime.now(UTC)
    options.report_dir.mkdir(parents=True, exist_ok=True)
    # An earlier sweep's verdict and plots must not sit beside this sweep's runs, whatever ends this one.
    for name in SWEEP_FILES:
        (options.report_dir / name).unlink(missing_ok=True)
    calibration: dict[str, Any] = {}
    report: dict[str, Any] = {
        "started_at": started.isoformat(timespec="seconds"),
        "load": describe_load(options.profiles[0]),
        "cpu_budget": options.profiles[0].cpu_budget,
        "calibration": calibration,
        "profiles": {},
        "failed_profiles": {},
    }
    sizer = LoadSizer(options=options, console=console, record=calibration)
    for sweep_profile in options.profiles:
        profile = sweep_profile.profile
        console.print(f"[bold]sweep: profile {profile.name}[/bold] ({profile.description})")
        run = SmokeRun(
            options=SmokeOptions(
                profile=profile,
                profile_path=sweep_profile.path,
                report_dir=options.report_dir / "runs",
                base_port=options.base_port,
            ),
            replicas_runtime_factory=replicas,
            router_runtime_factory=router,
            console=console,
            before_traffic=sizer,
        )
        try:
            run.execute()
        except SmokeFailed as exc:
            if "main" not in run.results:
                report["failed_profiles"][profile.name] = exc.message[:2000]
                continue
        except KeyboardInterrupt as exc:
            # Ctrl-C, SIGTERM or SIGHUP (builders/interrupt.py): the profiles measured so far, and where it stopped.
            report |= {"result": "interrupted", "signal": interrupt.signal_of(exc), "ended_in": profile.name}
            report["ended_in_phase"] = run.running
            (options.report_dir / "sweep.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
            raise
        result = run.results["main"]
        report.setdefault("dtype", run.report.get("dtype"))
        report["load"] = describe_load(sweep_profile, result.plan)
        report["profiles"][profile.name] = {
            "file": str(sweep_profile.path),
            "description": profile.description,
            "dtype": run.report.get("dtype", {}).get("dtype"),
            "engine": sweep_profile.engine,
            "pools": {
                name: {"replicas": pool.replicas, "cpus": list(pool.cpus)} for name, pool in profile.pools.items()
            },
            "wall_s": round(result.wall_s, 2),
            "stopped_by": result.stopped_by,
            "classes": class_rows(result),
        }
        # Written after every profile too, so a sweep cut short (Ctrl-C, a CI time limit) keeps what it measured.
        (options.report_dir / "sweep.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    report["goal"] = compare_to(report["profiles"], reference=REFERENCE, candidate=WORK_CONSERVING)
    report["validity"] = judge_validity(
        report["profiles"], reference=REFERENCE, floor=options.settings.served_floor, names=list(report["profiles"])
    )
    (options.report_dir / "sweep.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (options.report_dir / "sweep.md").write_text(render_markdown(report), encoding="utf-8")
    if options.plots and report["profiles"]:
        report["plots"] = [str(p) for p in write_plots(report, options.report_dir)]
    return report
