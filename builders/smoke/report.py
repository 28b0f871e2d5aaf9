"""The smoke run's report (`smoke-PROFILE-RUN.json`) and the endpoint run's (`smoke-endpoint-PROFILE-RUN.json`) as
typed models: what `forge smoke` writes, and what a test or a tool reads back with `SmokeReport.read(path)`.

A section the run never reached is absent from the file (a run that failed to start has no `traffic`); a value
that was not measured inside a section is null.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from rich.table import Table

from builders.records import Record, absent
from builders.serving_dtype import DtypeRecord
from builders.traffic.metrics import ClassSummary


class Quantiles(Record):
    p50: float | None = Field(description="median, ms; null when nothing was measured")
    p99: float | None = Field(description="99th percentile, ms; null when nothing was measured")


class ClassRecord(Record):
    """One request class in one traffic run, judged by the profile's SLOs (builders/traffic/metrics.py)."""

    pool: str = Field(description="the pool the profile's class map sends the class to")
    requests: int = Field(description="requests sent")
    errors: int = Field(description="requests that failed (HTTP error, cut off, timed out)")
    error_rate: float = Field(description="errors / requests")
    ttft_ms: Quantiles = Field(description="time to first token of the successful requests")
    itl_ms: Quantiles = Field(description="gaps between streamed tokens, pooled over the successful requests")
    e2e_ms: Quantiles = Field(description="time from sending to the end of the answer")
    tpot_ms: Quantiles = Field(description="time per output token after the first, per request")
    goodput: float = Field(description="fraction of the requests sent that succeeded and met every SLO of the class")
    gate_passed: bool = Field(description="the class met its gate (error rate, TTFT p99, ITL p99, goodput)")
    gate_failures: list[str] = Field(description="which part of the gate failed, with the numbers")
    routed_as: dict[str, int] = Field(description="requests per class the router said it classified them as")
    served_by: dict[str, int] = Field(description="requests per pool that answered (x-forge-pool)")
    error_samples: list[str] = Field(description="up to three distinct errors")
    served_where: dict[str, int] | None = absent(
        "endpoint runs only: requests per POOL/REPLICA that answered, from the router's response headers"
    )

    @classmethod
    def of(cls, summary: ClassSummary, *, pool: str, served_where: dict[str, int] | None = None) -> ClassRecord:
        return cls.model_validate({"pool": pool, **summary.as_json(), "served_where": served_where})


class TrafficRecord(Record):
    wall_s: float = Field(description="seconds from the first request sent to the last answer")
    stopped_by: Literal["completed", "budget", "deadline"] = Field(description="what ended the traffic run")
    requests: int = Field(description="requests sent, every class together")
    classes: dict[str, ClassRecord] = Field(description="per request class that the plan sent requests of")


class TrafficRecords(Record):
    main: TrafficRecord | None = absent("the profile's traffic plan, judged by its gates")
    baseline_fast_readers: TrafficRecord | None = absent(
        "--check-slow-clients: the same plan with the slow clients reading at full speed"
    )
    kill_replica: TrafficRecord | None = absent("--check-kill-replica: the run during which a replica was killed")


class Bound(Record):
    with_slow: float = Field(description="p99 with slow clients, ms")
    fast_readers: float = Field(description="p99 with the slow clients reading at full speed, ms")
    bound: float = Field(description="max_ratio × fast_readers + allowance_ms")


class ErrorCounts(Record):
    with_slow: int = Field(description="failed requests with slow clients")
    fast_readers: int = Field(description="failed requests with fast readers")


class SlowClassVerdict(Record):
    ttft_p99_ms: Bound | None = absent("TTFT p99 against its bound; absent when either run measured none")
    itl_p99_ms: Bound | None = absent("ITL p99 against its bound; absent when either run measured none")
    errors: ErrorCounts | None = absent("present when slow clients made more requests of the class fail")


class SlowClientVerdict(Record):
    """Check (a): each judged class with slow readers against the run without them (builders/smoke/judge.py)."""

    margin: str = Field(description="the bound, in words")
    classes: dict[str, SlowClassVerdict] = Field(description="per judged class measured in both runs")
    failures: list[str] = Field(description="each breach, with its numbers")
    passed: bool = Field(description="no failure")
    scope: Literal["other_pools", "all_classes"] | None = absent(
        "which classes were judged: those served by other pools than the slow readers', or all"
    )


