"""Latency metrics of a traffic run, defined once here (docs/metrics.md explains them).

- TTFT: time of the first chunk carrying content minus the time the request was sent. For a
  non-streamed request the whole body is its first chunk, so TTFT = E2E.
- ITL: gaps between consecutive content chunks of a streamed request; a class's ITL percentiles pool
  the gaps of all its successful requests.
- TPOT (per request): (E2E - TTFT) / (content chunks - 1); undefined below two chunks.
- E2E: end of the response minus the time the request was sent.
- Goodput: the fraction of a class's sent requests that succeeded and met every SLO of their class
  (TTFT <= ttft_p99_ms, TPOT <= itl_p99_ms where the request streamed at least two chunks).

Percentiles interpolate linearly between closest ranks (numpy's default method).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from builders.router.classes import RequestClass
from builders.traffic.plan import ClassSLO


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation; None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(kw_only=True)
class RequestRecord:
    """One request as the client saw it; times are seconds, relative to when it was sent."""

    request_class: RequestClass
    index: int
    turn: int = 0
    endpoint: str
    stream: bool
    sent_class_header: bool
    prompt_chars: int
    max_tokens: int
    sent_at_s: float = 0.0
    """When it was sent, relative to the start of the run."""
    status: int | None = None
    error: str | None = None
    e2e_s: float | None = None
    content_times_s: list[float] = field(default_factory=list)
    """Arrival of each content-carrying chunk, relative to sending."""
    output_text: str = ""
    routed_class: str | None = None
    pool: str | None = None
    replica: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.e2e_s is not None

    @property
    def ttft_s(self) -> float | None:
        if not self.ok:
            return None
        if not self.stream:
            return self.e2e_s
        return self.content_times_s[0] if self.content_times_s else None

    @property
    def itl_gaps_s(self) -> list[float]:
        if not self.ok or not self.stream:
            return []
        times = self.content_times_s
        return [later - earlier for earlier, later in itertools.pairwise(times)]

    @property
    def output_chunks(self) -> int:
        return len(self.content_times_s) if self.stream else (1 if self.ok else 0)

    @property
    def tpot_s(self) -> float | None:
        ttft = self.ttft_s
        if ttft is None or self.e2e_s is None or not self.stream or len(self.content_times_s) < 2:
            return None
        return (self.e2e_s - ttft) / (len(self.content_times_s) - 1)

    def meets(self, slo: ClassSLO) -> bool:
        """Whether this request counts toward goodput under its class's SLO."""
        if not self.ok:
            return False
        ttft = self.ttft_s
        if slo.ttft_p99_ms is not None and (ttft is None or ttft * 1000 > slo.ttft_p99_ms):
            return False
        tpot = self.tpot_s
        return slo.itl_p99_ms is None or tpot is None or tpot * 1000 <= slo.itl_p99_ms


@dataclass(frozen=True)
class Percentiles:
    p50: float | None
    p99: float | None

    @classmethod
    def of_seconds(cls, values: Sequence[float]) -> Percentiles:
        ms = [v * 1000 for v in values]
        return cls(percentile(ms, 50), percentile(ms, 99))

    def as_json(self) -> dict[str, float | None]:
        return {"p50": _round(self.p50), "p99": _round(self.p99)}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass(frozen=True, kw_only=True)
class ClassSummary:
    request_class: RequestClass
    requests: int
    errors: int
    ttft_ms: Percentiles
    itl_ms: Percentiles
    e2e_ms: Percentiles
    tpot_ms: Percentiles
    goodput: float
    gate_passed: bool
    gate_failures: tuple[str, ...]
    routed_as: dict[str, int]
    served_by: dict[str, int]
    """Requests per pool that answered (x-forge-pool): where work-conserving routing put a class's work."""
    error_samples: tuple[str, ...]

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def as_json(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "error_rate": round(self.error_rate, 4),
            "ttft_ms": self.ttft_ms.as_json(),
            "itl_ms": self.itl_ms.as_json(),
            "e2e_ms": self.e2e_ms.as_json(),
            "tpot_ms": self.tpot_ms.as_json(),
            "goodput": round(self.goodput, 4),
            "gate_passed": self.gate_passed,
            "gate_failures": list(self.gate_failures),
            "routed_as": dict(self.routed_as),
            "served_by": dict(self.served_by),
            "error_samples": list(self.error_samples),
        }


def summarize(request_class: RequestClass, records: Sequence[RequestRecord], slo: ClassSLO) -> ClassSummary:
    """Per-class percentiles, goodput and the gate verdict against the class's SLO."""
    ok = [r for r in records if r.ok]
    ttft = Percentiles.of_seconds([t for r in ok if (t := r.ttft_s) is not None])
    itl = Percentiles.of_seconds([gap for r in ok for gap in r.itl_gaps_s])
    e2e = Percentiles.of_seconds([r.e2e_s for r in ok if r.e2e_s is not None])
    tpot = Percentiles.of_seconds([t for r in ok if (t := r.tpot_s) is not None])
    errors = len(records) - len(ok)
    goodput = sum(r.meets(slo) for r in records) / len(records) if records else 0.0

    failures: list[str] = []
    if not records:
        failures.append("no request was sent (budget or deadline ran out first)")
    else:
        rate = errors / len(records)
        if rate > slo.max_error_rate:
            failures.append(f"error rate {rate:.3f} > {slo.max_error_rate}")
        if slo.ttft_p99_ms is not None:
            if ttft.p99 is None:
                failures.append("no successful request to measure TTFT on")
            elif ttft.p99 > slo.ttft_p99_ms:
                failures.append(f"TTFT p99 {ttft.p99:.1f} ms > {slo.ttft_p99_ms} ms")
        # A class without streamed gaps (non-streamed, or one chunk each) has no ITL to bound.
        if slo.itl_p99_ms is not None and itl.p99 is not None and itl.p99 > slo.itl_p99_ms:
            failures.append(f"ITL p99 {itl.p99:.1f} ms > {slo.itl_p99_ms} ms")
        if goodput < slo.min_goodput:
            failures.append(f"goodput {goodput:.3f} < {slo.min_goodput}")
    routed = Counter(r.routed_class or "unknown" for r in records)
    pools = Counter(r.pool or "unknown" for r in records)
    samples = tuple(dict.fromkeys(r.error for r in records if r.error))[:3]
    return ClassSummary(
        request_class=request_class,
        requests=len(records),
        errors=errors,
        ttft_ms=ttft,
        itl_ms=itl,
        e2e_ms=e2e,
        tpot_ms=tpot,
        goodput=goodput,
        gate_passed=not failures,
        gate_failures=tuple(failures),
        routed_as=dict(sorted(routed.items())),
        served_by=dict(sorted(pools.items())),
        error_samples=samples,
    )
