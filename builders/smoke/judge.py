"""The smoke run's two checks judged from traffic already run: slow clients (the judged classes with slow readers
against a run without them) and a killed replica (its clients answered with an error in time, the rest served).

Pure: results in, a verdict out; stack.py runs the traffic and records what these return.
"""

from __future__ import annotations

from builders.router.classes import ALL_CLASSES, RequestClass
from builders.smoke.plan import ReplicaPlan, StackPlan
from builders.smoke.report import Bound, CutRequest, ErrorCounts, KillVerdict, SlowClassVerdict, SlowClientVerdict
from builders.traffic.metrics import RequestRecord
from builders.traffic.results import TrafficResult


def compare_slow_clients(
    with_slow: TrafficResult,
    fast_readers: TrafficResult,
    *,
    judged: set[RequestClass],
    max_ratio: float,
    allowance_ms: float,
) -> SlowClientVerdict:
    """Check (a): each judged class's p99 TTFT and ITL with slow clients stays within ratio × baseline +
    allowance, the baseline being the same run with the slow clients reading at full speed."""
    rows: dict[str, SlowClassVerdict] = {}
    failures: list[str] = []
    for request_class, summary in with_slow.summaries.items():
        if request_class not in judged or request_class not in fast_readers.summaries:
            continue
        base = fast_readers.summaries[request_class]
        row = SlowClassVerdict()
        for metric, ours, theirs in (
            ("ttft_p99_ms", summary.ttft_ms.p99, base.ttft_ms.p99),
            ("itl_p99_ms", summary.itl_ms.p99, base.itl_ms.p99),
        ):
            if ours is None and theirs is not None and metric == "ttft_p99_ms":
                # Slow readers that starve a class leave it with nothing to measure: that is the worst case,
                # never a pass by omission.
                failures.append(
                    f"{request_class.value} {metric}: no request succeeded with slow clients "
                    f"({theirs:.1f} ms with fast readers)"
                )
                continue
            if ours is None or theirs is None:
                continue
            bound = theirs * max_ratio + allowance_ms
            setattr(row, metric, Bound(with_slow=round(ours, 1), fast_readers=round(theirs, 1), bound=round(bound, 1)))
            if ours > bound:
                failures.append(
                    f"{request_class.value} {metric} {ours:.1f} ms with slow clients > {bound:.1f} ms "
                    f"({max_ratio}× {theirs:.1f} ms with fast readers + {allowance_ms:.0f} ms)"
                )
        if summary.errors > base.errors:
            row.errors = ErrorCounts(with_slow=summary.errors, fast_readers=base.errors)
            failures.append(
                f"{request_class.value}: {summary.errors} of {summary.requests} requests failed with slow clients, "
                f"{base.errors} of {base.requests} with fast readers"
            )
        if row.model_fields_set:
            rows[request_class.value] = row
    if not rows:
        failures.append("no class to compare: none is judged, or none was measured in both runs")
    return SlowClientVerdict(
        margin=f"p99 with slow clients <= {max_ratio} × p99 with fast readers + {allowance_ms:.0f} ms",
        classes=rows,
        failures=failures,
        passed=not failures,
    )


def judge_kill(
    result: TrafficResult,
    *,
    plan: StackPlan,
    victim: ReplicaPlan,
    killed_at_s: float,
    error_within_s: float,
) -> KillVerdict:
    """Check (b): requests the kill cut off end in an error within the bound, and every class served by other
    pools still passes its gate.

    A request counts as on the victim when its x-forge-replica header names it. One that was in flight for
    its client at the kill but completes successfully had been fully generated before (a slow reader still
    draining the router's buffer); it is counted, not failed. The kill must cut at least one request, or
    the check proved nothing."""
    pool_size = sum(1 for r in plan.replicas if r.pool == victim.pool)
    victim_classes = {c for c in ALL_CLASSES if plan.profile.classes[c] == victim.pool}

    def on_victim(record: RequestRecord) -> bool:
        if record.replica is not None:
            return record.replica.rstrip("/") == victim.url
        # A non-streamed answer carries its replica header only once complete; with one replica in the pool
        # the request can only have been on the victim.
        return pool_size == 1 and record.request_class in victim_classes

    in_flight = [
        r
        for r in result.records
        if r.sent_at_s < killed_at_s and (r.e2e_s is None or r.sent_at_s + r.e2e_s > killed_at_s) and on_victim(r)
    ]
    failures: list[str] = []
    waits: list[float] = []
    cut = [r for r in in_flight if r.error is not None]
    for record in cut:
        wait = record.sent_at_s + (record.e2e_s or 0.0) - killed_at_s
        waits.append(wait)
        if wait > error_within_s:
            failures.append(
                f"{record.request_class.value}#{record.index} got its error {wait:.1f}s after the kill "
                f"(bound {error_within_s:.0f}s): {record.error}"
            )
    others = {c.value: s.gate_passed for c, s in result.summaries.items() if c not in victim_classes}
    failures += [f"{name} (served by another pool) failed its gate" for name, ok in others.items() if not ok]
    # With survivors in the pool, what is sent after the kill must be served by them (the router fails
    # over before the first byte); without survivors, an immediate error is the right answer.
    after = [r for r in result.records if r.request_class in victim_classes and r.sent_at_s >= killed_at_s]
    failed_after = [r for r in after if r.error is not None]
    if pool_size > 1:
        failures += [
            f"{r.request_class.value}#{r.index} sent {r.sent_at_s - killed_at_s:.1f}s after the kill failed although "
            f"{pool_size - 1} replica(s) of pool {victim.pool} survive: {r.error}"
            for r in failed_after
        ]
    if not cut:
        failures.append(
            "the kill cut no request (none was being generated on the replica); give the kill run longer "
            "outputs (checks.kill_replica.traffic) or kill earlier"
        )
    return KillVerdict(
        pool=victim.pool,
        replica=victim.url,
        killed_at_s=round(killed_at_s, 2),
        in_flight=len(in_flight),
        in_flight_requests=[
            CutRequest(
                request=f"{r.request_class.value}#{r.index}",
                sent_at_s=round(r.sent_at_s, 2),
                ended_at_s=round(r.sent_at_s + (r.e2e_s or 0.0), 2),
                replica=r.replica,
                error=r.error[:160] if r.error else None,
            )
            for r in in_flight
        ],
        # In flight for the client but already generated (a slow reader draining the router's buffer).
        completed_anyway=len(in_flight) - len(cut),
        cut=len(cut),
        error_after_s_max=round(max(waits), 2) if waits else None,
        sent_after_kill=len(after),
        failed_after_kill=len(failed_after),
        survivors_in_pool=pool_size - 1,
        bound_s=error_within_s,
        other_classes_gates=others,
        failures=failures,
        passed=not failures,
    )
