"""Run a sweep: each profile in turn on the same image, the same seeded traffic, one report."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from builders import interrupt
from builders.errors import SmokeFailed
from builders.router.classes import ALL_CLASSES
from builders.smoke.runtimes import ReplicaRuntime, RouterRuntime
from builders.smoke.stack import SmokeOptions, SmokeRun, traffic_plan
from builders.sweep.definition import SweepProfile
from builders.sweep.report import class_rows, compare_to, render_markdown, write_plots

REFERENCE = "shared"
SWEEP_FILES = ("sweep.json", "sweep.md", "ttft-cdf.png", "goodput.png")
WORK_CONSERVING = "work-conserving"


@dataclass(frozen=True, kw_only=True)
class SweepOptions:
    profiles: list[SweepProfile]
    report_dir: Path
    base_port: int | None = None
    plots: bool = True


def describe_load(first: SweepProfile) -> str:
    """The offered load in words: every open-loop class's rate, the duration and the CPU budget."""
    plan = traffic_plan(first.profile, str(first.path))
    rates = []
    for request_class in ALL_CLASSES:
        class_plan = plan.for_class(request_class)
        if class_plan.count == 0:
            continue
        if class_plan.rate_per_s is not None:
            rates.append(f"{request_class.value} {class_plan.rate_per_s:g}/s")
        else:
            rates.append(f"{request_class.value} {class_plan.concurrency} in flight")
    return f"{', '.join(rates)}; {plan.deadline_s:g} s, seed {plan.seed}; {first.cpu_budget} CPUs per profile"


def run_sweep(
    options: SweepOptions,
    *,
    replicas: Callable[[Path, Path], ReplicaRuntime],
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
    report: dict[str, Any] = {
        "started_at": started.isoformat(timespec="seconds"),
        "load": describe_load(options.profiles[0]),
        "cpu_budget": options.profiles[0].cpu_budget,
        "profiles": {},
        "failed_profiles": {},
    }
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
        report["profiles"][profile.name] = {
            "file": str(sweep_profile.path),
            "description": profile.description,
            "pools": {
                name: {"replicas": pool.replicas, "cpus": list(pool.cpus)} for name, pool in profile.pools.items()
            },
            "wall_s": round(result.wall_s, 2),
            "stopped_by": result.stopped_by,
            "classes": class_rows(result),
        }
    report["goal"] = compare_to(report["profiles"], reference=REFERENCE, candidate=WORK_CONSERVING)
    (options.report_dir / "sweep.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (options.report_dir / "sweep.md").write_text(render_markdown(report), encoding="utf-8")
    if options.plots and report["profiles"]:
        report["plots"] = [str(p) for p in write_plots(report, options.report_dir)]
    return report
