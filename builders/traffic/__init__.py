"""Traffic generator: drives the router's six request classes with realistic shapes and judges SLO gates.

Entry point: ``await run_traffic(base_url, plan, api_key=None) -> TrafficResult``.
"""

from __future__ import annotations

from builders.traffic.metrics import ClassSummary, Percentiles, RequestRecord, percentile, summarize
from builders.traffic.plan import (
    AgentPlan,
    BatchPlan,
    ClassPlan,
    ClassSLO,
    InteractivePlan,
    LongPrefillPlan,
    RagPlan,
    SlowStreamPlan,
    TrafficPlan,
)
from builders.traffic.results import TrafficResult
from builders.traffic.runner import run_traffic
from builders.traffic.shapes import AgentConversation, RequestSpec, ShapeBuilder

__all__ = [
    "AgentConversation",
    "AgentPlan",
    "BatchPlan",
    "ClassPlan",
    "ClassSLO",
    "ClassSummary",
    "InteractivePlan",
    "LongPrefillPlan",
    "Percentiles",
    "RagPlan",
    "RequestRecord",
    "RequestSpec",
    "ShapeBuilder",
    "SlowStreamPlan",
    "TrafficPlan",
    "TrafficResult",
    "percentile",
    "run_traffic",
    "summarize",
]
