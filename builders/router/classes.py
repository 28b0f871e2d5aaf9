"""The request classes the router counts: six of generation, each mapped to a pool in the config, and one per kind
of request that generates nothing (embeddings, scores, tokens), which its `model` alone routes."""

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


class ServiceClass(StrEnum):
    """Requests that are not generation: they have no TTFT or ITL gate and no class policy; each kind is counted
    on its own so that an embedding burst is not read as interactive traffic."""

    EMBEDDINGS = "embeddings"
    SCORE = "score"
    RERANK = "rerank"
    TOKENIZE = "tokenize"
    """/tokenize and /detokenize."""
    TRANSCRIPTION = "transcription"


TrafficClass = RequestClass | ServiceClass

ALL_CLASSES: tuple[RequestClass, ...] = tuple(RequestClass)
SERVICE_CLASSES: tuple[ServiceClass, ...] = tuple(ServiceClass)
EVERY_CLASS: tuple[TrafficClass, ...] = (*ALL_CLASSES, *SERVICE_CLASSES)