class CutRequest(Record):
    request: str = Field(description="CLASS#INDEX")
    sent_at_s: float = Field(description="when it was sent, seconds from the start of the run")
    ended_at_s: float = Field(description="when its answer or error ended")
    replica: str | None = Field(description="the replica that served it (x-forge-replica), when known")
    error: str | None = Field(description="its error, cut to 160 characters; null when it completed")


class KillVerdict(Record):
    """Check (b): the killed replica's clients got an error in time, and the other pools' classes still passed."""

    pool: str = Field(description="the pool of the killed replica")
    replica: str = Field(description="the killed replica's URL")
    killed_at_s: float = Field(description="when it was killed, seconds from the start of the run")
    in_flight: int = Field(description="requests on the replica at the kill, for their clients")
    in_flight_requests: list[CutRequest] = Field(description="each of them")
    completed_anyway: int = Field(description="in flight for the client but already generated")
    cut: int = Field(description="in flight and ended in an error")
    error_after_s_max: float | None = Field(description="the longest wait from the kill to a cut request's error")
    sent_after_kill: int = Field(description="requests of the victim's classes sent after the kill")
    failed_after_kill: int = Field(description="of which failed")
    survivors_in_pool: int = Field(description="replicas of the pool still running")
    bound_s: float = Field(description="checks.kill_replica.error_within_s")
    other_classes_gates: dict[str, bool] = Field(description="gate of each class served by another pool")
    failures: list[str] = Field(description="each breach")
    passed: bool = Field(description="no failure")


class KillNotDone(Record):
    """The traffic ended before the victim was generating: nothing was killed, so nothing was proven."""

    failures: list[str] = Field(description="why the check proved nothing")
    passed: Literal[False] = Field(description="always false")


class ModelReached(Record):
    """One request naming a model, sent through the router (builders/smoke/model_pools.py)."""

    path: str = Field(description="the endpoint it was sent to: an embedding for an embed pool's model, else a chat")
    pools: list[str] = Field(description="the pools that serve the model")
    status: int | None = absent("the router's HTTP status; absent when no answer came")
    pool: str | None = absent("the pool that answered (x-forge-pool); absent when no answer named one")
    error: str | None = absent("why no answer came")


class ModelsVerdict(Record):
    """Each model the profile serves was reached through the router, on a pool that serves it."""

    models: dict[str, ModelReached] = Field(description="per model name")
    failures: list[str] = Field(description="each model not reached, or reached on the wrong pool")
    passed: bool = Field(description="no failure")


class Checks(Record):
    models: ModelsVerdict | None = absent("a profile with pools of another model (model_pools): each model reached")
    slow_clients: SlowClientVerdict | None = absent("--check-slow-clients")
    kill_replica: KillVerdict | KillNotDone | None = absent("--check-kill-replica")


class Gates(Record):
    passed: bool = Field(description="every class's gate and every check requested passed")
    failures: list[str] = Field(description="each failed gate or check, in words")


class ChecksRequested(Record):
    slow_clients: bool = Field(description="--check-slow-clients")
    kill_replica: bool = Field(description="--check-kill-replica")


class ArgumentProblem(Record):
    severity: str = Field(description="error (the server would refuse it) or warning")
    pool: str = Field(description="the pool whose argument it is")
    key: str = Field(description="the profile key the argument came from")
    argument: str = Field(description="the argument as passed")
    message: str = Field(description="the whole finding, in words")


class ServerRecord(Record):
    """What the run learnt of one serving engine's server before starting any (its --help)."""

    entry: list[str] = Field(description="how the server is started")
    flags_known: int = Field(description="options its help lists")
    notes: list[str] = Field(description="what the probe noticed")
    argument_problems: list[ArgumentProblem] = Field(description="each pool argument it would refuse or warn about")


class ReplicaStart(Record):
    port: int = Field(description="loopback port")
    cpus: str | None = Field(description="the CPU set it was confined to")
    healthy_after_s: float | None = Field(description="seconds from its start to a healthy /health")
    parts: dict[str, float | None] = Field(description="where the start-up went, read from its log (seconds)")


class RouterStart(Record):
    port: int = Field(description="loopback port")
    healthy_after_s: float | None = Field(description="seconds from its start to a healthy /health")


class Startup(Record):
    warm_up_s: float = Field(description="the warm-up requests sent to every replica before measuring")
    replicas: dict[str, ReplicaStart] = Field(description="per replica (POOL/INDEX)")
    router: RouterStart = Field(description="the router")


class StopSeconds(Record):
    router: float = Field(description="seconds to stop the router")
    replicas: float = Field(description="seconds to stop every replica, in parallel")


