"""Calibration: what one replica of the sweep's model sustains on this host, and the load sized to it.

A sweep's fixed arrival rates ask a different question on every machine: on a slow one every profile is
overloaded and the table ranks failures. So the sweep measures one warm replica first (prefill tokens/s on
a long prompt, decode tokens/s at the profiles' batch sizes), estimates what the traffic plan asks of the
profile's replicas per second, and sizes the load to `load_fraction` of their capacity, the same for every
profile and recorded in the report.

How the load is sized (`size_load`): the rates may be thinned only as far as every open-loop class still
sends `min_arrivals` requests within the window (the window may grow up to `max_window_s` for that). A class
thinned to zero or two requests removes exactly the interference a class-aware split is there to remove, and
its gate then judges nothing. What thinning may not remove is taken from the work per request: the model
shrinks (fewer layers, then a narrower hidden size). Prompt and answer lengths stay as configured because
the router classifies by them (long_prefill_tokens, batch_max_tokens): shorter ones would land in another
class. The SLOs are fixed milliseconds, so a smaller model on a slow host asks what the configured model asks
of a fast one. The model's size is fixed when its replicas start, so a resize starts the profile again
(once); the measurement after it is the one the rates are sized by.
"""

from __future__ import annotations

import math
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypedDict

import requests

from builders.errors import SmokeFailed
from builders.router.classes import ALL_CLASSES, RequestClass
from builders.smoke.plan import ReplicaPlan
from builders.sweep.report_model import CapacityRecord, ModelSizeRecord, Sizing
from builders.traffic.plan import TrafficPlan
from builders.traffic.runner import arrival_times

DECODE_TOKENS = 32
ARRIVAL_MARGIN_S = 1.0
PREFILL_RUNS = 2


@dataclass(frozen=True, kw_only=True)
class Capacity:
    """One replica's measured throughput."""

    replica: str
    cpus: str | None
    prefill_tokens_per_s: float
    decode_tokens_per_s: dict[int, float]
    """Output tokens/s summed over `batch` concurrent streams, by batch size."""
    seconds: float

    @property
    def decode_batch(self) -> int:
        """The batch size whose decode rate the load estimate uses: the largest measured."""
        return max(self.decode_tokens_per_s)

    def as_json(self) -> CapacityRecord:
        return CapacityRecord(
            replica=self.replica,
            cpus=self.cpus,
            prefill_tokens_per_s=round(self.prefill_tokens_per_s, 1),
            decode_tokens_per_s={str(b): round(v, 1) for b, v in sorted(self.decode_tokens_per_s.items())},
            decode_batch_used=self.decode_batch,
            seconds=round(self.seconds, 1),
        )


class Completion(TypedDict):
    """The OpenAI completions request calibration sends."""

    model: str
    prompt: str
    max_tokens: int
    ignore_eos: bool


class Usage(TypedDict, total=False):
    """What calibration reads of an answer: the token counts the server says it processed."""

    prompt_tokens: int
    completion_tokens: int


def _words(plan: TrafficPlan, count: int, rng: random.Random) -> str:
    return " ".join(rng.choice(plan.vocabulary) for _ in range(count))


def _post(url: str, body: Completion, headers: dict[str, str], timeout_s: float) -> Usage:
    """The answer's usage; a count the answer does not give is left out (the count asked for stands in)."""
    try:
        response = requests.post(url, json=body, headers=headers, timeout=timeout_s)
    except requests.RequestException as exc:
        raise SmokeFailed(f"calibration request to {url} failed: {exc}") from exc
    if response.status_code != 200:
        raise SmokeFailed(f"calibration request to {url}: HTTP {response.status_code} {response.text[:300]}")
    try:
        answer = response.json()
    except ValueError:
        raise SmokeFailed(f"calibration request to {url}: the answer is not JSON: {response.text[:300]}") from None
    given = answer.get("usage") if isinstance(answer, dict) else None
    usage: Usage = {}
    if isinstance(given, dict):
        if isinstance(prompt := given.get("prompt_tokens"), int):
            usage["prompt_tokens"] = prompt
        if isinstance(completion := given.get("completion_tokens"), int):
            usage["completion_tokens"] = completion
    return usage


