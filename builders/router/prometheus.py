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


class BoundValue:
    """One labelled series of a counter or gauge, resolved once: updating it costs one dict store.

    The router updates some series for every request and every streamed event; validating a label
    dict each time cost more than the update itself.
    """

    __slots__ = ("_key", "_values")

    def __init__(self, values: dict[Labels, float], key: Labels) -> None:
        values.setdefault(key, 0.0)
        self._values = values
        self._key = key

    def inc(self, amount: float = 1.0) -> None:
        self._values[self._key] += amount

    def dec(self, amount: float = 1.0) -> None:
        self._values[self._key] -= amount

    def value(self) -> float:
        return self._values[self._key]


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

    def bind(self, labels: Mapping[str, str] | None = None) -> BoundValue:
        """The series for these labels, created at zero, for hot paths that update it often."""
        return BoundValue(self._values, self._key(labels))

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

    def reset(self) -> None:
        """Every series back to 0, kept: one not set again after this reads 0 rather than vanishing."""
        for key in self._values:
            self._values[key] = 0.0

    def value(self, labels: Mapping[str, str] | None = None) -> float:
        return self._values.get(self._key(labels), 0.0)

    def bind(self, labels: Mapping[str, str] | None = None) -> BoundValue:
        return BoundValue(self._values, self._key(labels))

    def samples(self) -> list[str]:
        return [f"{self.name}{_labels(k)} {_number(v)}" for k, v in sorted(self._values.items())]


class HistogramSeries:
    """One labelled series of a histogram: per-bucket counts (not cumulative) and the sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.bounds = buckets
        """Upper bounds of the buckets but the last (+Inf): counts[bisect_left(bounds, value)] is value's."""
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def observe_repeated(self, value: float, times: int) -> None:
        """The same value observed `times` times (events that arrived together share a gap of 0)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total += value * times


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help_text: str, label_names: Sequence[str], buckets: Sequence[float]) -> None:
        super().__init__(name, help_text, label_names)
        self.buckets = tuple(sorted(buckets))
        self._series: dict[Labels, HistogramSeries] = {}

    def bind(self, labels: Mapping[str, str] | None = None) -> HistogramSeries:
        """The series for these labels, created empty, for hot paths that observe often."""
        key = self._key(labels)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = HistogramSeries(self.buckets)
        return series

    def observe(self, labels: Mapping[str, str] | None, value: float) -> None:
        self.bind(labels).observe(value)

    def ensure(self, labels: Mapping[str, str] | None = None) -> None:
        self.bind(labels)

    def count(self, labels: Mapping[str, str] | None = None) -> int:
        series = self._series.get(self._key(labels))
        return 0 if series is None else sum(series.counts)

    def samples(self) -> list[str]:
        lines = []
        for key in sorted(self._series):
            series = self._series[key]
            running = 0
            for bound, n in zip((*self.buckets, math.inf), series.counts, strict=True):
                running += n
                lines.append(f"{self.name}_bucket{_labels(key, ('le', _number(bound)))} {running}")
            lines.append(f"{self.name}_sum{_labels(key)} {_number(series.total)}")
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
