"""The part of SmokeRun that run_sweep uses, without a stack behind it: the sweep's tests that put a stand-in in
SmokeRun's place subclass it and say, in execute(), what the traffic answered."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from builders.smoke.report import ChecksRequested, SmokeReport
from builders.smoke.stack import SmokeOptions
from builders.traffic.results import TrafficResult


@dataclass(kw_only=True)
class SmokeRunStandIn:
    """Built with the arguments run_sweep gives SmokeRun; its report begins as a SmokeRun's does, and `results`
    holds each traffic run's result by name, where run_sweep reads them."""

    options: SmokeOptions
    replicas_runtime_factory: Any
    router_runtime_factory: Any
    console: Console
    before_traffic: Any
    results: dict[str, TrafficResult] = field(default_factory=dict)
    running: str | None = None

    def __post_init__(self) -> None:
        self.report = SmokeReport(
            run_id="standin",
            profile=self.options.profile.name,
            profile_file=str(self.options.profile_path),
            started_at="2026-01-01T00:00:00+00:00",
            checks_requested=ChecksRequested(slow_clients=False, kill_replica=False),
        )

    def execute(self) -> SmokeReport:
        raise NotImplementedError("a stand-in says what its traffic answered")