def measure(
    replica: ReplicaPlan,
    *,
    api_key: str,
    traffic: TrafficPlan,
    prompt_tokens: int,
    batch_sizes: tuple[int, ...],
    timeout_s: float = 300.0,
) -> Capacity:
    """Prefill tokens/s on prompts of about `prompt_tokens` (distinct first words, so no prefix-cache hit),
    and decode tokens/s with each of `batch_sizes` streams in flight at once, on one warm replica."""
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {api_key}"}
    url = f"{replica.url}/v1/completions"
    rng = random.Random(traffic.seed + 7919)
    words = traffic.words_for_tokens(prompt_tokens)
    rates = []
    for _ in range(PREFILL_RUNS):
        body: Completion = {
            "model": traffic.model,
            "prompt": _words(traffic, words, rng),
            "max_tokens": 1,
            "ignore_eos": True,
        }
        t0 = time.monotonic()
        usage = _post(url, body, headers, timeout_s)
        elapsed = time.monotonic() - t0
        rates.append(usage.get("prompt_tokens", words) / max(elapsed, 1e-6))
    decode: dict[int, float] = {}
    for batch in sorted(set(batch_sizes)):
        bodies: list[Completion] = [
            {
                "model": traffic.model,
                "prompt": _words(traffic, 16, rng),
                "max_tokens": DECODE_TOKENS,
                "ignore_eos": True,
            }
            for _ in range(batch)
        ]
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=batch) as pool:
            answers = list(pool.map(lambda b: _post(url, b, headers, timeout_s), bodies))
        elapsed = time.monotonic() - t0
        tokens = sum(a.get("completion_tokens", DECODE_TOKENS) for a in answers)
        decode[batch] = tokens / max(elapsed, 1e-6)
    return Capacity(
        replica=replica.label,
        cpus=replica.cpuset,
        prefill_tokens_per_s=sum(rates) / len(rates),
        decode_tokens_per_s=decode,
        seconds=time.monotonic() - started,
    )


def requests_per_arrival(plan: TrafficPlan, request_class: RequestClass) -> int:
    """Requests one arrival makes: an agent conversation is `turns` requests."""
    return plan.agent.turns if request_class is RequestClass.AGENT else 1


@dataclass(frozen=True, kw_only=True)
class Work:
    """Replica-seconds per second the plan's open-loop arrivals ask for, split by phase: prefill shrinks
    with the model; decode on a CPU is dominated by each step's fixed cost (batch 16 here decoded 5.6x what
    batch 1 did, for 16x the tokens), so a smaller model is not counted on to shorten it."""

    prefill: float
    decode: float

    @property
    def total(self) -> float:
        return self.prefill + self.decode


def work_of(plan: TrafficPlan, capacity: Capacity) -> Work:
    """Each request's prompt at the measured prefill rate plus its output at the measured decode rate, times
    its class's rate (prompts at the plan's generous upper estimate; shared prefixes counted as if uncached,
    so the estimate errs towards less load)."""
    decode_rate = capacity.decode_tokens_per_s[capacity.decode_batch]
    prefill = decode = 0.0
    for request_class in ALL_CLASSES:
        class_plan = plan.for_class(request_class)
        if class_plan.count == 0 or class_plan.rate_per_s is None:
            continue
        per_s = class_plan.rate_per_s * requests_per_arrival(plan, request_class)
        prefill += per_s * plan.prompt_tokens_at_most(request_class) / capacity.prefill_tokens_per_s
        decode += per_s * class_plan.max_tokens / decode_rate
    return Work(prefill=prefill, decode=decode)


