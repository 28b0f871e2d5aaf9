"""The isolation verdicts, on traffic results built from request records as the traffic runner makes them."""

from __future__ import annotations

from pathlib import Path

from builders.router.classes import RequestClass
from builders.smoke.judge import compare_slow_clients, judge_kill
from builders.smoke.plan import StackPlan, plan_stack
from builders.smoke.profile import load_profile
from builders.smoke.stack import traffic_plan
from builders.traffic.metrics import RequestRecord
from builders.traffic.plan import TrafficPlan
from builders.traffic.results import TrafficResult

ROOT = Path(__file__).resolve().parents[2]
INTER, BATCH, SLOW = RequestClass.INTERACTIVE, RequestClass.BATCH, RequestClass.SLOW_STREAM


def ci() -> tuple[StackPlan, TrafficPlan]:
    """The ci stack, with traffic planned only for the classes these tests send."""
    profile, path = load_profile("ci", root=ROOT)
    idle = {"count": 0}
    traffic = traffic_plan(profile, str(path), changes={"rag": idle, "agent": idle, "long_prefill": idle})
    return plan_stack(profile, run_id="t", base_port=22000), traffic


def record(
    cls: RequestClass,
    index: int,
    *,
    sent: float,
    e2e: float,
    ttft: float = 0.05,
    gap: float = 0.01,
    error: str | None = None,
    replica: str | None = None,
) -> RequestRecord:
    stream = cls is not BATCH
    times = [ttft + k * gap for k in range(4)] if stream and error is None else []
    return RequestRecord(
        request_class=cls,
        index=index,
        endpoint="chat",
        stream=stream,
        sent_class_header=False,
        prompt_chars=100,
        max_tokens=16,
        sent_at_s=sent,
        status=200 if error is None else 503,
        error=error,
        e2e_s=e2e,
        content_times_s=times,
        replica=replica,
    )


def result(plan: TrafficPlan, records: list[RequestRecord]) -> TrafficResult:
    return TrafficResult.build(plan, records, wall_s=10.0, stopped_by="completed")


def test_slow_clients_within_the_margin_pass_and_beyond_it_fail() -> None:
    _, traffic = ci()
    quiet = result(traffic, [record(INTER, k, sent=k, e2e=0.2, ttft=0.100) for k in range(5)])
    calm = result(traffic, [record(INTER, k, sent=k, e2e=0.2, ttft=0.200) for k in range(5)])
    noisy = result(traffic, [record(INTER, k, sent=k, e2e=0.6, ttft=0.500) for k in range(5)])
    ok = compare_slow_clients(calm, quiet, judged={INTER}, max_ratio=1.5, allowance_ms=50.0)
    assert ok.passed, ok.failures
    ttft = ok.classes["interactive"].ttft_p99_ms
    assert ttft is not None and ttft.as_json() == {"with_slow": 200.0, "fast_readers": 100.0, "bound": 200.0}
    bad = compare_slow_clients(noisy, quiet, judged={INTER}, max_ratio=1.5, allowance_ms=50.0)
    assert not bad.passed
    assert bad.failures == [
        "interactive ttft_p99_ms 500.0 ms with slow clients > 200.0 ms (1.5× 100.0 ms with fast readers + 50 ms)"
    ]


def test_a_class_starved_or_failing_with_slow_clients_fails_the_check() -> None:
    """A class with no success at all with slow readers has no p99 to compare: that must fail, not be skipped;
    and requests that fail only with slow readers are isolation's failure too."""
    _, traffic = ci()
    quiet = result(traffic, [record(INTER, k, sent=k, e2e=0.2, ttft=0.100) for k in range(5)])
    starved = result(traffic, [record(INTER, k, sent=k, e2e=30.0, error="timed out") for k in range(5)])
    verdict = compare_slow_clients(starved, quiet, judged={INTER}, max_ratio=1.5, allowance_ms=50.0)
    assert not verdict.passed
    assert verdict.failures == [
        "interactive ttft_p99_ms: no request succeeded with slow clients (100.0 ms with fast readers)",
        "interactive: 5 of 5 requests failed with slow clients, 0 of 5 with fast readers",
    ]
    some = result(
        traffic,
        [record(INTER, k, sent=k, e2e=0.2, ttft=0.100, error="HTTP 504: t" if k == 0 else None) for k in range(5)],
    )
    verdict = compare_slow_clients(some, quiet, judged={INTER}, max_ratio=1.5, allowance_ms=50.0)
    assert verdict.failures == ["interactive: 1 of 5 requests failed with slow clients, 0 of 5 with fast readers"]
    errors = verdict.classes["interactive"].errors
    assert errors is not None and errors.as_json() == {"with_slow": 1, "fast_readers": 0}


