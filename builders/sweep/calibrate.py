"""Calibration: what one replica of the sweep's model sustains on this host, and the offered load scaled to it.

A sweep's fixed arrival rates ask a different question on every machine: on a slow one every profile is
overloaded and the table ranks failures. So the sweep measures one warm replica first (prefill tokens/s on
a long prompt, decode tokens/s at the profiles' batch sizes), estimates what the traffic plan asks of the
profile's replicas per second, and scales every open-loop rate by one factor so that the estimate comes to
`load_fraction` of their capacity. The factor is the same for every profile and is recorded in the report.
"""

from __future__ import annotations

import math
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import requests

from builders.errors import SmokeFailed
from builders.router.classes import ALL_CLASSES, RequestClass
from builders.smoke.plan import ReplicaPlan
from builders.traffic.plan import TrafficPlan

DECODE_TOKENS = 32
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

    def as_json(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "cpus": self.cpus,
            "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 1),
            "decode_tokens_per_s": {str(b): round(v, 1) for b, v in sorted(self.decode_tokens_per_s.items())},
            "decode_batch_used": self.decode_batch,
            "seconds": round(self.seconds, 1),
        }


def _words(plan: TrafficPlan, count: int, rng: random.Random) -> str:
    return " ".join(rng.choice(plan.vocabulary) for _ in range(count))


def _post(url: str, body: dict[str, Any], headers: dict[str, str], timeout_s: float) -> dict[str, Any]:
    try:
        response = requests.post(url, json=body, headers=headers, timeout=timeout_s)
    except requests.RequestException as exc:
        raise SmokeFailed(f"calibration request to {url} failed: {exc}") from exc
    if response.status_code != 200:
        raise SmokeFailed(f"calibration request to {url}: HTTP {response.status_code} {response.text[:300]}")
    data: dict[str, Any] = response.json()
    return data


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
        body = {"model": traffic.model, "prompt": _words(traffic, words, rng), "max_tokens": 1, "ignore_eos": True}
        t0 = time.monotonic()
        answer = _post(url, body, headers, timeout_s)
        elapsed = time.monotonic() - t0
        rates.append(int(answer.get("usage", {}).get("prompt_tokens", words)) / max(elapsed, 1e-6))
    decode: dict[int, float] = {}
    for batch in sorted(set(batch_sizes)):
        bodies = [
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
        tokens = sum(int(a.get("usage", {}).get("completion_tokens", DECODE_TOKENS)) for a in answers)
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


def offered_work(plan: TrafficPlan, capacity: Capacity) -> float:
    """Replica-seconds of work the plan's open-loop arrivals ask for per second: each request's prompt at the
    measured prefill rate plus its output at the measured decode rate (prompts at the plan's generous
    upper estimate; shared prefixes counted as if uncached, so the estimate errs towards less load)."""
    decode = capacity.decode_tokens_per_s[capacity.decode_batch]
    work = 0.0
    for request_class in ALL_CLASSES:
        class_plan = plan.for_class(request_class)
        if class_plan.count == 0 or class_plan.rate_per_s is None:
            continue
        per_request = plan.prompt_tokens_at_most(request_class) / capacity.prefill_tokens_per_s
        per_request += class_plan.max_tokens / decode
        work += class_plan.rate_per_s * requests_per_arrival(plan, request_class) * per_request
    return work


def scale_traffic(plan: TrafficPlan, factor: float) -> TrafficPlan:
    """Every open-loop rate times `factor`; when it raises them, the counts and the total cap grow with it so
    that arrivals still last the whole deadline."""
    update: dict[str, Any] = {}
    grow = max(factor, 1.0)
    for request_class in ALL_CLASSES:
        class_plan = plan.for_class(request_class)
        if class_plan.rate_per_s is None:
            continue
        update[request_class.value] = class_plan.model_copy(
            update={"rate_per_s": class_plan.rate_per_s * factor, "count": math.ceil(class_plan.count * grow)}
        )
    update["max_total_requests"] = math.ceil(plan.max_total_requests * grow)
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
