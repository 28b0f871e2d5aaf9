"""One smoke run: check the pools' vLLM arguments, start the stack, drive traffic, judge, tear down.

Everything started is stopped in a `finally`, whatever ends the run (a failed gate, an exception, Ctrl-C or
SIGTERM), and the engine is asked afterwards whether anything with this run's label survived.
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
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from builders import interrupt
from builders.engines import ServerProbe, ServingEngine
from builders.engines.args import ArgProblem, raise_for_problems
from builders.errors import ConfigError, ForgeError, SmokeFailed, UsageError
from builders.log import console as wide_console
from builders.router.classes import ALL_CLASSES, RequestClass
from builders.router.config import RouterConfig, config_from_mapping
from builders.serving_dtype import choose_dtype, this_host
from builders.smoke.judge import compare_slow_clients, judge_kill
from builders.smoke.model_pools import reach_every_model, requests_for
from builders.smoke.plan import ReplicaPlan, RuntimeGroup, StackPlan, plan_stack
from builders.smoke.profile import StackProfile, check_cpus_available, explain
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


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with `changes` applied key by key, nested mappings merged rather than replaced."""
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def traffic_plan(
    profile: StackProfile, source: str, *, changes: dict[str, Any] | None = None, where: str = "traffic"
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
    router_mapping: dict[str, Any]
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
    traffic = traffic_plan(profile, source)
    kill = profile.checks.kill_replica
    kill_traffic = (
        traffic_plan(profile, source, changes=kill.traffic, where="checks.kill_replica.traffic")
        if kill is not None
        else traffic
    )
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
    """Send each replica a short chat turn and a long prompt before anything is measured: a replica's first
    requests pay one-time costs (lazy kernel initialisation, allocator growth) that showed up as a
    single ~800 ms TTFT in the first measured run. Returns the seconds it took."""
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {api_key}"}
    for replica in plan.replicas:
        model = plan.profile.serves(replica.pool)
        length = plan.profile.pools[replica.pool].max_model_len or plan.profile.model.max_model_len
        bodies = [
            (
                "/v1/chat/completions",
                {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
            ),
            ("/v1/completions", {"model": model, "max_tokens": 8, "prompt": " the" * (length // 2)}),
        ]
        if plan.profile.pools[replica.pool].task == "embed":
            bodies = requests_for(plan.profile, replica.pool, prompt=" the" * (length // 2), max_tokens=8)
        for path, body in bodies:
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
    report: dict[str, Any] = field(default_factory=dict)
    running: str | None = None  # the phase under way: probe, start, traffic, teardown
    results: dict[str, TrafficResult] = field(default_factory=dict)
    """Each traffic run's full result by label ('main', ...), every request included, for callers that
    compare runs (forge sweep); kept even when a gate fails."""
    before_traffic: Callable[[StackPlan, str, TrafficPlan], TrafficPlan] | None = None
    """Called with the plan, the replicas' API key and the main traffic plan once the replicas are warm;
    returns the plan to drive (forge sweep measures a replica here and scales its load to it)."""

    def say(self, text: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {text}")

    def execute(self) -> dict[str, Any]:
        """Run the smoke test; returns the report. Raises SmokeFailed (after writing the report) on a failed
        gate or check."""
        opts = self.options
        profile = opts.profile
        source = str(opts.profile_path)
        started = time.time()
        self.report = {
            "run_id": self.run_id,
            "profile": profile.name,
            "profile_file": source,
            "started_at": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
            "checks_requested": {"slow_clients": opts.check_slow_clients, "kill_replica": opts.check_kill_replica},
        }
        if opts.check_kill_replica and profile.checks.kill_replica is None:
            raise UsageError(
                f"--check-kill-replica: profile {profile.name} has no checks.kill_replica section",
                hint="add checks.kill_replica.pool (and after_s) to the profile",
            )
        valid = validate_profile(profile, source, run_id=self.run_id, base_port=opts.base_port)
        if opts.check_slow_clients and valid.traffic.slow_stream.count == 0:
            raise UsageError(
                f"--check-slow-clients: profile {profile.name}'s traffic plan sends no slow_stream requests",
                hint="set traffic.slow_stream.count above 0",
            )
        plan = valid.plan
        self.report["dtype"] = plan.dtype.as_json()
        self.say(f"dtype {plan.dtype.dtype}: {plan.dtype.reason}")
        if plan.dtype.warning:
            self.say(f"[yellow]warning:[/yellow] {plan.dtype.warning}")
        workdir = Path(tempfile.mkdtemp(prefix=f"forge-smoke-{self.run_id}-"))
        stack: RunningStack | None = None
        error: BaseException | None = None
        replica_runtimes: dict[RuntimeGroup, ReplicaRuntime] = {}
        probes: dict[RuntimeGroup, ServerProbe] = {}
        router_runtime: RouterRuntime | None = None

        # Every way the run can end, SIGTERM and SIGHUP included, unwinds through the one `finally` below; a
        # second signal kills every server at once and ends the process (builders/interrupt.py).
        def kill_everything() -> None:
            """A second signal: every server dies now, and the report says so before Forge exits."""
            _kill_everything(
                stack, [*replica_runtimes.values(), *([router_runtime] if router_runtime else [])], self.run_id
            )
            if self.report.get("result") in {None, "passed"}:
                self.report |= {"result": "interrupted", "signal": interrupt.first_signal(), "ended_in": self.running}
            self.report["ended_at_once"] = "a second signal killed every server and ended Forge before its teardown"
            shutil.rmtree(workdir, ignore_errors=True)
            self._finish(started, quiet=True)

        with interrupt.handled(), interrupt.on_second_signal(kill_everything):
            try:
                with self._phase("probe"):
                    logs_dir = workdir / "logs"
                    logs_dir.mkdir()
                    # One runtime per serving engine and image: each reads its own server's help once.
                    for group in plan.runtime_groups():
                        serving = group.serving
                        model_dir = workdir / f"model-{serving.kind}"
                        if not model_dir.exists():
                            serving.write_model(model_dir, profile, dtype=plan.dtype.dtype)
                            # Replicas may run as another user (the images use uid 1000): all they read is public.
                            for path in (workdir, model_dir, *model_dir.iterdir()):
                                path.chmod(0o755 if path.is_dir() else 0o644)
                        runtime = self.replicas_runtime_factory(serving.kind, group.image, model_dir, logs_dir)
                        replica_runtimes[group] = runtime
                    router_runtime = self.router_runtime_factory(logs_dir)
                    self.report["replicas_from"] = "; ".join(r.description for r in replica_runtimes.values())
                    self.report["router_from"] = router_runtime.description

                    for group, runtime in replica_runtimes.items():
                        serving = runtime.serving
                        self.say(f"asking {runtime.description} which {serving.title} arguments it accepts")
                        probe = runtime.probe(timeout_s=profile.timeouts.probe_s)
                        probes[group] = probe
                        problems = serving.check(plan.pool_argvs(pools=group.pools), probe)
                        self._record_probe(serving, probe, problems)
                        raise_for_problems(problems, profile=source, server=serving.title)

                    config_dir = workdir / "router"
                    config_dir.mkdir(mode=0o755)
                    config_file = config_dir / ROUTER_CONFIG_NAME
                    config_file.write_text(json.dumps(valid.router_mapping, indent=2), encoding="utf-8")
                    config_file.chmod(0o644)
                    check_ports_free([plan.router_port, *(r.port for r in plan.replicas)])

                stack = RunningStack(plan=plan)
                with self._phase("start"):
                    self._start(stack, replica_runtimes, router_runtime, probes, config_dir, valid.upstream_api_key)
                with self._phase("traffic"):
                    traffic = valid.traffic
                    if self.before_traffic is not None:
                        traffic = self.before_traffic(plan, valid.upstream_api_key, traffic)
                    self._traffic(stack, traffic, valid.kill_traffic, valid.api_key)
                self.report["result"] = "passed"
            except BaseException as exc:
                error = exc
                self._record_end(exc)
                raise
            finally:
                # A first signal during the teardown (bounded in time) waits for it; the report is written before
                # it starts, so it is true even if a second signal ends everything at once.
                with interrupt.deferred():
                    if error is not None:
                        self._finish(started, quiet=True)
                    with self._phase("teardown"):
                        self._teardown(stack, list(replica_runtimes.values()), router_runtime, workdir, error)
                    self._finish(started)
        return self.report

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        """One step of the run, timed in the report; the one running when the run ends is named there."""
        self.running = name
        start = time.monotonic()
        try:
            yield
        finally:
            self.report.setdefault("phases", {})[name] = round(time.monotonic() - start, 2)

    def _record_end(self, exc: BaseException) -> None:
        if isinstance(exc, KeyboardInterrupt):
            # SIGTERM and SIGHUP arrive as Ctrl-C does (builders/interrupt.py).
            self.report["result"] = "interrupted"
            self.report["signal"] = interrupt.signal_of(exc)
        else:
            self.report["result"] = "failed"
        self.report["ended_in"] = self.running

    def _record_probe(self, serving: ServingEngine, probe: ServerProbe, problems: list[ArgProblem]) -> None:
        self.report.setdefault("servers", {})[serving.kind] = {
            "entry": list(probe.entry),
            "flags_known": len({id(o) for o in probe.spec.options.values()}),
            "notes": list(probe.notes),
            "argument_problems": [
                {"severity": p.severity, "pool": p.pool, "key": p.key, "argument": p.argument, "message": p.render()}
                for p in problems
            ],
        }
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
        self.report["startup"] = {
            "warm_up_s": round(warm, 2),
            "replicas": {
                r.label: {
                    "port": r.port,
                    "cpus": r.cpuset,
                    "healthy_after_s": stack.startup_s.get(r.label),
                    "parts": parts[r.label],
                }
                for r in plan.replicas
            },
            "router": {"port": plan.router_port, "healthy_after_s": stack.startup_s.get("router")},
        }

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
        traffic: dict[str, Any] = {}
        self.report["traffic"] = traffic
        main = self._drive(stack, base, api_key, "main")
        self.results["main"] = main
        traffic["main"] = self._result_json(main, stack.plan)
        failures = [f"{c.value}: {'; '.join(s.gate_failures)}" for c, s in main.summaries.items() if not s.gate_passed]
        checks: dict[str, Any] = {}
        self.report["checks"] = checks
        if profile.model_pools():
            checks["models"] = reach_every_model(
                profile, stack.plan.router_url, api_key, timeout_s=base.request_timeout_s
            )
            failures += [f"models: {f}" for f in checks["models"]["failures"]]
        if self.options.check_slow_clients:
            # The baseline sends the same streams to the same pool and reads them at full speed: the servers
            # do the same work, so what differs is only how slowly the clients read.
            fast = base.model_copy(update={"slow_stream": base.slow_stream.model_copy(update={"read_delay_s": 0.0})})
            without = self._drive(stack, fast, api_key, "baseline: the slow clients read at full speed")
            traffic["baseline_fast_readers"] = self._result_json(without, stack.plan)
            margins = profile.checks.slow_clients
            slow_pool = profile.classes[RequestClass.SLOW_STREAM]
            judged: set[RequestClass] = {
                c
                for c in ALL_CLASSES
                if c is not RequestClass.SLOW_STREAM
                and (margins.scope == "all_classes" or profile.classes[c] != slow_pool)
            }
            checks["slow_clients"] = compare_slow_clients(
                main, without, judged=judged, max_ratio=margins.max_ratio, allowance_ms=margins.allowance_ms
            )
            checks["slow_clients"]["scope"] = margins.scope
            failures += [f"slow-client isolation: {f}" for f in checks["slow_clients"]["failures"]]
        if self.options.check_kill_replica:
            checks["kill_replica"] = self._kill_check(stack, kill_traffic, api_key)
            traffic["kill_replica"] = checks["kill_replica"].pop("traffic")
            failures += [f"kill-replica isolation: {f}" for f in checks["kill_replica"]["failures"]]
        self.report["gates"] = {"passed": not failures, "failures": failures}
        if failures:
            raise SmokeFailed(
                f"profile {profile.name}: {len(failures)} gate(s) failed:\n  " + "\n  ".join(failures),
                hint="the report names each class's numbers; compare with the profile's SLOs",
            )

    def _kill_check(self, stack: RunningStack, base: TrafficPlan, api_key: str) -> dict[str, Any]:
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
            return {
                "traffic": self._result_json(result, stack.plan),
                "failures": [
                    f"the run ended before {victim.label} was generating after {settings.after_s:.0f}s; kill "
                    "earlier or give the kill run more traffic for that pool (checks.kill_replica.traffic)"
                ],
                "passed": False,
            }
        verdict = judge_kill(
            result,
            plan=stack.plan,
            victim=victim,
            killed_at_s=killed_at[0],
            error_within_s=settings.error_within_s,
        )
        verdict["traffic"] = self._result_json(result, stack.plan)
        return verdict

    @staticmethod
    def _result_json(result: TrafficResult, plan: StackPlan) -> dict[str, Any]:
        return {
            "wall_s": round(result.wall_s, 2),
            "stopped_by": result.stopped_by,
            "requests": len(result.records),
            "classes": {c.value: {"pool": plan.profile.classes[c], **s.as_json()} for c, s in result.summaries.items()},
        }

    def _teardown(
        self,
        stack: RunningStack | None,
        replicas: list[ReplicaRuntime],
        router: RouterRuntime | None,
        workdir: Path,
        error: BaseException | None,
    ) -> None:
        teardown: dict[str, Any] = {}
        self.report["teardown"] = teardown
        if stack is not None:
            if self.options.report_dir is not None and error is not None:
                self._save_logs(stack)
            self.say(f"stopping {len(stack.everything())} server(s)")
            errors: list[str] = []
            # The router first, so nothing new reaches a replica; then every replica at once, so a replica
            # slow to honour SIGTERM does not make the others wait.
            t0 = time.monotonic()
            if stack.router is not None:
                errors += _stop_all([stack.router])
            t1 = time.monotonic()
            errors += _stop_all(list(stack.replicas.values()))
            teardown["stop_s"] = {"router": round(t1 - t0, 1), "replicas": round(time.monotonic() - t1, 1)}
            if errors:
                teardown["stop_errors"] = errors
        runtimes: list[ReplicaRuntime | RouterRuntime] = [*replicas, *([router] if router is not None else [])]
        for runtime in runtimes:
            # Whatever carries this run's label but was never handed back (a start that failed half way).
            runtime.sweep(self.run_id)
        leftovers = [item for runtime in runtimes for item in runtime.leftovers(self.run_id)]
        teardown["leftovers"] = sorted(set(leftovers))
        teardown["clean"] = not leftovers
        if leftovers:
            self.say(f"[red]still running after teardown:[/red] {', '.join(sorted(set(leftovers)))}")
        shutil.rmtree(workdir, ignore_errors=True)
        if error is not None:
            teardown["ended_by"] = f"{type(error).__name__}: {error}"[:500]

    def _save_logs(self, stack: RunningStack) -> None:
        assert self.options.report_dir is not None
        logs = self.options.report_dir / f"smoke-{stack.plan.profile.name}-{self.run_id}-logs"
        logs.mkdir(parents=True, exist_ok=True)
        for launched in stack.everything():
            (logs / f"{launched.name}.log").write_text(launched.logs(tail=400), encoding="utf-8")
        self.report["logs_dir"] = str(logs)

    def _finish(self, started: float, *, quiet: bool = False) -> None:
        self.report["duration_s"] = round(time.time() - started, 1)
        if self.options.report_dir is not None:
            self.options.report_dir.mkdir(parents=True, exist_ok=True)
            path = self.options.report_dir / f"smoke-{self.options.profile.name}-{self.run_id}.json"
            # Staged and renamed: a signal that ends the process mid-write leaves the previous version whole.
            staged = path.with_name(f".{path.name}.new")
            staged.write_text(json.dumps(self.report, indent=2) + "\n", encoding="utf-8")
            staged.replace(path)
            self.report["report_file"] = str(path)
            if not quiet:
                self.say(f"report: {path}")


def _kill_everything(stack: RunningStack | None, runtimes: list[Any], run_id: str) -> None:
    """After a second signal: every server of the run dies now (SIGKILL), then whatever carries its label goes."""
    if stack is not None:
        for launched in stack.everything():
            launched.kill()
    for runtime in runtimes:
        runtime.sweep(run_id)


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
    return ReplicaPlan(
        pool=replica.pool,
        index=replica.index,
        port=replica.port,
        args=replica.args,
        keys=replica.keys,
        env={**replica.env, **extra},
        name=replica.name,
        cpuset=replica.cpuset,
        engine=replica.engine,
    )


def summary_table(report: dict[str, Any]) -> Table:
    """The main run per class, with the pool that served it."""
    table = Table(title=f"forge smoke {report.get('profile')} (run {report.get('run_id')})")
    classes = report.get("traffic", {}).get("main", {}).get("classes", {})
    # A stack Forge did not start (--endpoint) is described by where its answers came from.
    where = any("served_where" in row for row in classes.values())
    columns = ["class", "pool", "req", "err", "TTFT p50/p99 ms", "ITL p50/p99 ms", "goodput", "gate"]
    for column in [*columns, "served where"] if where else columns:
        table.add_column(column)
    for name, row in classes.items():

        def pair(key: str, row: dict[str, Any] = row) -> str:
            values = row.get(key) or {}
            return " / ".join("-" if values.get(q) is None else f"{values[q]:.1f}" for q in ("p50", "p99"))

        table.add_row(
            name,
            str(row.get("pool")),
            str(row.get("requests")),
            str(row.get("errors")),
            pair("ttft_ms"),
            pair("itl_ms"),
            f"{row.get('goodput', 0):.2f}",
            "pass" if row.get("gate_passed") else "FAIL",
            *([", ".join(f"{k} {v}" for k, v in row.get("served_where", {}).items())] if where else []),
        )
    return table


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
