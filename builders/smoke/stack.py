"""One smoke run: check the pools' vLLM arguments, start the stack, drive traffic, judge, tear down.

The run is a table of phases (PHASES: probe → start → traffic) over one SmokeContext, run by builders/runs.py's
skeleton: everything started is stopped in its teardown whatever ends the run (a failed gate, an exception,
Ctrl-C or SIGTERM), the report (builders/smoke/report.py) is written before that, and the engine is asked
afterwards whether anything with this run's label survived.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import requests
from pydantic import ValidationError
from rich.console import Console

from builders import interrupt
from builders.config.profile import StackProfile, check_cpus_available, explain
from builders.engines import ServerProbe, ServingEngine
from builders.engines.args import ArgProblem, raise_for_problems
from builders.errors import ConfigError, ForgeError, SmokeFailed, UsageError
from builders.log import console as wide_console
from builders.router.classes import ALL_CLASSES, RequestClass
from builders.router.config import RouterConfig, config_from_mapping
from builders.runs import Phase, ended_by_signal, run_phases
from builders.serving_dtype import choose_dtype, this_host
from builders.smoke.judge import compare_slow_clients, judge_kill
from builders.smoke.model_pools import reach_every_model, warm_up_requests
from builders.smoke.plan import ReplicaPlan, RuntimeGroup, StackPlan, check_host_runs, plan_stack
from builders.smoke.report import (
    ArgumentProblem,
    Checks,
    ChecksRequested,
    ClassRecord,
    Gates,
    KillNotDone,
    KillVerdict,
    ReplicaStart,
    RouterStart,
    ServerRecord,
    SmokeReport,
    Startup,
    StopSeconds,
    Teardown,
    TrafficRecord,
    TrafficRecords,
)
from builders.smoke.report import summary_table as summary_table  # where `forge smoke` has always found it
from builders.smoke.runtimes import Launched, ReplicaRuntime, RouterRuntime
from builders.traffic.plan import TrafficPlan
from builders.traffic.results import TrafficResult
from builders.traffic.runner import run_traffic

ROUTER_CONFIG_NAME = "router.json"
HEALTH_POLL_S = 0.5


@dataclass(frozen=True, kw_only=True)
class SmokeOptions:
    """What the command line chose for one run."""

    profile: StackProfile
    profile_path: Path
    report_dir: Path | None = None
    base_port: int | None = None
    check_slow_clients: bool = False
    check_kill_replica: bool = False


# --- validation before anything starts ----------------------------------------------------------------------


def merged(base: Mapping[str, object], changes: Mapping[str, object]) -> dict[str, object]:
    """`base` with `changes` applied key by key, nested mappings merged rather than replaced. Both are YAML as
    parsed, not yet validated: what the values are is the model's to say once they are merged."""
    out = dict(base)
    for key, value in changes.items():
        known = out.get(key)
        if isinstance(value, dict) and isinstance(known, dict):
            out[key] = merged(known, value)
        else:
            out[key] = value
    return out


def traffic_plan(
    profile: StackProfile, source: str, *, changes: Mapping[str, object] | None = None, where: str = "traffic"
) -> TrafficPlan:
    """The profile's traffic section as a TrafficPlan; model name and context length come from the profile
    (the smallest context of any pool, so every request fits wherever it is routed)."""
    lengths = [p.max_model_len or profile.model.max_model_len for p in profile.pools.values()]
    data = {
        "model": profile.model.served_model_name,
        "max_model_len": min(lengths),
        **merged(profile.traffic, changes or {}),
    }
    try:
        return TrafficPlan.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            "\n  ".join(explain(exc, source, model=TrafficPlan, prefix=tuple(where.split(".")))),
            hint="the traffic section takes builders/traffic/plan.py's TrafficPlan fields",
        ) from None


def check_traffic(profile: StackProfile, source: str) -> tuple[TrafficPlan, TrafficPlan]:
    """The traffic plans of a run and of its kill-replica check: `forge deploy render` checks them too, so that a
    profile smoke refuses is never rendered."""
    traffic = traffic_plan(profile, source)
    kill = profile.checks.kill_replica
    if kill is None:
        return traffic, traffic
    return traffic, traffic_plan(profile, source, changes=kill.traffic, where="checks.kill_replica.traffic")


