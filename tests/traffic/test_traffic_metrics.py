"""Metric definitions, percentiles and gate judgement on synthetic timings."""

from __future__ import annotations

import pytest
from rich.console import Console

from builders.router.classes import RequestClass
from builders.traffic import ClassSLO, RequestRecord, TrafficPlan, TrafficResult, percentile, summarize


def streamed(times: list[float], e2e: float, *, error: str | None = None, index: int = 0) -> RequestRecord:
    return RequestRecord(
        request_class=RequestClass.INTERACTIVE,
        index=index,
        endpoint="chat",
        stream=True,
        sent_class_header=False,
        prompt_chars=10,
        max_tokens=8,
        e2e_s=e2e,
        content_times_s=times,
        error=error,
        status=200,
        routed_class="interactive",
    )


def unary(e2e: float) -> RequestRecord:
    return RequestRecord(
        request_class=RequestClass.BATCH,
        index=0,
        endpoint="completions",
        stream=False,
        sent_class_header=True,
        prompt_chars=10,
        max_tokens=512,
        e2e_s=e2e,
        status=200,
    )


def test_percentile_interpolates_linearly() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 100.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 101)


def test_streamed_request_metrics() -> None:
    record = streamed([0.2, 0.25, 0.35, 0.4], e2e=0.5)
    assert record.ttft_s == 0.2
    assert record.itl_gaps_s == pytest.approx([0.05, 0.1, 0.05])
    # (E2E - TTFT) / (chunks - 1)
    assert record.tpot_s == pytest.approx((0.5 - 0.2) / 3)
    assert record.output_chunks == 4


def test_single_chunk_has_no_tpot_and_failed_request_has_no_ttft() -> None:
    assert streamed([0.2], e2e=0.3).tpot_s is None
    failed = streamed([0.2, 0.3], e2e=0.4, error="error event")
    assert failed.ttft_s is None and failed.itl_gaps_s == [] and not failed.ok


def test_non_streamed_ttft_is_e2e() -> None:
    record = unary(2.5)
    assert record.ttft_s == 2.5 and record.tpot_s is None and record.itl_gaps_s == []


def test_summary_pools_itl_across_requests_and_counts_goodput() -> None:
    records = [
        streamed([0.1, 0.2, 0.3], e2e=0.3),  # gaps 0.1, 0.1; tpot 0.1
        streamed([0.5, 0.52], e2e=0.52, index=1),  # TTFT too slow for the SLO below
        streamed([0.1, 0.4], e2e=0.4, index=2),  # tpot 0.3: too slow
        streamed([], e2e=1.0, error="HTTP 503", index=3),
    ]
    slo = ClassSLO(ttft_p99_ms=300, itl_p99_ms=200, max_error_rate=0.5, min_goodput=0.2)
    summary = summarize(RequestClass.INTERACTIVE, records, slo)
    assert summary.requests == 4 and summary.errors == 1
    assert summary.goodput == pytest.approx(0.25)
    assert summary.ttft_ms.p50 == pytest.approx(100.0)
    assert summary.itl_ms.p50 == pytest.approx(100.0)
    assert summary.itl_ms.p99 == pytest.approx(percentile([100, 100, 20, 300], 99))
    assert summary.e2e_ms.p99 == pytest.approx(percentile([300, 520, 400], 99))
    assert not summary.gate_passed
    reasons = " | ".join(summary.gate_failures)
    assert "TTFT p99" in reasons and "ITL p99" in reasons and "error rate" not in reasons
    assert summary.routed_as == {"interactive": 4}
    assert summary.error_samples == ("HTTP 503",)


@pytest.mark.parametrize(
    ("slo", "passed", "reason"),
    [
        (ClassSLO(), False, "error rate"),
        (ClassSLO(max_error_rate=0.5), True, ""),
        (ClassSLO(max_error_rate=0.5, min_goodput=0.75), False, "goodput"),
        (ClassSLO(max_error_rate=0.5, ttft_p99_ms=150), False, "TTFT"),
        (ClassSLO(max_error_rate=0.5, ttft_p99_ms=250, itl_p99_ms=50), False, "ITL"),
        (ClassSLO(max_error_rate=0.5, ttft_p99_ms=250, itl_p99_ms=150, min_goodput=0.5), True, ""),
    ],
)
def test_gate_judgement(slo: ClassSLO, passed: bool, reason: str) -> None:
    records = [
        streamed([0.1, 0.2], e2e=0.2),
        streamed([0.2, 0.3], e2e=0.3, index=1),
        streamed([], e2e=0.1, error="boom", index=2),
    ]
    summary = summarize(RequestClass.INTERACTIVE, records, slo)
    assert summary.gate_passed is passed
    assert reason in " ".join(summary.gate_failures)


def test_non_streamed_class_is_not_judged_on_itl() -> None:
    summary = summarize(RequestClass.BATCH, [unary(1.0), unary(2.0)], ClassSLO(ttft_p99_ms=3000, itl_p99_ms=1))
    assert summary.gate_passed and summary.itl_ms.p99 is None and summary.goodput == 1.0


def test_empty_class_fails_its_gate() -> None:
    summary = summarize(RequestClass.RAG, [], ClassSLO())
    assert not summary.gate_passed and "no request was sent" in summary.gate_failures[0]


def test_summary_json_and_table() -> None:
    plan = TrafficPlan.model_validate(
        {"model": "m", "max_model_len": 1024, "interactive": {"count": 2}, "batch": {"count": 1, "max_tokens": 64}}
    )
    result = TrafficResult.build(
        plan, [streamed([0.1, 0.2], e2e=0.2), streamed([0.1, 0.3], e2e=0.3, index=1), unary(1.0)],
        wall_s=1.5, stopped_by="completed",
    )  # fmt: skip
    summary = result.summary_json()
    assert set(summary) == {"interactive", "batch"}
    for name in ("requests", "errors", "ttft_ms", "itl_ms", "e2e_ms", "goodput", "gate_passed"):
        assert name in summary["interactive"]
    assert summary["interactive"]["ttft_ms"] == {"p50": 100.0, "p99": 100.0}
    assert summary["batch"]["ttft_ms"] == {"p50": 1000.0, "p99": 1000.0}
    assert result.passed
    console = Console(record=True, width=160)
    console.print(result.render_table())
    text = console.export_text()
    assert "interactive" in text and "batch" in text and "pass" in text