def test_slow_client_check_with_nothing_to_compare_fails() -> None:
    _, traffic = ci()
    empty = result(traffic, [])
    verdict = compare_slow_clients(empty, empty, judged={INTER}, max_ratio=1.5, allowance_ms=50.0)
    assert not verdict.passed


def test_kill_cuts_in_flight_requests_fast_and_spares_other_pools() -> None:
    plan, traffic = ci()
    victim = next(r for r in plan.replicas if r.pool == "bulk")
    records = [
        # Interactive on the other pool, before and after the kill at 3 s: all fine.
        *[record(INTER, k, sent=k * 0.5, e2e=0.2, replica=plan.replicas[0].url) for k in range(10)],
        # A batch request generating on the victim at the kill: cut 0.3 s later.
        record(BATCH, 0, sent=2.0, e2e=1.3, error="HTTP 503: every replica failed"),
        # A slow reader still draining the router's buffer: completes after the kill.
        record(SLOW, 0, sent=1.0, e2e=6.0, replica=victim.url),
        # Finished before the kill: not in flight.
        record(BATCH, 1, sent=0.0, e2e=1.0),
    ]
    verdict = judge_kill(result(traffic, records), plan=plan, victim=victim, killed_at_s=3.0, error_within_s=5.0)
    assert verdict.passed, verdict.failures
    assert (verdict.in_flight, verdict.cut, verdict.completed_anyway) == (2, 1, 1)
    assert verdict.error_after_s_max == 0.3
    assert verdict.other_classes_gates["interactive"] is True


def test_kill_fails_when_an_error_comes_late_or_another_pool_suffers() -> None:
    plan, traffic = ci()
    victim = next(r for r in plan.replicas if r.pool == "bulk")
    records = [
        record(INTER, 0, sent=3.5, e2e=0.1, error="HTTP 502: upstream gone", replica=plan.replicas[0].url),
        record(BATCH, 0, sent=2.0, e2e=9.0, error="no complete answer within 9.0s"),
    ]
    verdict = judge_kill(result(traffic, records), plan=plan, victim=victim, killed_at_s=3.0, error_within_s=5.0)
    assert not verdict.passed
    assert any("got its error 8.0s after the kill" in f for f in verdict.failures)
    assert "interactive (served by another pool) failed its gate" in verdict.failures


def test_a_kill_that_cut_nothing_proved_nothing() -> None:
    plan, traffic = ci()
    victim = next(r for r in plan.replicas if r.pool == "bulk")
    records = [record(INTER, 0, sent=0.0, e2e=0.2, replica=plan.replicas[0].url)]
    verdict = judge_kill(result(traffic, records), plan=plan, victim=victim, killed_at_s=3.0, error_within_s=5.0)
    assert not verdict.passed
    assert any("cut no request" in f for f in verdict.failures)


def test_with_survivors_in_the_pool_later_requests_must_be_served() -> None:
    profile, path = load_profile("shared", root=ROOT)
    plan = plan_stack(profile, run_id="t", base_port=23000)
    traffic = traffic_plan(profile, str(path), changes={"interactive": {"count": 3}})
    victim = plan.replicas[0]
    records = [
        record(INTER, 0, sent=1.0, e2e=2.5, error="error event: upstream died", replica=victim.url),
        record(INTER, 1, sent=4.0, e2e=0.2, replica=plan.replicas[1].url),
        record(INTER, 2, sent=4.5, e2e=0.01, error="HTTP 503: no replica", replica=None),
    ]
    verdict = judge_kill(result(traffic, records), plan=plan, victim=victim, killed_at_s=3.0, error_within_s=5.0)
    assert verdict.survivors_in_pool == 3
    assert (verdict.sent_after_kill, verdict.failed_after_kill) == (2, 1)
    assert any("interactive#2 sent 1.5s after the kill failed although 3 replica(s)" in f for f in verdict.failures)
