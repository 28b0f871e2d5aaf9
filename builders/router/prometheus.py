"""A minimal Prometheus text-format registry (counters, gauges, histograms with labels).

Written by hand so the router needs no extra dependency; it follows exposition format 0.0.4.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

Labels = tuple[tuple[str, str], ...]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels, extra: tuple[str, str] | None = None) -> str:
    items = [*labels, extra] if extra else list(labels)
    if not items:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in items) + "}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, label_names: Sequence[str]) -> None:
        self.name = name
        self.help = help_text
        self.label_names = tuple(label_names)

    def _key(self, labels: Mapping[str, str] | None) -> Labels:
        labels = labels or {}
        if set(labels) != set(self.label_names):
            raise ValueError(f"{self.name} takes labels {self.label_names}, got {sorted(labels)}")
        return tuple((name, labels[name]) for name in self.label_names)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]

    def samples(self) -> list[str]:
        raise NotImplementedError


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, help_text: str, label_names: Sequence[str]) -> None:
        super().__init__(name, help_text, label_names)
        self._values: dict[Labels, float] = {}

    def inc(self, labels: Mapping[str, str] | None = None, amount: float = 1.0) -> None:
        key = self._key(labels)
        self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, labels: Mapping[str, str] | None = None) -> float:
        return self._values.get(self._key(labels), 0.0)

    def ensure(self, labels: Mapping[str, str] | None = None) -> None:
        """Create the series at zero so dashboards see it before the first event."""
        self._values.setdefault(self._key(labels), 0.0)

    def samples(self) -> list[str]:
        return [f"{self.name}{_labels(k)} {_number(v)}" for k, v in sorted(self._values.items())]


class Gauge(_Metric):
    kind = "gauge"

    def __init__(self, name: str, help_text: str, label_names: Sequence[str]) -> None:
        super().__init__(name, help_text, label_names)
        self._values: dict[Labels, float] = {}

    def set(self, labels: Mapping[str, str] | None, value: float) -> None:
        self._values[self._key(labels)] = value

    def inc(self, labels: Mapping[str, str] | None = None, amount: float = 1.0) -> None:
        key = self._key(labels)
        self._values[key] = self._values.get(key, 0.0) + amount

    def dec(self, labels: Mapping[str, str] | None = None, amount: float = 1.0) -> None:
        self.inc(labels, -amount)

    def ensure(self, labels: Mapping[str, str] | None = None) -> None:
        self._values.setdefault(self._key(labels), 0.0)

    def value(self, labels: Mapping[str, str] | None = None) -> float:
        return self._values.get(self._key(labels), 0.0)

    def samples(self) -> list[str]:
        return [f"{self.name}{_labels(k)} {_number(v)}" for k, v in sorted(self._values.items())]


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help_text: str, label_names: Sequence[str], buckets: Sequence[float]) -> None:
        super().__init__(name, help_text, label_names)
        self.buckets = tuple(sorted(buckets))
        self._counts: dict[Labels, list[int]] = {}
        self._sums: dict[Labels, float] = {}

    def observe(self, labels: Mapping[str, str] | None, value: float) -> None:
        key = self._key(labels)
        counts = self._counts.setdefault(key, [0] * (len(self.buckets) + 1))
        counts[bisect.bisect_left(self.buckets, value)] += 1
        self._sums[key] = self._sums.get(key, 0.0) + value

    def ensure(self, labels: Mapping[str, str] | None = None) -> None:
        key = self._key(labels)
        self._counts.setdefault(key, [0] * (len(self.buckets) + 1))
        self._sums.setdefault(key, 0.0)

    def count(self, labels: Mapping[str, str] | None = None) -> int:
        return sum(self._counts.get(self._key(labels), []))

    def samples(self) -> list[str]:
        lines = []
        for key in sorted(self._counts):
            running = 0
            for bound, n in zip((*self.buckets, math.inf), self._counts[key], strict=True):
                running += n
                lines.append(f"{self.name}_bucket{_labels(key, ('le', _number(bound)))} {running}")
            lines.append(f"{self.name}_sum{_labels(key)} {_number(self._sums[key])}")
            lines.append(f"{self.name}_count{_labels(key)} {running}")
        return lines


class Registry:
    def __init__(self) -> None:
        self._metrics: list[_Metric] = []

    def counter(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Counter:
        metric = Counter(name, help_text, labels)
        self._metrics.append(metric)
        return metric

    def gauge(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Gauge:
        metric = Gauge(name, help_text, labels)
        self._metrics.append(metric)
        return metric

    def histogram(self, name: str, help_text: str, labels: Sequence[str], buckets: Sequence[float]) -> Histogram:
        metric = Histogram(name, help_text, labels, buckets)
        self._metrics.append(metric)
        return metric

    def render(self) -> str:
        lines: list[str] = []
        for metric in self._metrics:
            lines.extend(metric.header())
            lines.extend(metric.samples())
        return "\n".join(lines) + "\n"