def router_config(plan: StackPlan, source: str, *, api_key: str, upstream_api_key: str) -> RouterConfig:
    try:
        return config_from_mapping(
            plan.router_config(api_key=api_key, upstream_api_key=upstream_api_key), source=f"{source}: router"
        )
    except ConfigError as exc:
        raise ConfigError(exc.message, hint="the router section takes builders/router/config.py's fields") from None


@dataclass(frozen=True, kw_only=True)
class ValidatedProfile:
    """Everything derived from a profile that can be checked without starting anything."""

    plan: StackPlan
    traffic: TrafficPlan
    kill_traffic: TrafficPlan
    router: RouterConfig
    router_mapping: dict[str, object]
    """What the router config file holds: only the keys the profile or the run set, so a router image of
    another Forge version reads it with its own defaults."""
    api_key: str
    upstream_api_key: str


def validate_profile(
    profile: StackProfile, source: str, *, run_id: str, base_port: int | None = None
) -> ValidatedProfile:
    """Plan the stack and validate the traffic plans and the router config the run would use."""
    available = sorted(os.sched_getaffinity(0))
    check_cpus_available(profile, source=source, available=available)
    dtype = choose_dtype(profile.model.dtype, this_host())
    plan = plan_stack(profile, run_id=run_id, base_port=base_port, cpus=len(available), dtype=dtype)
    traffic, kill_traffic = check_traffic(profile, source)
    # Hex: a urlsafe key may begin with "-", which a command line then reads as an option.
    api_key = secrets.token_hex(16)
    upstream_api_key = secrets.token_hex(16)
    router = router_config(plan, source, api_key=api_key, upstream_api_key=upstream_api_key)
    return ValidatedProfile(
        plan=plan,
        traffic=traffic,
        kill_traffic=kill_traffic,
        router=router,
        router_mapping=plan.router_config(api_key=api_key, upstream_api_key=upstream_api_key),
        api_key=api_key,
        upstream_api_key=upstream_api_key,
    )


def check_ports_free(ports: list[int]) -> None:
    busy = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # As uvicorn binds: connections of a previous run in TIME_WAIT do not make a port busy.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                busy.append(port)
    if busy:
        raise UsageError(
            f"loopback port(s) {', '.join(map(str, busy))} are in use; the stack needs {ports[0]}..{ports[-1]}",
            hint="stop what holds them, or pass --base-port with a free range",
        )


# --- the running stack --------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class RunningStack:
    plan: StackPlan
    replicas: dict[str, Launched] = field(default_factory=dict)
    router: Launched | None = None
    startup_s: dict[str, float] = field(default_factory=dict)
    upstream_key: str = ""
    """The key the replicas require (the router's upstream key)."""

    def everything(self) -> list[Launched]:
        started: list[Launched] = [self.router] if self.router is not None else []
        return started + list(self.replicas.values())


def _healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/health", timeout=1.0).status_code == 200
    except requests.RequestException:
        return False


