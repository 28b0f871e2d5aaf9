"""The sweep's report (`sweep.json`) as typed models: what `forge sweep` writes after every profile run and at the
end, what the claims, the table and the plots read, and what `SweepReport.read(path)` validates.

A section the sweep has not reached yet (the verdicts, before every profile ran) is absent from the file; a
value not measured inside a section is null.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from builders.records import Record, absent
from builders.serving_dtype import DtypeRecord
from builders.smoke.report import Quantiles, Startup


class ClassRow(Record):
    """One class of one profile run: the summary's numbers and what a sweep compares profiles by."""

    requests: int = Field(description="requests sent")
    errors: int = Field(description="requests that failed")
    ttft_ms: Quantiles = Field(description="time to first token of the successful requests")
    itl_ms: Quantiles = Field(description="gaps between streamed tokens")
    goodput: float = Field(description="fraction of the requests sent that met every SLO of the class")
    good: int = Field(description="requests that met every SLO of the class")
    gate_passed: bool = Field(description="the class met its gate")
    useful_tokens_per_s: float = Field(description="the good requests' output tokens over the run's wall time")
    served_by: dict[str, int] = Field(description="requests per pool that answered (where spill put them)")
    ttft_samples_ms: list[float] | None = absent(
        "every successful request's TTFT, sorted: what the CDF plot draws; absent under `repetitions`"
    )


class LoadAverage(Record):
    start: float | None = Field(description="the host's 1-minute load average as the traffic started")
    end: float | None = Field(description="as the run (teardown included) ended")


class PoolShape(Record):
    replicas: int = Field(description="servers in the pool")
    cpus: list[str] = Field(description="the CPU set of each replica")


class ProfileRun(Record):
    """One run of one profile."""

    file: str = Field(description="the profile's YAML file")
    description: str = Field(description="the profile's description")
    dtype: str | None = Field(description="the dtype its replicas served")
    engine: str = Field(description="the serving engine(s) its pools ran (vllm, llama-cpp, vllm+llama-cpp)")
    pools: dict[str, PoolShape] = Field(description="per pool, its replicas and CPU sets")
    wall_s: float = Field(description="seconds of traffic")
    startup: Startup | None = Field(description="each replica's time to health and where it went")
    stopped_by: Literal["completed", "budget", "deadline"] = Field(description="what ended the traffic")
    classes: dict[str, ClassRow] = Field(description="per request class")
    repetition: int = Field(description="which repetition this run was (0 first)")
    seed: int = Field(description="the traffic seed it sent")
    load_average_1m: LoadAverage = Field(description="the host's load around the run")


class Validity(Record):
    """Whether the run compares anything: the reference profile answered at least `floor` of its requests."""

    valid: bool = Field(description="the reference answered enough")
    reference: str | None = Field(description="the profile judged (shared, or the first that ran)")
    served_fraction: float | None = Field(description="its requests answered without error / sent")
    floor: float = Field(description="sweep.served_floor")
    why: str = Field(description="the verdict in words")


class Repetition(Record):
    repetition: int = Field(description="its index, 0 first")
    seed: int = Field(description="its traffic seed (the first repetition's is the profiles' own)")
    order: list[str] = Field(description="the profiles in the order they ran")
    profiles: dict[str, ProfileRun] = Field(description="each profile's run, without the CDF samples")
    failed: dict[str, str] = Field(description="profiles that could not run, and why")
    validity: Validity | None = absent("this repetition judged as a single run is")
    valid: bool | None = absent("validity.valid: an invalid repetition is left out of the medians")


class Spread(Record):
    """One metric over the valid repetitions."""

    median: float | None = Field(description="null when no repetition measured it")
    min: float | None = Field(description="smallest value")
    max: float | None = Field(description="largest value")
    n: int = Field(description="how many repetitions measured it")
    values: list[float] = Field(description="each measured value")


class ClassSpread(Record):
    ttft_p99_ms: Spread = Field(description="TTFT p99, ms")
    itl_p99_ms: Spread = Field(description="ITL p99, ms")
    goodput: Spread = Field(description="goodput")
    gate_passes: int = Field(description="valid repetitions in which its gate passed")
    runs: int = Field(description="valid repetitions that ran it")


class ProfileSpread(Record):
    classes: dict[str, ClassSpread] = Field(description="per request class")
    gates_passed: Spread = Field(description="classes whose gate passed, per repetition")
    mean_goodput: Spread = Field(description="the mean goodput over classes, per repetition")


class Goal(Record):
    """The work-conserving profile against the shared pool (the same arrivals were sent to both)."""

    interactive_ttft_p99_ratio: float | None = Field(description="interactive TTFT p99, candidate / shared")
    long_prefill_good_ratio: float | None = Field(description="long_prefill good requests, candidate / shared")
    batch_good_ratio: float | None = Field(
        description="batch good requests, candidate / shared: not part of the goal, shown so that a profile cannot "
        "meet it by starving the other bulk class"
    )


class SpreadFigure(Record):
    """A spread as a claim quotes it."""

    median: float | None = Field(description="median over the valid repetitions")
    min: float | None = Field(description="smallest")
    max: float | None = Field(description="largest")
    n: int | None = Field(description="how many measured it")


# What a claim quotes: a gate state, a spread, a list of names, or per profile a state, a list or the balance key.
Figure = str | list[str] | SpreadFigure | dict[str, str] | dict[str, list[str]] | dict[str, tuple[float, float]]
Verdict = Literal["holds", "does not hold", "cannot be told apart from noise", "not run"]


