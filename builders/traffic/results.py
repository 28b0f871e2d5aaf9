"""The outcome of a traffic run: every request's record, per-class summaries, gate verdicts, a table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.table import Table

from builders.router.classes import RequestClass
from builders.traffic.metrics import ClassSummary, Percentiles, RequestRecord, summarize
from builders.traffic.plan import TrafficPlan

StopReason = Literal["completed", "budget", "deadline"]


@dataclass(frozen=True, kw_only=True)
class TrafficResult:
    plan: TrafficPlan
    records: tuple[RequestRecord, ...]
    summaries: dict[RequestClass, ClassSummary]
    """Only classes the plan asked requests of."""
    wall_s: float
    stopped_by: StopReason

    @classmethod
    def build(
        cls, plan: TrafficPlan, records: Sequence[RequestRecord], *, wall_s: float, stopped_by: StopReason
    ) -> TrafficResult:
        summaries = {
            c: summarize(c, [r for r in records if r.request_class is c], plan.for_class(c).slo)
            for c in RequestClass
            if plan.for_class(c).count > 0
        }
        return cls(plan=plan, records=tuple(records), summaries=summaries, wall_s=wall_s, stopped_by=stopped_by)

    @property
    def passed(self) -> bool:
        """Every planned class passed its gate."""
        return all(s.gate_passed for s in self.summaries.values())

    def summary_json(self) -> dict[str, dict[str, object]]:
        """Per class: requests, errors, ttft_ms/itl_ms/e2e_ms {p50, p99}, goodput, gate_passed, and more."""
        return {c.value: s.as_json() for c, s in self.summaries.items()}

    def render_table(self) -> Table:
        table = Table(title=f"traffic: {len(self.records)} requests in {self.wall_s:.1f}s ({self.stopped_by})")
        for column in ("class", "req", "err", "TTFT p50/p99 ms", "ITL p50/p99 ms", "E2E p50/p99 ms", "goodput", "gate"):
            table.add_column(column, justify="left" if column in ("class", "gate") else "right")
        for c, s in self.summaries.items():
            gate = "[green]pass[/green]" if s.gate_passed else "[red]FAIL[/red] " + "; ".join(s.gate_failures)
            table.add_row(
                c.value,
                str(s.requests),
                str(s.errors),
                _pair(s.ttft_ms),
                _pair(s.itl_ms),
                _pair(s.e2e_ms),
                f"{s.goodput:.2f}",
                gate,
            )
        return table


def _pair(p: Percentiles) -> str:
    def one(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    return f"{one(p.p50)} / {one(p.p99)}"
