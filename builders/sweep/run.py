"""Run a sweep: each profile in turn on the same image, the same seeded traffic, one report.

A sweep is a table of phases over one SweepRun (builders/runs.py's skeleton): one phase per profile run, in the
interleaved order of builders/sweep/repeat.py and named after its profile, then the verdict and the plots.
sweep.json is written after every profile run and whatever ends the sweep, so a sweep cut short keeps what it
measured and says where it stopped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from builders import interrupt
from builders.cpusets import parse_cpuset
from builders.errors import SmokeFailed
from builders.router.classes import RequestClass
from builders.runs import Phase, ended_by_signal, run_phases
from builders.smoke.plan import StackPlan
from builders.smoke.runtimes import ReplicaRuntime, RouterRuntime
from builders.smoke.stack import SmokeOptions, SmokeRun, traffic_plan
from builders.sweep.calibrate import (
    LoadSize,
    ModelSize,
    arrivals_within,
    describe_rates,
    measure,
    open_loop_classes,
    scale_traffic,
    size_load,
    smaller_model,
)
from builders.sweep.claims import judge
from builders.sweep.definition import SweepProfile, SweepSettings
from builders.sweep.repeat import aggregate, load_average, repetition_seed, schedule
from builders.sweep.report import class_rows, compare_to, judge_validity, render_markdown, write_plots
from builders.sweep.report_model import (
    Calibration,
    Measurement,
    PoolShape,
    ProfileRun,
    Repetition,
    Resize,
    SweepReport,
    Validity,
)
from builders.sweep.report_model import LoadAverage as LoadAverageRecord
from builders.traffic.plan import TrafficPlan

REFERENCE = "shared"
SWEEP_FILES = ("sweep.json", "sweep.md", "ttft-cdf.png", "goodput.png")
WORK_CONSERVING = "work-conserving"


@dataclass(frozen=True, kw_only=True)
class SweepOptions:
    profiles: list[SweepProfile]
    report_dir: Path
    base_port: int | None = None
    plots: bool = True
    settings: SweepSettings = field(default_factory=SweepSettings)
    rate_scale: float = 1.0
    """A further factor on every rate after calibration (--rate-scale: a forced overload is 10)."""
    repeat: int = 1
    """How many times every profile runs (--repeat), interleaved, each repetition with its own traffic seed."""
    replica_cache: str = "none: every replica starts cold"
    """What the replicas share between starts, in words, for the report (forge sweep's --cold-replicas)."""


def describe_load(first: SweepProfile, plan: TrafficPlan | None = None) -> str:
    """The offered load in words: every open-loop class's rate, the duration and the CPU budget."""
    plan = plan or traffic_plan(first.profile, str(first.path))
    return f"{describe_rates(plan)}; {plan.deadline_s:.4g} s, seed {plan.seed}; {first.cpu_budget} CPUs per profile"


class ModelResize(Exception):
    """Raised from the first profile's traffic hook: the model must shrink before the load can fit, so that
    profile is torn down and started again with `size` (its replicas load the model when they start)."""

    def __init__(self, size: ModelSize) -> None:
        super().__init__(f"the model shrinks to {size.num_hidden_layers} layers of {size.hidden_size}")
        self.size = size


def model_size(profile: SweepProfile) -> ModelSize:
    model = profile.profile.model
    return ModelSize(hidden_size=model.hidden_size, num_hidden_layers=model.num_hidden_layers)


def resized(profile: SweepProfile, size: ModelSize) -> SweepProfile:
    """The profile serving a model of `size`; an explicit MLP width shrinks with the hidden size."""
    model = profile.profile.model
    update = {"hidden_size": size.hidden_size, "num_hidden_layers": size.num_hidden_layers}
    if model.intermediate_size is not None:
        update["intermediate_size"] = max(64, model.intermediate_size * size.hidden_size // model.hidden_size)
    stack_profile = profile.profile.model_copy(update={"model": model.model_copy(update=update)})
    return SweepProfile(profile=stack_profile, path=profile.path)


@dataclass(kw_only=True)
class LoadSizer:
    """Measures one replica of the first profile that starts (again after a model resize), then gives every
    profile the same scaled plan."""

    options: SweepOptions
    profiles: list[SweepProfile]
    """The sweep's profiles as they run: after a resize, with the smaller model."""
    console: Console
    record: Calibration
    size: LoadSize | None = None
    resizes: int = 0
    sized: bool = False

    def batch_sizes(self) -> tuple[int, ...]:
        # The largest batch every profile's pools allow (interactive-tuned pools take 16), and one stream.
        seqs = [p.max_sequences for sp in self.profiles for p in sp.profile.pools.values() if p.max_sequences]
        return (1, min(seqs) if seqs else 16)

    def __call__(self, plan: StackPlan, api_key: str, traffic: TrafficPlan) -> TrafficPlan:
        settings = self.options.settings
        if not self.sized:
            if settings.calibrate:
                self._calibrate(plan, api_key, traffic)
            else:
                self.record.calibrated, self.record.factor = False, 1.0
                self._announce_thin_classes(traffic, traffic.deadline_s)
            self.sized = True
        factor = (self.size.rate_factor if self.size else 1.0) * self.options.rate_scale
        window = self.size.window_s if self.size else traffic.deadline_s
        self.record.rate_scale = self.options.rate_scale
        self.record.applied_factor = round(factor, 4)
        self.record.window_s = round(window, 1)
        if factor == 1.0 and window == traffic.deadline_s:
            return traffic
        return scale_traffic(traffic, factor, window_s=window)

    def _announce_thin_classes(self, traffic: TrafficPlan, window: float) -> None:
        minimum = self.options.settings.min_arrivals
        thin = {
            c.value: n
            for c in open_loop_classes(traffic)
            if (n := arrivals_within(scale_traffic(traffic, self.options.rate_scale), c, window)) < minimum
        }
        if thin:
            listing = ", ".join(f"{name} {n}" for name, n in thin.items())
            self.console.print(
                f"[yellow]warning:[/yellow] uncalibrated, these classes get fewer than {minimum} arrivals in "
                f"{window:g} s: {listing}; their gates judge too few requests to compare profiles by"
            )
            self.record.under_min_arrivals = thin

    def _calibrate(self, plan: StackPlan, api_key: str, traffic: TrafficPlan) -> None:
        settings = self.options.settings
        replica = plan.replicas[0]
        # Half the context: a long prompt, with room to spare whatever the tokenizer makes of the words.
        prompt = min(traffic.prompt_tokens_at_most(RequestClass.LONG_PREFILL), traffic.max_model_len // 2)
        current = model_size(self.profiles[0])
        self.console.print(
            f"calibration: measuring {replica.label} (cpus {replica.cpuset}) of {plan.profile.name}, model "
            f"{current.num_hidden_layers} layers of {current.hidden_size}"
        )
        capacity = measure(
            replica, api_key=api_key, traffic=traffic, prompt_tokens=prompt, batch_sizes=self.batch_sizes()
        )
        replica_cpus = len(parse_cpuset(replica.cpuset)) if replica.cpuset else 1
        replicas_worth = self.profiles[0].cpu_budget / replica_cpus
        size = size_load(
            traffic,
            capacity,
            replicas_worth=replicas_worth,
            load_fraction=settings.load_fraction,
            min_arrivals=settings.min_arrivals,
            max_window_s=settings.max_window_s,
            min_scale=settings.min_scale,
            max_scale=settings.max_scale,
        )
        sizing = size.as_json()
        measured = Measurement(model=current.as_json(), capacity=capacity.as_json(), **sizing.model_dump())
        record = self.record
        record.measurements = [*(record.measurements or []), measured]
        record.calibrated = True
        record.capacity = capacity.as_json()
        record.model = current.as_json()
        record.configured_load = describe_rates(traffic)
        record.configured_utilisation = round(size.configured_utilisation, 3)
        record.load_fraction = settings.load_fraction
        record.replicas_worth = replicas_worth
        record.factor = round(size.rate_factor, 4)
        record.clamped = size.rate_factor != size.wanted_factor
        record.sizing = sizing
        self.console.print(
            f"calibration: prefill {capacity.prefill_tokens_per_s:.0f} tok/s, decode "
            + ", ".join(f"{v:.0f} tok/s at batch {b}" for b, v in sorted(capacity.decode_tokens_per_s.items()))
            + f"; the configured load is {size.configured_utilisation:.2f}x of {replicas_worth:g} replica(s): "
            f"rates x{size.rate_factor:.3g} over {size.window_s:.0f} s (x{size.wanted_factor:.3g} alone would land "
            f"on {settings.load_fraction:g} of capacity; every class keeps {settings.min_arrivals} arrivals: "
            + ", ".join(f"{k} {v}" for k, v in size.arrivals.items())
            + ")"
        )
        if size.model_ratio < 1.0:
            smaller = smaller_model(current, size.model_ratio)
            if settings.resize_model and self.resizes == 0 and smaller != current:
                self.resizes += 1
                self.console.print(
                    f"calibration: the prefill work must come down to {size.model_ratio:.2g} of this model's: "
                    f"starting {plan.profile.name} again with {smaller.num_hidden_layers} layers of "
                    f"{smaller.hidden_size} (was {current.num_hidden_layers} of {current.hidden_size})"
                )
                resize = Resize.model_validate({"from": current.as_json(), "to": smaller.as_json()})
                self.record.resized = [*(self.record.resized or []), resize]
                raise ModelResize(smaller)
            self.console.print(
                f"[yellow]warning:[/yellow] the load stays above the fraction asked for: an estimated "
                f"{size.configured_utilisation * size.rate_factor:.2f} of capacity (the model is not shrunk further; decode's per-step "
                "cost does not shrink with it)"
            )
            self.record.over_fraction = round(size.configured_utilisation * size.rate_factor, 3)
        self.size = size


def with_seed(profile: SweepProfile, seed: int) -> SweepProfile:
    """The profile sending its traffic drawn from `seed` (a repetition's, builders/sweep/repeat.py)."""
    stack_profile = profile.profile.model_copy(update={"traffic": {**profile.profile.traffic, "seed": seed}})
    return SweepProfile(profile=stack_profile, path=profile.path)


def repetitions_validity(repetitions: list[Repetition], *, floor: float) -> Validity:
    """Judge each repetition as judge_validity judges a single run (recorded in it); the sweep is valid when
    one repetition is, and the invalid ones are left out of the medians (repeat.aggregate skips them)."""
    for repetition in repetitions:
        verdict = judge_validity(repetition.profiles, reference=REFERENCE, floor=floor, names=list(repetition.profiles))
        repetition.validity = verdict
        repetition.valid = verdict.valid
    valid = [r.repetition for r in repetitions if r.valid]
    invalid = [f"repetition {r.repetition}: {r.validity.why}" for r in repetitions if not r.valid and r.validity]
    why = f"{len(valid)} of {len(repetitions)} repetitions valid" + (
        ", left out of the medians: " + "; ".join(invalid) if invalid else ""
    )
    first = repetitions[0].validity if repetitions else None
    return Validity(
        valid=bool(valid),
        reference=first.reference if first else None,
        served_fraction=first.served_fraction if first else None,
        floor=floor,
        why=why,
    )


@dataclass(kw_only=True)
class SweepRun:
    """What the phases of one sweep share: the options, the report they fill in, the profiles as they run (the
    model resized, once, after calibration), the load sizers, and the profile run under way."""

    options: SweepOptions
    replicas: Callable[[str, str | None, Path, Path], ReplicaRuntime]
    router: Callable[[Path], RouterRuntime]
    console: Console
    report: SweepReport
    profiles: list[SweepProfile]
    sizers: dict[str, LoadSizer] = field(default_factory=dict)
    """The load sizer of each serving engine (one, under "", unless each engine is calibrated on its own)."""
    engine: str = ""
    """The serving engine(s) of the profile run under way."""
    loads: dict[str, float | None] = field(default_factory=dict)
    current: SmokeRun | None = None

    @property
    def path(self) -> Path:
        return self.options.report_dir / "sweep.json"

    @property
    def per_engine(self) -> bool:
        """Whether each serving engine is calibrated on its own: one load sized for the first engine measured
        overloads a slower one, and its table then ranks failures."""
        return self.options.settings.calibrate_per_engine and len({p.engine for p in self.profiles}) > 1

    def sizer(self) -> LoadSizer:
        """The sizer of the profile run under way. With several serving engines each is measured on its own first
        replica and offered load_fraction of its own capacity; the model is the same for all, so only the first
        measurement may shrink it, and the others are recorded under the calibration's `engines`."""
        key = self.engine if self.per_engine else ""
        if key not in self.sizers:
            calibration = self.report.calibration
            first = not self.sizers
            if not first:
                calibration.engines = {**(calibration.engines or {}), key: Calibration()}
            record = calibration if first else (calibration.engines or {})[key]
            if self.per_engine:
                record.engine = key
            settings = self.options.settings
            if not first:
                settings = settings.model_copy(update={"resize_model": False})
            self.sizers[key] = LoadSizer(
                options=replace(self.options, settings=settings),
                profiles=self.profiles,
                console=self.console,
                record=record,
            )
        return self.sizers[key]

    def before_traffic(self, plan: StackPlan, api_key: str, traffic: TrafficPlan) -> TrafficPlan:
        # Read as the traffic starts, after startup and calibration: what the measured requests competed with.
        sized = self.sizer()(plan, api_key, traffic)
        self.loads["start"] = load_average()
        return sized

    # The skeleton's side (builders/runs.Run).
    def step(self, name: str) -> AbstractContextManager[object]:
        return contextlib.nullcontext()

    def record_phase(self, name: str, seconds: float) -> None:
        """Each profile run's report has its phases' seconds; sweep.json keeps the fields it always had."""

    def record_end(self, error: BaseException | None, phase: str | None) -> None:
        if error is None:
            return
        # Ctrl-C, SIGTERM or SIGHUP (builders/interrupt.py): the profiles measured so far, and where it stopped.
        report = self.report
        report.result = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
        report.signal = ended_by_signal(error)
        report.ended_in = phase
        report.ended_in_phase = self._profile_phase()

    def _profile_phase(self) -> str | None:
        """The phase of the profile run under way that the run ended in; its report has it once it has ended (by
        then its own teardown has run, so `running` says teardown)."""
        run = self.current
        return None if run is None else (run.report.ended_in or run.running)

    def write_report(self) -> None:
        self.report.save(self.path)

    def teardown(self, error: BaseException | None) -> None:
        """Nothing of its own: each profile run stopped its stack when it ended."""

    def end_at_once(self, phase: str | None) -> None:
        """A second signal: the report says where the sweep stopped before Forge exits (the profile run's own
        hook kills its servers)."""
        report = self.report
        if report.result is None:
            report.result, report.signal, report.ended_in = "interrupted", interrupt.first_signal(), phase
            report.ended_in_phase = self._profile_phase()
        self.write_report()


def _profile_run(repetition: int, position: int) -> Callable[[SweepRun], None]:
    """The phase that runs profile `position` in `repetition`."""

    def run(ctx: SweepRun) -> None:
        _run_profile(ctx, repetition, position)

    return run


def _run_profile(ctx: SweepRun, repetition: int, position: int) -> None:
    """One profile run; a profile whose gates fail is a result, one that cannot start is recorded as failed with
    its reason and the sweep goes on. A model resize starts the same profile again."""
    options, report = ctx.options, ctx.report
    seed = report.seeds[repetition]
    rep = report.repetitions[repetition]
    while True:
        sweep_profile = with_seed(ctx.profiles[position], seed)
        profile = sweep_profile.profile
        ctx.engine = sweep_profile.engine
        ctx.loads.clear()
        ctx.console.print(
            f"[bold]sweep: profile {profile.name}[/bold] ({profile.description})"
            + (f", repetition {repetition + 1} of {options.repeat}, seed {seed}" if options.repeat > 1 else "")
        )
        run = ctx.current = SmokeRun(
            options=SmokeOptions(
                profile=profile,
                profile_path=sweep_profile.path,
                report_dir=options.report_dir / "runs",
                base_port=options.base_port,
            ),
            replicas_runtime_factory=ctx.replicas,
            router_runtime_factory=ctx.router,
            console=ctx.console,
            before_traffic=ctx.before_traffic,
        )
        try:
            run.execute()
        except ModelResize as resize:
            # Every profile serves the smaller model, this one included: it starts again, and the sizer
            # measures its first replica anew before any traffic.
            ctx.profiles[:] = [resized(p, resize.size) for p in ctx.profiles]
            for sizer in ctx.sizers.values():
                sizer.sized = False
            continue
        except SmokeFailed as exc:
            if "main" not in run.results:
                report.failed_profiles.setdefault(profile.name, exc.message[:2000])
                rep.failed[profile.name] = exc.message[:2000]
                ctx.current = None
                return
        break
    ctx.current = None  # over: a later step that stops names no profile phase
    # Read once the run is over (its teardown included, seconds): the host's load as the traffic ended.
    ctx.loads["end"] = load_average()
    result = run.results["main"]
    if report.dtype is None:
        report.dtype = run.report.dtype
    if repetition == 0:
        report.load = describe_load(sweep_profile, result.plan)
    report.model = model_size(sweep_profile).as_json()
    record = ProfileRun(
        file=str(sweep_profile.path),
        description=profile.description,
        dtype=run.report.dtype.dtype if run.report.dtype is not None else None,
        engine=sweep_profile.engine,
        pools={name: PoolShape(replicas=pool.replicas, cpus=list(pool.cpus)) for name, pool in profile.pools.items()},
        wall_s=round(result.wall_s, 2),
        # Each replica's time to health and where it went (builders/engines/vllm/startup.py).
        startup=run.report.startup,
        stopped_by=result.stopped_by,
        classes=class_rows(result),
        repetition=repetition,
        seed=seed,
        load_average_1m=LoadAverageRecord(start=ctx.loads.get("start"), end=ctx.loads.get("end")),
    )
    # The first repetition's run is the profile's row as a single sweep writes it (and what the plots draw);
    # every repetition's numbers, without the CDF samples, are under `repetitions`.
    report.profiles.setdefault(profile.name, record)
    rep.order.append(profile.name)
    rep.profiles[profile.name] = record.model_copy(
        update={"classes": {c: row.model_copy(update={"ttft_samples_ms": None}) for c, row in record.classes.items()}}
    )
    # Written after every profile too, so a sweep cut short (Ctrl-C, a CI time limit) keeps what it measured.
    ctx.write_report()


def _verdict(ctx: SweepRun) -> None:
    """The goal, whether the run compares anything, the medians over repetitions and the claims; sweep.md."""
    report, options = ctx.report, ctx.options
    report.goal = compare_to(report.profiles, reference=REFERENCE, candidate=WORK_CONSERVING)
    if options.repeat == 1:
        validity = judge_validity(
            report.profiles, reference=REFERENCE, floor=options.settings.served_floor, names=list(report.profiles)
        )
        report.validity = report.repetitions[0].validity = validity
        report.repetitions[0].valid = validity.valid
    else:
        report.validity = repetitions_validity(report.repetitions, floor=options.settings.served_floor)
    report.aggregate = aggregate(report.repetitions)
    report.claims = judge(report.aggregate)
    (options.report_dir / "sweep.md").write_text(render_markdown(report), encoding="utf-8")


def _plots(ctx: SweepRun) -> None:
    write_plots(ctx.report, ctx.options.report_dir)


def sweep_phases(options: SweepOptions) -> list[Phase[SweepRun]]:
    """Every profile run in the interleaved order (named after its profile), then the verdict and the plots."""
    runs = [
        Phase(options.profiles[position].profile.name, _profile_run(repetition, position))
        for repetition, position in schedule(len(options.profiles), options.repeat)
    ]
    return [
        *runs,
        Phase("verdict", _verdict),
        Phase("plots", _plots, wanted=lambda ctx: ctx.options.plots and bool(ctx.report.profiles)),
    ]


def run_sweep(
    options: SweepOptions,
    *,
    replicas: Callable[[str, str | None, Path, Path], ReplicaRuntime],
    router: Callable[[Path], RouterRuntime],
    console: Console,
) -> SweepReport:
    """Drive every profile (sweep_phases) over one SweepRun; returns the report, as sweep.json holds it."""
    started = datetime.now(UTC)
    options.report_dir.mkdir(parents=True, exist_ok=True)
    # An earlier sweep's verdict and plots must not sit beside this sweep's runs, whatever ends this one.
    for name in SWEEP_FILES:
        (options.report_dir / name).unlink(missing_ok=True)
    profiles = list(options.profiles)
    common_seed = traffic_plan(profiles[0].profile, str(profiles[0].path)).seed
    seeds = [repetition_seed(common_seed, r) for r in range(options.repeat)]
    report = SweepReport(
        started_at=started.isoformat(timespec="seconds"),
        load=describe_load(options.profiles[0]),
        cpu_budget=options.profiles[0].cpu_budget,
        calibration=Calibration(),
        replica_cache=options.replica_cache,
        profiles={},
        failed_profiles={},
        repeat=options.repeat,
        seeds=seeds,
        repetitions=[
            Repetition(repetition=r, seed=seeds[r], order=[], profiles={}, failed={}) for r in range(options.repeat)
        ],
    )
    ctx = SweepRun(
        options=options,
        replicas=replicas,
        router=router,
        console=console,
        report=report,
        profiles=profiles,
    )
    run_phases(ctx, sweep_phases(options))
    return report