class Claim(Record):
    claim: str = Field(description="the claim, in words")
    verdict: Verdict = Field(description="what the sweep says of it (builders/sweep/claims.py)")
    numbers: dict[str, Figure] = Field(description="the figures it was judged on")


class CapacityRecord(Record):
    """One replica's measured throughput (builders/sweep/calibrate.py)."""

    replica: str = Field(description="POOL/INDEX of the replica measured")
    cpus: str | None = Field(description="its CPU set")
    prefill_tokens_per_s: float = Field(description="prompt tokens per second on a long prompt")
    decode_tokens_per_s: dict[str, float] = Field(description="output tokens per second, by concurrent streams")
    decode_batch_used: int = Field(description="the batch whose decode rate the load estimate used")
    seconds: float = Field(description="how long the measurement took")


class ModelSizeRecord(Record):
    hidden_size: int = Field(description="the generated Llama's hidden size")
    num_hidden_layers: int = Field(description="its layers")


class Sizing(Record):
    """How the load was sized to the measured capacity."""

    configured_utilisation: float = Field(description="the configured plan's estimated work over capacity")
    wanted_factor: float = Field(description="the rate factor that alone would land on the fraction")
    floor_factor: float = Field(description="the smallest factor that keeps every class's minimum arrivals")
    rate_factor: float = Field(description="the factor applied")
    window_s: float = Field(description="the traffic window")
    model_ratio: float = Field(description="what the per-token prefill cost had to be cut to (1: kept)")
    expected_utilisation: float = Field(description="the estimate at rate_factor with the model cut")
    min_arrivals: int = Field(description="sweep.min_arrivals")
    arrivals: dict[str, int] = Field(description="each open-loop class's arrivals in the window")


class _Measured(Record):
    model: ModelSizeRecord = Field(description="the model's size when measured")
    capacity: CapacityRecord = Field(description="what the replica did")


# The model and capacity first, then the sizing's fields: a model's fields follow its bases from the last to the
# first.
class Measurement(Sizing, _Measured):
    """One calibration: the model measured, the replica's capacity, and the sizing it led to."""


class Resize(Record):
    from_: ModelSizeRecord = Field(alias="from", description="the model before")
    to: ModelSizeRecord = Field(description="the model after")


class Calibration(Record):
    """How the sweep sized its load; with calibration off, only the factors."""

    measurements: list[Measurement] | None = absent("every calibration, the one after a resize last")
    calibrated: bool | None = absent("a replica was measured")
    capacity: CapacityRecord | None = absent("the last measurement's capacity")
    model: ModelSizeRecord | None = absent("the model measured last")
    configured_load: str | None = absent("the configured rates, in words")
    configured_utilisation: float | None = absent("the configured plan's estimated work over capacity")
    load_fraction: float | None = absent("sweep.load_fraction")
    replicas_worth: float | None = absent("the CPU budget in replicas of the one measured")
    factor: float | None = absent("the rate factor calibration chose (1.0 uncalibrated)")
    clamped: bool | None = absent("the per-class floor held the factor up")
    sizing: Sizing | None = absent("the last sizing")
    resized: list[Resize] | None = absent("each model resize")
    over_fraction: float | None = absent("the estimated load, when it stays above the fraction asked for")
    under_min_arrivals: dict[str, int] | None = absent("uncalibrated: classes below sweep.min_arrivals")
    rate_scale: float | None = absent("--rate-scale")
    applied_factor: float | None = absent("factor × rate_scale: what every rate was multiplied by")
    window_s: float | None = absent("the traffic window")
    engine: str | None = absent(
        "with several serving engines (sweep.calibrate_per_engine), the engine this calibration measured"
    )
    engines: dict[str, Calibration] | None = absent(
        "with several serving engines, each other engine's own calibration, on its own first replica"
    )


class SweepReport(Record):
    """`forge sweep`: every profile on the same image and the same seeded traffic, and what they show."""

    started_at: str = Field(description="ISO 8601, UTC")
    load: str = Field(description="the offered load in words")
    cpu_budget: int = Field(description="CPUs summed over each profile's replicas (the same for every profile)")
    calibration: Calibration = Field(description="how the load was sized")
    replica_cache: str = Field(description="what the replicas shared between starts, in words")
    profiles: dict[str, ProfileRun] = Field(description="each profile's first run: the table's and the plots' rows")
    failed_profiles: dict[str, str] = Field(description="profiles that could not run, and why")
    repeat: int = Field(description="--repeat")
    seeds: list[int] = Field(description="each repetition's traffic seed")
    repetitions: list[Repetition] = Field(description="every repetition's runs")
    dtype: DtypeRecord | None = absent("the dtype the replicas served, from the first profile run")
    model: ModelSizeRecord | None = absent("the model's size as served")
    goal: Goal | None = Field(
        default=None, description="work-conserving against shared; null when either did not run or before the end"
    )
    validity: Validity | None = absent("whether the sweep compares anything")
    aggregate: dict[str, ProfileSpread] | None = absent("per profile, medians and spreads over valid repetitions")
    claims: list[Claim] | None = absent("each claim's verdict (builders/sweep/claims.py)")
    result: Literal["interrupted", "failed"] | None = absent("absent when the sweep got to its end")
    signal: str | None = absent("what interrupted it: SIGINT, SIGTERM or SIGHUP")
    ended_in: str | None = absent("the profile running (or the verdict step) when it stopped")
    ended_in_phase: str | None = absent("that profile's smoke phase when it stopped")
