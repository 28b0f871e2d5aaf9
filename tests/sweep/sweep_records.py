"""One answered or failed request as the traffic runner records it, and the sweep report's records around them,
for the sweep's tests that build results without a server: every test of the report, the claims and the
repetitions builds them the same way."""

from __future__ import annotations

from typing import Any

from builders.router.classes import RequestClass
from builders.sweep.report_model import (
    Calibration,
    ClassRow,
    LoadAverage,
    ProfileRun,
    Repetition,
    SweepReport,
)
from builders.traffic.metrics import RequestRecord


def streamed(request_class: RequestClass, index: int, ttft_s: float | None, *, max_tokens: int = 4) -> RequestRecord:
    """A streamed chat request whose first token came after `ttft_s` and the rest 10 ms apart; None: it failed
    with HTTP 503 after 10 ms."""
    r = RequestRecord(
        request_class=request_class,
        index=index,
        endpoint="chat",
        stream=True,
        sent_class_header=False,
        prompt_chars=10,
        max_tokens=max_tokens,
    )
    if ttft_s is None:
        r.error = "HTTP 503"
        r.e2e_s = 0.01
    else:
        r.content_times_s = [ttft_s + 0.01 * i for i in range(max_tokens)]
        r.e2e_s = r.content_times_s[-1]
    return r


def profile_run(
    classes: dict[str, ClassRow], *, repetition: int = 0, load: tuple[float | None, float | None] = (None, None)
) -> ProfileRun:
    """A profile run's record as run_sweep writes it, around the class rows a test measured."""
    return ProfileRun(
        file="profiles/sweep/test.yaml",
        description="a test profile",
        dtype="float32",
        engine="vllm",
        pools={},
        wall_s=10.0,
        startup=None,
        stopped_by="completed",
        classes=classes,
        repetition=repetition,
        seed=7,
        load_average_1m=LoadAverage(start=load[0], end=load[1]),
    )


def repetition(index: int, profiles: dict[str, ProfileRun], *, valid: bool | None = None) -> Repetition:
    return Repetition(repetition=index, seed=7 + index, order=list(profiles), profiles=profiles, failed={}, valid=valid)


def sweep_of(profiles: dict[str, ProfileRun], **fields: Any) -> SweepReport:
    """A sweep report around the profile runs a test made: one repetition of them unless `fields` say more."""
    values: dict[str, Any] = {
        "started_at": "2026-01-01T00:00:00+00:00",
        "load": "test load",
        "cpu_budget": 2,
        "calibration": Calibration(),
        "replica_cache": "none: every replica starts cold",
        "profiles": profiles,
        "failed_profiles": {},
        "repeat": 1,
        "seeds": [7],
        "repetitions": [repetition(0, profiles)],
    }
    return SweepReport.model_validate(values | fields)