class Teardown(Record):
    stop_s: StopSeconds | None = absent("how long stopping took; absent when nothing had started")
    stop_errors: list[str] | None = absent("servers that refused to stop")
    leftovers: list[str] = Field(description="what still carried the run's label afterwards")
    clean: bool = Field(description="nothing was left")
    ended_by: str | None = absent("the error or signal that ended the run, cut to 500 characters")


SmokeResult = Literal["passed", "failed", "interrupted"]


class SmokeReport(Record):
    """`forge smoke`: one run of a profile's stack, from its arguments checked to its teardown."""

    run_id: str = Field(description="the run's id: its containers' label and the report's file name carry it")
    profile: str = Field(description="profile name")
    profile_file: str = Field(description="the profile's YAML file")
    started_at: str = Field(description="ISO 8601, UTC")
    checks_requested: ChecksRequested = Field(description="the checks the command line asked for")
    dtype: DtypeRecord | None = absent("the dtype the replicas serve, and why (builders/serving_dtype.py)")
    replicas_from: str | None = absent("where the replicas ran: the images or host binaries")
    router_from: str | None = absent("where the router ran")
    servers: dict[str, ServerRecord] | None = absent("per serving engine, what its server accepts")
    phases: dict[str, float] = Field(default_factory=dict, description="seconds per phase, in running order")
    startup: Startup | None = absent("how long each server took to start")
    traffic: TrafficRecords | None = absent("each traffic run")
    checks: Checks | None = absent("the verdicts of the checks requested")
    gates: Gates | None = absent("the verdict; absent when the traffic did not end")
    result: SmokeResult | None = absent("how the run ended")
    signal: str | None = absent("what interrupted it: SIGINT, SIGTERM or SIGHUP")
    ended_in: str | None = absent("the phase running when it failed or was interrupted")
    ended_at_once: str | None = absent("a second signal ended Forge before its teardown")
    teardown: Teardown | None = absent("what was stopped, and what was left")
    logs_dir: str | None = absent("the servers' logs, saved when the run failed")
    duration_s: float | None = absent("seconds from the start to the report's last write")
    report_file: str | None = absent("where this report is")


class EndpointInfo(Record):
    models: list[str] = Field(description="the models /v1/models lists")
    health_status: int = Field(description="the HTTP status of /health")
    pools: dict[str, list[str | None]] | None = absent("a Forge router's /health: each pool's replica URLs")


class EndpointReport(Record):
    """`forge smoke --endpoint URL`: the profile's traffic and gates against a stack Forge did not start."""

    run_id: str = Field(description="the run's id, in the report's file name")
    profile: str = Field(description="profile name")
    profile_file: str = Field(description="the profile's YAML file")
    endpoint: str = Field(description="the router's base URL")
    started_at: str = Field(description="ISO 8601, UTC")
    endpoint_info: EndpointInfo | None = absent("what the endpoint said before the traffic")
    traffic: TrafficRecords | None = absent("the main traffic run")
    note: str | None = absent("answers without Forge's headers: the endpoint is not a Forge router")
    gates: Gates | None = absent("the verdict")
    duration_s: float | None = absent("seconds from the start to the report's write")
    report_file: str | None = absent("where this report is")


def summary_table(report: SmokeReport | EndpointReport) -> Table:
    """The main run per class, with the pool that served it."""
    table = Table(title=f"forge smoke {report.profile} (run {report.run_id})")
    main = report.traffic.main if report.traffic is not None else None
    classes = main.classes if main is not None else {}
    # A stack Forge did not start (--endpoint) is described by where its answers came from.
    where = any(row.served_where is not None for row in classes.values())
    columns = ["class", "pool", "req", "err", "TTFT p50/p99 ms", "ITL p50/p99 ms", "goodput", "gate"]
    for column in [*columns, "served where"] if where else columns:
        table.add_column(column)
    for name, row in classes.items():
        table.add_row(
            name,
            row.pool,
            str(row.requests),
            str(row.errors),
            _pair(row.ttft_ms),
            _pair(row.itl_ms),
            f"{row.goodput:.2f}",
            "pass" if row.gate_passed else "FAIL",
            *([", ".join(f"{k} {v}" for k, v in (row.served_where or {}).items())] if where else []),
        )
    return table


def _pair(values: Quantiles) -> str:
    return " / ".join("-" if v is None else f"{v:.1f}" for v in (values.p50, values.p99))