def generating(replica: ReplicaPlan, api_key: str | None = None) -> bool:
    """Whether a replica has a request running, from its serving engine's Prometheus gauge (vLLM serves
    /metrics to anyone, llama-server only with the key)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        text = requests.get(f"{replica.url}/metrics", headers=headers, timeout=1.0).text
    except requests.RequestException:
        return False
    return replica.serving.busy(text)


def warm_up(plan: StackPlan, api_key: str, *, timeout_s: float = 60.0) -> float:
    """Send each replica a short chat turn and a long prompt (an embed pool: an embedding) before anything is
    measured: a replica's first requests pay one-time costs (lazy kernel initialisation, allocator growth) that
    showed up as a single ~800 ms TTFT in the first measured run. Returns the seconds it took."""
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {api_key}"}
    for replica in plan.replicas:
        for path, body in warm_up_requests(plan.profile, replica.pool):
            try:
                response = requests.post(f"{replica.url}{path}", json=body, headers=headers, timeout=timeout_s)
            except requests.RequestException as exc:
                raise SmokeFailed(f"{replica.label} did not answer its warm-up request {path}: {exc}") from exc
            if response.status_code != 200:
                raise SmokeFailed(
                    f"{replica.label} refused its warm-up request {path}: HTTP {response.status_code} "
                    f"{response.text[:300]}",
                    hint="the replica's log says why; the tiny model or its chat template may not suit this vLLM",
                )
    return time.monotonic() - started


def _tail(launched: Launched, lines: int = 40) -> str:
    text = launched.logs(tail=lines).rstrip()
    return "\n      ".join(text.splitlines()[-lines:]) if text else "(no log output)"


def not_our_replica(url: str, *, api_key: str, model: str) -> str | None:
    """Why the server answering `url` is not the replica this run started, or None when it is: ours takes
    the run's own API key (a fresh secret per run) and serves the profile's model name. A port's /health
    alone was answered once by another user's server on the same port."""
    try:
        response = requests.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {api_key}"}, timeout=2.0)
    except requests.RequestException as exc:
        return f"/v1/models did not answer: {exc}"
    if response.status_code != 200:
        return f"/v1/models refused this run's API key (HTTP {response.status_code})"
    try:
        served = [str(m.get("id")) for m in response.json().get("data", [])]
    except (ValueError, AttributeError):
        return f"/v1/models answered what no vLLM answers: {response.text[:120]!r}"
    if model not in served:
        return f"/v1/models serves {', '.join(served) or 'nothing'}, not {model}"
    return None


def wait_healthy(
    targets: dict[str, tuple[str, Launched]],
    *,
    deadline_s: float,
    identify: Callable[[str], str | None] | None = None,
) -> dict[str, float]:
    """Poll each target's /health until all answer 200 (and, with `identify`, prove to be the server we
    started); fail at once, with its log tail, if one exits."""
    started = time.monotonic()
    pending = dict(targets)
    ready: dict[str, float] = {}
    strangers: dict[str, str] = {}
    while pending:
        for label, (url, launched) in list(pending.items()):
            if _healthy(url):
                why = identify(url) if identify is not None else None
                if why is None:
                    ready[label] = round(time.monotonic() - started, 2)
                    del pending[label]
                    continue
                # Someone else's server on our port: ours cannot bind and exits (its log says so), or is still
                # starting; either way that one is not counted as ours.
                strangers[label] = why
            if not launched.alive():
                stranger = (
                    f" (meanwhile {url} answered, but not as ours: {strangers[label]})" if label in strangers else ""
                )
                raise SmokeFailed(
                    f"{label} ({launched.name}) exited before it answered {url}/health{stranger}; last log lines:\n"
                    f"      {_tail(launched)}",
                    hint="the log above says why; a rejected argument, too little memory or a port another "
                    "server holds are the usual causes",
                )
        if not pending:
            break
        if time.monotonic() - started > deadline_s:
            details = "\n    ".join(
                f"{label}: {strangers.get(label, '')} {_tail(launched, 15)}" for label, (_, launched) in pending.items()
            )
            raise SmokeFailed(
                f"not healthy within {deadline_s:.0f}s: {', '.join(pending)}\n    {details}",
                hint="raise timeouts.startup_s in the profile, or start fewer replicas on a small machine",
            )
        time.sleep(HEALTH_POLL_S)
    return ready


