"""The six request classes the router tells apart, each mapped to a pool in the config."""

from __future__ import annotations

from enum import StrEnum


class RequestClass(StrEnum):
    """Kinds of traffic whose latency needs differ enough to deserve their own pool."""

    INTERACTIVE = "interactive"
    RAG = "rag"
    LONG_PREFILL = "long_prefill"
    AGENT = "agent"
    BATCH = "batch"
    SLOW_STREAM = "slow_stream"


ALL_CLASSES: tuple[RequestClass, ...] = tuple(RequestClass)
