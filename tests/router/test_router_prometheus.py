"""The metrics registry: bound series (the router's hot path) and labelled updates land in the same series."""

from __future__ import annotations

import pytest

from builders.router.prometheus import Registry
from builders.router.router_metrics import RouterMetrics


def test_bound_and_labelled_updates_render_the_same_text() -> None:
    def registry(bound: bool) -> Registry:
        r = Registry()
        counter = r.counter("c_total", "help", ("class",))
        gauge = r.gauge("g", "help", ("class",))
        hist = r.histogram("h_seconds", "help", ("class",), (0.01, 0.1, 1.0))
        labels = {"class": "rag"}
        values = [0.0, 0.005, 0.05, 0.05, 0.5, 3.0]
        if bound:
            c, g, h = counter.bind(labels), gauge.bind(labels), hist.bind(labels)
            c.inc()
            c.inc(2)
            g.inc()
            g.inc()
            g.dec()
            h.observe_repeated(0.0, 1)
            for v in values[1:]:
                h.observe(v)
        else:
            counter.inc(labels)
            counter.inc(labels, 2)
            gauge.inc(labels)
            gauge.inc(labels)
            gauge.dec(labels)
            for v in values:
                hist.observe(labels, v)
        return r

    text = registry(bound=True).render()
    assert text == registry(bound=False).render()
    assert 'c_total{class="rag"} 3' in text
    assert 'g{class="rag"} 1' in text
    assert 'h_seconds_bucket{class="rag",le="0.01"} 2' in text
    assert 'h_seconds_bucket{class="rag",le="0.1"} 4' in text
    assert 'h_seconds_bucket{class="rag",le="+Inf"} 6' in text
    assert 'h_seconds_count{class="rag"} 6' in text
    assert 'h_seconds_sum{class="rag"} 3.605' in text


def test_observe_repeated_counts_each_time() -> None:
    hist = Registry().histogram("h", "help", ("class",), (0.001, 0.01))
    series = hist.bind({"class": "x"})
    series.observe_repeated(0.0, 5)
    series.observe(0.005)
    assert hist.count({"class": "x"}) == 6
    assert series.counts == [5, 1, 0]


def test_bind_checks_the_label_names() -> None:
    counter = Registry().counter("c_total", "help", ("class", "pool"))
    with pytest.raises(ValueError, match=r"c_total takes labels \('class', 'pool'\), got \['class'\]"):
        counter.bind({"class": "rag"})


def test_every_class_series_exists_at_zero_before_any_request() -> None:
    generation = ("interactive", "rag", "long_prefill", "agent", "batch", "slow_stream")
    services = ("embeddings", "score", "rerank", "tokenize", "transcription")
    pools = {c: "p" for c in generation} | {c: "q" for c in services}
    metrics = RouterMetrics(pools)
    text = metrics.render()
    for name, pool in pools.items():
        assert f'forge_router_requests_total{{class="{name}",pool="{pool}"}} 0' in text
        assert f'forge_router_ttft_seconds_count{{class="{name}"}} 0' in text
        assert f'forge_router_itl_seconds_count{{class="{name}"}} 0' in text
    metrics.requests_in("rag", "p").inc()
    # A request whose model chose another pool than its class's is counted under that pool.
    metrics.requests_in("rag", "other").inc()
    metrics.by_class["rag"].itl.observe_repeated(0.0, 3)
    assert metrics.requests.value({"class": "rag", "pool": "p"}) == 1
    assert metrics.requests.value({"class": "rag", "pool": "other"}) == 1
    assert metrics.requests_in("rag", "other") is metrics.requests_in("rag", "other")
    assert metrics.itl.count({"class": "rag"}) == 3