@dataclass(kw_only=True)
class SmokeRun:
    options: SmokeOptions
    replicas_runtime_factory: Callable[[str, str | None, Path, Path], ReplicaRuntime]
    """(serving engine, the pools' own image or None, model directory, logs directory) -> where those pools'
    replicas run."""
    router_runtime_factory: Callable[[Path], RouterRuntime]
    # Tests and library callers that pass none still get CI-readable tables: full width without a terminal.
    console: Console = field(default_factory=lambda: wide_console(sys.stdout))
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))
    report: SmokeReport = field(init=False)
    running: str | None = None  # the phase under way: probe, start, traffic, teardown
    results: dict[str, TrafficResult] = field(default_factory=dict)
    """Each traffic run's full result by label ('main', ...), every request included, for callers that
    compare runs (forge sweep); kept even when a gate fails."""
    before_traffic: Callable[[StackPlan, str, TrafficPlan], TrafficPlan] | None = None
    """Called with the plan, the replicas' API key and the main traffic plan once the replicas are warm;
    returns the plan to drive (forge sweep measures a replica here and scales its load to it)."""

    def __post_init__(self) -> None:
        opts = self.options
        self.report = SmokeReport(
            run_id=self.run_id,
            profile=opts.profile.name,
            profile_file=str(opts.profile_path),
            started_at=_now(),
            checks_requested=ChecksRequested(
                slow_clients=opts.check_slow_clients, kill_replica=opts.check_kill_replica
            ),
        )

    def say(self, text: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {text}")

    def execute(self) -> SmokeReport:
        """Run the smoke test: its phases (PHASES) over one SmokeContext; returns the report. Raises SmokeFailed
        (after writing the report) on a failed gate or check."""
        opts = self.options
        profile = opts.profile
        source = str(opts.profile_path)
        started = time.time()
        self.report.started_at = _now(started)
        if opts.check_kill_replica and profile.checks.kill_replica is None:
            raise UsageError(
                f"--check-kill-replica: profile {profile.name} has no checks.kill_replica section",
                hint="add checks.kill_replica.pool (and after_s) to the profile",
            )
        valid = validate_profile(profile, source, run_id=self.run_id, base_port=opts.base_port)
        check_host_runs(profile, source, this_host())  # its replicas run here
        if opts.check_slow_clients and valid.traffic.slow_stream.count == 0:
            raise UsageError(
                f"--check-slow-clients: profile {profile.name}'s traffic plan sends no slow_stream requests",
                hint="set traffic.slow_stream.count above 0",
            )
        plan = valid.plan
        self.report.dtype = plan.dtype.as_json()
        self.say(f"dtype {plan.dtype.dtype}: {plan.dtype.reason}")
        if plan.dtype.warning:
            self.say(f"[yellow]warning:[/yellow] {plan.dtype.warning}")
        workdir = Path(tempfile.mkdtemp(prefix=f"forge-smoke-{self.run_id}-"))
        run_phases(SmokeContext(run=self, valid=valid, workdir=workdir, started=started), PHASES)
        return self.report

    def _record_probe(self, serving: ServingEngine, probe: ServerProbe, problems: list[ArgProblem]) -> None:
        servers = self.report.servers if self.report.servers is not None else {}
        servers[serving.name] = ServerRecord(
            entry=list(probe.entry),
            flags_known=len({id(o) for o in probe.spec.options.values()}),
            notes=list(probe.notes),
            argument_problems=[
                ArgumentProblem(severity=p.severity, pool=p.pool, key=p.key, argument=p.argument, message=p.render())
                for p in problems
            ],
        )
        self.report.servers = servers
        for note in probe.notes:
            self.say(f"[yellow]note:[/yellow] {note}")
        for problem in problems:
            self.say(f"[{'red' if problem.severity == 'error' else 'yellow'}]{problem.severity}:[/] {problem.render()}")

    def _start(
        self,
        stack: RunningStack,
        replicas: dict[RuntimeGroup, ReplicaRuntime],
        router: RouterRuntime,
        probes: dict[RuntimeGroup, ServerProbe],
        config_dir: Path,
        upstream_key: str,
    ) -> None:
        plan = stack.plan
        stack.upstream_key = upstream_key
        kinds = ", ".join(f"{sum(r.engine == k for r in plan.replicas)} {k}" for k in plan.engines())
        self.say(f"starting {len(plan.replicas)} replica(s): {kinds} (run {self.run_id})")
        for replica in plan.replicas:
            group = plan.group_of(replica)
            stack.replicas[replica.label] = replicas[group].start(
                _with_env(replica, replica.serving.api_key_env(upstream_key)), probes[group], run_id=self.run_id
            )
        deadline = plan.profile.timeouts.startup_s
        t0 = time.monotonic()
        models = {r.url: plan.profile.serves(r.pool) for r in plan.replicas}
        ready = wait_healthy(
            {r.label: (r.url, stack.replicas[r.label]) for r in plan.replicas},
            deadline_s=deadline,
            identify=lambda url: not_our_replica(url, api_key=upstream_key, model=models[url]),
        )
        stack.startup_s.update(ready)
        self.say(f"replicas healthy: {', '.join(f'{k} {v:.0f}s' for k, v in ready.items())}")
        parts = startup_parts(plan, stack, ready, self.say)
        # The warm-up is part of the start: on a loaded host its long prompt took over 60 s, so it may take
        # whatever is left of startup_s.
        warm = warm_up(plan, upstream_key, timeout_s=max(60.0, deadline - (time.monotonic() - t0)))
        self.say(f"replicas warmed up in {warm:.1f}s")
        stack.router = router.start(config_dir, ROUTER_CONFIG_NAME, run_id=self.run_id)
        left = max(10.0, deadline - (time.monotonic() - t0))
        router_ready = wait_healthy({"router": (plan.router_url, stack.router)}, deadline_s=left)
        stack.startup_s.update(router_ready)
        self.report.startup = Startup(
            warm_up_s=round(warm, 2),
            replicas={
                r.label: ReplicaStart(
                    port=r.port, cpus=r.cpuset, healthy_after_s=stack.startup_s.get(r.label), parts=parts[r.label]
                )
                for r in plan.replicas
            },
            router=RouterStart(port=plan.router_port, healthy_after_s=stack.startup_s.get("router")),
        )

    def _drive(self, stack: RunningStack, plan: TrafficPlan, api_key: str, label: str) -> TrafficResult:
        self.say(f"traffic run '{label}': up to {plan.max_total_requests} requests, at most {plan.deadline_s:.0f}s")
        bound = stack.plan.profile.timeouts.traffic_s

        async def bounded() -> TrafficResult:
            async with asyncio.timeout(bound):
                return await run_traffic(stack.plan.router_url, plan, api_key=api_key)

        try:
            result = asyncio.run(bounded())
        except TimeoutError:
            raise SmokeFailed(
                f"traffic run '{label}' did not finish within timeouts.traffic_s={bound:.0f}s",
                hint="lower traffic.deadline_s or raise timeouts.traffic_s",
            ) from None
        self.console.print(result.render_table())
        return result

    def _traffic(self, stack: RunningStack, base: TrafficPlan, kill_traffic: TrafficPlan, api_key: str) -> None:
        profile = stack.plan.profile
        traffic = self.report.traffic = TrafficRecords()
        main = self._drive(stack, base, api_key, "main")
        self.results["main"] = main
        traffic.main = self._result_json(main, stack.plan)
        failures = [f"{c.value}: {'; '.join(s.gate_failures)}" for c, s in main.summaries.items() if not s.gate_passed]
        checks = self.report.checks = Checks()
        if profile.model_pools():
            checks.models = reach_every_model(profile, stack.plan.router_url, api_key, timeout_s=base.request_timeout_s)
            failures += [f"models: {f}" for f in checks.models.failures]
        if self.options.check_slow_clients:
            # The baseline sends the same streams to the same pool and reads them at full speed: the servers
            # do the same work, so what differs is only how slowly the clients read.
            fast = base.model_copy(update={"slow_stream": base.slow_stream.model_copy(update={"read_delay_s": 0.0})})
            without = self._drive(stack, fast, api_key, "baseline: the slow clients read at full speed")
            traffic.baseline_fast_readers = self._result_json(without, stack.plan)
            margins = profile.checks.slow_clients
            slow_pool = profile.classes[RequestClass.SLOW_STREAM]
            judged: set[RequestClass] = {
                c
                for c in ALL_CLASSES
                if c is not RequestClass.SLOW_STREAM
                and (margins.scope == "all_classes" or profile.classes[c] != slow_pool)
            }
            slow = compare_slow_clients(
                main, without, judged=judged, max_ratio=margins.max_ratio, allowance_ms=margins.allowance_ms
            )
            slow.scope = margins.scope
            checks.slow_clients = slow
            failures += [f"slow-client isolation: {f}" for f in slow.failures]
        if self.options.check_kill_replica:
            killed, traffic.kill_replica = self._kill_check(stack, kill_traffic, api_key)
            checks.kill_replica = killed
            failures += [f"kill-replica isolation: {f}" for f in killed.failures]
        self.report.gates = Gates(passed=not failures, failures=failures)
        if failures:
            raise SmokeFailed(
                f"profile {profile.name}: {len(failures)} gate(s) failed:\n  " + "\n  ".join(failures),
                hint="the report names each class's numbers; compare with the profile's SLOs",
            )

    def _kill_check(
        self, stack: RunningStack, base: TrafficPlan, api_key: str
    ) -> tuple[KillVerdict | KillNotDone, TrafficRecord]:
        settings = stack.plan.profile.checks.kill_replica
        assert settings is not None  # checked before the run started
        victim = next(r for r in stack.plan.replicas if r.pool == settings.pool)
        launched = stack.replicas[victim.label]
        bound = stack.plan.profile.timeouts.traffic_s
        self.say(f"traffic run 'kill replica': killing {victim.label} after {settings.after_s:.0f}s")
        killed_at: list[float] = []

        async def run() -> TrafficResult:
            started = time.monotonic()

            async def killer() -> None:
                await asyncio.sleep(settings.after_s)
                # Kill only while the victim is generating: a kill between requests cuts nothing and
                # proves nothing, and on a fast machine the plan may be between requests at after_s.
                while not await asyncio.to_thread(generating, victim, stack.upstream_key):
                    await asyncio.sleep(0.05)
                # Taken before the kill call, so the measured wait for the error is never flattered.
                killed_at.append(time.monotonic() - started)
                await asyncio.to_thread(launched.kill)

            kill_task = asyncio.create_task(killer())
            try:
                async with asyncio.timeout(bound):
                    return await run_traffic(stack.plan.router_url, base, api_key=api_key)
            finally:
                kill_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await kill_task

        result = asyncio.run(run())
        self.console.print(result.render_table())
        if not killed_at:
            return KillNotDone(
                failures=[
                    f"the run ended before {victim.label} was generating after {settings.after_s:.0f}s; kill "
                    "earlier or give the kill run more traffic for that pool (checks.kill_replica.traffic)"
                ],
                passed=False,
            ), self._result_json(result, stack.plan)
        verdict = judge_kill(
            result,
            plan=stack.plan,
            victim=victim,
            killed_at_s=killed_at[0],
            error_within_s=settings.error_within_s,
        )
        return verdict, self._result_json(result, stack.plan)

    @staticmethod
    def _result_json(result: TrafficResult, plan: StackPlan) -> TrafficRecord:
        return TrafficRecord(
            wall_s=round(result.wall_s, 2),
            stopped_by=result.stopped_by,
            requests=len(result.records),
            classes={c.value: ClassRecord.of(s, pool=plan.profile.classes[c]) for c, s in result.summaries.items()},
        )

    def _teardown(
        self,
        stack: RunningStack | None,
        replicas: list[ReplicaRuntime],
        router: RouterRuntime | None,
        workdir: Path,
        error: BaseException | None,
    ) -> None:
        stop_s: StopSeconds | None = None
        errors: list[str] = []
        if stack is not None:
            if self.options.report_dir is not None and error is not None:
                self._save_logs(stack)
            self.say(f"stopping {len(stack.everything())} server(s)")
            # The router first, so nothing new reaches a replica; then every replica at once, so a replica
            # slow to honour SIGTERM does not make the others wait.
            t0 = time.monotonic()
            if stack.router is not None:
                errors += _stop_all([stack.router])
            t1 = time.monotonic()
            errors += _stop_all(list(stack.replicas.values()))
            stop_s = StopSeconds(router=round(t1 - t0, 1), replicas=round(time.monotonic() - t1, 1))
        runtimes: list[ReplicaRuntime | RouterRuntime] = [*replicas, *([router] if router is not None else [])]
        for runtime in runtimes:
            # Whatever carries this run's label but was never handed back (a start that failed half way).
            runtime.sweep(self.run_id)
        leftovers = [item for runtime in runtimes for item in runtime.leftovers(self.run_id)]
        if leftovers:
            self.say(f"[red]still running after teardown:[/red] {', '.join(sorted(set(leftovers)))}")
        shutil.rmtree(workdir, ignore_errors=True)
        self.report.teardown = Teardown(
            stop_s=stop_s,
            stop_errors=errors or None,
            leftovers=sorted(set(leftovers)),
            clean=not leftovers,
            ended_by=f"{type(error).__name__}: {error}"[:500] if error is not None else None,
        )

    def _save_logs(self, stack: RunningStack) -> None:
        assert self.options.report_dir is not None
        logs = self.options.report_dir / f"smoke-{stack.plan.profile.name}-{self.run_id}-logs"
        logs.mkdir(parents=True, exist_ok=True)
        for launched in stack.everything():
            (logs / f"{launched.name}.log").write_text(launched.logs(tail=400), encoding="utf-8")
        self.report.logs_dir = str(logs)

    def _finish(self, started: float, *, quiet: bool = False) -> None:
        self.report.duration_s = round(time.time() - started, 1)
        if self.options.report_dir is not None:
            path = self.options.report_dir / f"smoke-{self.options.profile.name}-{self.run_id}.json"
            self.report.report_file = str(path)
            self.report.save(path)
            if not quiet:
                self.say(f"report: {path}")


def _stop_all(launched: list[Launched]) -> list[str]:
    """Stop servers in parallel; the errors of those that refused, as text."""
    if not launched:
        return []

    def stop(one: Launched) -> str | None:
        try:
            one.stop()
        except ForgeError as exc:
            return f"{one.name}: {exc.message}"
        return None

    with ThreadPoolExecutor(max_workers=len(launched)) as pool:
        return [error for error in pool.map(stop, launched) if error is not None]


def _with_env(replica: ReplicaPlan, extra: dict[str, str]) -> ReplicaPlan:
    return replace(replica, env={**replica.env, **extra})


def startup_parts(
    plan: StackPlan, stack: RunningStack, ready: dict[str, float], say: Callable[[str], None]
) -> dict[str, dict[str, float | None]]:
    """Where each replica's start went, read from its log right after health, before the warm-up's requests
    add to it (issue 41); one line each on the console."""
    parts = {
        r.label: r.serving.startup_parts(stack.replicas[r.label].logs(tail=2000), healthy_after_s=ready.get(r.label))
        for r in plan.replicas
    }
    for label, found in parts.items():
        if found:
            shown = ", ".join(f"{k.removesuffix('_s')} {v:.1f}s" for k, v in found.items() if v is not None)
            say(f"start-up of {label}: {shown}")
    return parts


def _now(at: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if at is None else at, UTC).isoformat(timespec="seconds")


# --- the run's phases over one context (builders/runs.py) ----------------------------------------------------


@dataclass(kw_only=True)
class SmokeContext:
    """What the phases of one smoke run share: the run (options, report, console), the validated profile, the
    run's scratch folder, and what each phase leaves for the next."""

    run: SmokeRun
    valid: ValidatedProfile
    workdir: Path
    started: float
    replica_runtimes: dict[RuntimeGroup, ReplicaRuntime] = field(default_factory=dict)
    probes: dict[RuntimeGroup, ServerProbe] = field(default_factory=dict)
    router_runtime: RouterRuntime | None = None
    stack: RunningStack | None = None

    @property
    def config_dir(self) -> Path:
        return self.workdir / "router"

    def runtimes(self) -> list[ReplicaRuntime | RouterRuntime]:
        return [*self.replica_runtimes.values(), *([self.router_runtime] if self.router_runtime else [])]

    # The skeleton's side (builders/runs.Run).
    def step(self, name: str) -> AbstractContextManager[object]:
        self.run.running = name
        return contextlib.nullcontext()

    def record_phase(self, name: str, seconds: float) -> None:
        self.run.report.phases[name] = seconds

    def record_end(self, error: BaseException | None, phase: str | None) -> None:
        report = self.run.report
        if error is None:
            report.result = "passed"
            return
        # SIGTERM and SIGHUP arrive as Ctrl-C does (builders/interrupt.py).
        report.result = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
        report.signal = ended_by_signal(error)
        report.ended_in = phase

    def write_report(self) -> None:
        self.run._finish(self.started, quiet=True)

    def teardown(self, error: BaseException | None) -> None:
        run = self.run
        run.running = "teardown"
        t0 = time.monotonic()
        try:
            run._teardown(self.stack, list(self.replica_runtimes.values()), self.router_runtime, self.workdir, error)
        finally:
            self.record_phase("teardown", round(time.monotonic() - t0, 2))
        run._finish(self.started)

    def end_at_once(self, phase: str | None) -> None:
        """A second signal: every server dies now (SIGKILL), whatever carries the run's label goes, and the report
        says so before Forge exits."""
        if self.stack is not None:
            for launched in self.stack.everything():
                launched.kill()
        for runtime in self.runtimes():
            runtime.sweep(self.run.run_id)
        report = self.run.report
        if report.result in {None, "passed"}:
            report.result, report.signal, report.ended_in = "interrupted", interrupt.first_signal(), phase
        report.ended_at_once = "a second signal killed every server and ended Forge before its teardown"
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.run._finish(self.started, quiet=True)


def _probe(ctx: SmokeContext) -> None:
    """One runtime per serving engine and image, each asked once which arguments its server accepts; the pools'
    arguments checked against that before anything starts; the router's config written; the ports free."""
    run, plan, profile = ctx.run, ctx.valid.plan, ctx.run.options.profile
    source = str(run.options.profile_path)
    logs_dir = ctx.workdir / "logs"
    logs_dir.mkdir()
    for group in plan.runtime_groups():
        serving = group.serving
        model_dir = ctx.workdir / f"model-{serving.name}"
        if not model_dir.exists():
            serving.write_model(model_dir, profile, dtype=plan.dtype.dtype)
            # Replicas may run as another user (the images use uid 1000): all they read is public.
            for path in (ctx.workdir, model_dir, *model_dir.iterdir()):
                path.chmod(0o755 if path.is_dir() else 0o644)
        ctx.replica_runtimes[group] = run.replicas_runtime_factory(serving.name, group.image, model_dir, logs_dir)
    router_runtime = ctx.router_runtime = run.router_runtime_factory(logs_dir)
    run.report.replicas_from = "; ".join(r.description for r in ctx.replica_runtimes.values())
    run.report.router_from = router_runtime.description

    for group, runtime in ctx.replica_runtimes.items():
        serving = runtime.serving
        run.say(f"asking {runtime.description} which {serving.title} arguments it accepts")
        probe = runtime.probe(timeout_s=profile.timeouts.probe_s)
        ctx.probes[group] = probe
        problems = serving.check(plan.pool_argvs(pools=group.pools), probe)
        run._record_probe(serving, probe, problems)
        raise_for_problems(problems, profile=source, server=serving.title)

    ctx.config_dir.mkdir(mode=0o755)
    config_file = ctx.config_dir / ROUTER_CONFIG_NAME
    config_file.write_text(json.dumps(ctx.valid.router_mapping, indent=2), encoding="utf-8")
    config_file.chmod(0o644)
    check_ports_free([plan.router_port, *(r.port for r in plan.replicas)])


def _start(ctx: SmokeContext) -> None:
    assert ctx.router_runtime is not None, "the probe phase runs first"
    ctx.stack = RunningStack(plan=ctx.valid.plan)
    ctx.run._start(
        ctx.stack, ctx.replica_runtimes, ctx.router_runtime, ctx.probes, ctx.config_dir, ctx.valid.upstream_api_key
    )


def _traffic(ctx: SmokeContext) -> None:
    assert ctx.stack is not None, "the start phase runs first"
    valid = ctx.valid
    traffic = valid.traffic
    if ctx.run.before_traffic is not None:
        traffic = ctx.run.before_traffic(valid.plan, valid.upstream_api_key, traffic)
    ctx.run._traffic(ctx.stack, traffic, valid.kill_traffic, valid.api_key)


# The run, in order; the teardown is the skeleton's, whatever ended the run.
PHASES: tuple[Phase[SmokeContext], ...] = (Phase("probe", _probe), Phase("start", _start), Phase("traffic", _traffic))