def offered_work(plan: TrafficPlan, capacity: Capacity) -> float:
    """Replica-seconds of work the plan's open-loop arrivals ask for per second (`work_of`, both phases)."""
    return work_of(plan, capacity).total


@dataclass(frozen=True, kw_only=True)
class ModelSize:
    """The generated Llama's size, the one knob of the work per token that leaves prompts and answers alone."""

    hidden_size: int
    num_hidden_layers: int

    @property
    def cost(self) -> int:
        """Per-token cost of the linear layers (attention projections and MLP), up to a constant."""
        return self.num_hidden_layers * self.hidden_size**2

    def as_json(self) -> ModelSizeRecord:
        return ModelSizeRecord(hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers)


# Below this width the random Llama stops costing what a transformer costs (the tokenizer's 1,024-row
# embedding and the attention over long prompts dominate); 128 keeps whole pairs of 64-wide heads.
SMALLEST_HIDDEN = 256
HIDDEN_STEP = 128


def smaller_model(current: ModelSize, ratio: float) -> ModelSize:
    """The size whose per-token cost comes closest under `ratio` of `current`'s (the wider on a tie), no
    larger than it in either dimension; the smallest when none fits."""
    if ratio >= 1:
        return current
    widths = range(min(SMALLEST_HIDDEN, current.hidden_size), current.hidden_size + 1, HIDDEN_STEP)
    candidates = [
        ModelSize(hidden_size=h, num_hidden_layers=n) for h in widths for n in range(1, current.num_hidden_layers + 1)
    ]
    fitting = [c for c in candidates if c.cost <= ratio * current.cost]
    if not fitting:
        return min(candidates, key=lambda c: c.cost)
    return max(fitting, key=lambda c: (c.cost, c.hidden_size))


def open_loop_classes(plan: TrafficPlan) -> list[RequestClass]:
    return [c for c in ALL_CLASSES if plan.for_class(c).count and plan.for_class(c).rate_per_s is not None]


def arrivals_within(plan: TrafficPlan, request_class: RequestClass, window_s: float) -> int:
    """How many of the class's seeded arrivals (requests; agent: conversations) fall inside the window."""
    class_plan = plan.for_class(request_class)
    if class_plan.rate_per_s is None:
        return class_plan.count
    times = arrival_times(plan.seed, request_class, class_plan.rate_per_s, class_plan.count)
    return sum(1 for t in times if t < window_s)


def _nth_arrival_at_unit_rate(plan: TrafficPlan, request_class: RequestClass, n: int) -> float:
    # An exponential draw at rate r is the same draw at rate 1 divided by r (same seed, same stream), so the
    # n-th arrival at any rate is this over the rate: the floors below are exact for the seeded plan.
    return arrival_times(plan.seed, request_class, 1.0, n)[-1]


@dataclass(frozen=True, kw_only=True)
class LoadSize:
    """How one sweep's load is sized to the measured capacity (see the module's docstring)."""

    configured_utilisation: float
    """The configured plan's estimated work over the profile's replicas' capacity."""
    wanted_factor: float
    """The rate factor that alone would land the estimate on the fraction (within min/max_scale)."""
    floor_factor: float
    """The smallest rate factor that still gives every open-loop class `min_arrivals` within max_window_s."""
    rate_factor: float
    window_s: float
    model_ratio: float
    """What the per-token prefill cost must be cut to (1: the model stays as it is)."""
    expected_utilisation: float
    """The estimate at rate_factor, with the model cut to model_ratio."""
    min_arrivals: int
    arrivals: dict[str, int]
    """Each open-loop class's seeded arrivals within window_s at rate_factor."""

    def as_json(self) -> Sizing:
        return Sizing(
            configured_utilisation=round(self.configured_utilisation, 3),
            wanted_factor=round(self.wanted_factor, 4),
            floor_factor=round(self.floor_factor, 4),
            rate_factor=round(self.rate_factor, 4),
            window_s=round(self.window_s, 1),
            model_ratio=round(self.model_ratio, 4),
            expected_utilisation=round(self.expected_utilisation, 3),
            min_arrivals=self.min_arrivals,
            arrivals=dict(self.arrivals),
        )


def size_load(
    plan: TrafficPlan,
    capacity: Capacity,
    *,
    replicas_worth: float,
    load_fraction: float,
    min_arrivals: int,
    max_window_s: float,
    min_scale: float,
    max_scale: float,
) -> LoadSize:
    """The rate factor, window and model cut that put the plan's estimated work at `load_fraction` of
    `replicas_worth` replicas, thinning no open-loop class below `min_arrivals` (or its own count)."""
    work = work_of(plan, capacity)
    capacity_s = load_fraction * replicas_worth
    utilisation = work.total / replicas_worth if replicas_worth else float("inf")
    wanted = load_fraction / utilisation if utilisation else max_scale
    wanted = min(max(wanted, min_scale), max_scale)
    longest = max(plan.deadline_s, max_window_s)
    needed = {c: min(min_arrivals, plan.for_class(c).count) for c in open_loop_classes(plan)}
    nth = {c: _nth_arrival_at_unit_rate(plan, c, n) for c, n in needed.items() if n}

    def rate(c: RequestClass) -> float:
        r = plan.for_class(c).rate_per_s
        assert r is not None
        return r

    floor = max((t / (rate(c) * longest) for c, t in nth.items()), default=0.0)
    factor = max(wanted, floor)
    # A second past the last needed arrival: the runner sends nothing at or after the deadline.
    window = max([plan.deadline_s, *(t / (rate(c) * factor) + ARRIVAL_MARGIN_S for c, t in nth.items())])
    model_ratio = 1.0
    if work.prefill and work.total * factor > capacity_s * (1 + 1e-9):
        model_ratio = min(1.0, max(0.0, (capacity_s - work.decode * factor) / (work.prefill * factor)))
    expected = (work.prefill * model_ratio + work.decode) * factor / replicas_worth if replicas_worth else 0.0
    scaled = scale_traffic(plan, factor, window_s=window)
    return LoadSize(
        configured_utilisation=utilisation,
        wanted_factor=wanted,
        floor_factor=floor,
        rate_factor=factor,
        window_s=window,
        model_ratio=model_ratio,
        expected_utilisation=expected,
        min_arrivals=min_arrivals,
        arrivals={c.value: arrivals_within(scaled, c, window) for c in open_loop_classes(plan)},
    )


def scale_traffic(plan: TrafficPlan, factor: float, *, window_s: float | None = None) -> TrafficPlan:
    """Every open-loop rate times `factor`, arrivals for `window_s` (default: the plan's deadline). When the
    factor raises the rates, the counts and the total cap grow with it so that arrivals still last the whole
    deadline; a longer window leaves them: a class's count is its own cap (calibration thins rates so that a
    longer window brings no more arrivals than the configured rate and deadline would)."""
    window = window_s if window_s is not None else plan.deadline_s
    update: dict[str, object] = {}
    grow = max(factor, 1.0)
    for request_class in ALL_CLASSES:
        class_plan = plan.for_class(request_class)
        if class_plan.rate_per_s is None:
            continue
        update[request_class.value] = class_plan.model_copy(
            update={"rate_per_s": class_plan.rate_per_s * factor, "count": math.ceil(class_plan.count * grow)}
        )
    update["max_total_requests"] = math.ceil(plan.max_total_requests * grow)
    update["deadline_s"] = window
    return plan.model_copy(update=update)


def describe_rates(plan: TrafficPlan) -> str:
    parts = []
    for request_class in ALL_CLASSES:
        class_plan = plan.for_class(request_class)
        if class_plan.count == 0:
            continue
        if class_plan.rate_per_s is not None:
            parts.append(f"{request_class.value} {class_plan.rate_per_s:.3g}/s")
        else:
            parts.append(f"{request_class.value} {class_plan.concurrency} in flight")
    return ", ".join(parts)
