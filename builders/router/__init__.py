"""Class-aware router: an OpenAI-compatible front that sends six classes of traffic to their vLLM pools.

Run it with ``python -m builders.router --config FILE``; embed it with ``start_router(config)``.
"""

from __future__ import annotations

from builders.router.app import Router, RunningRouter, serve, start_router
from builders.router.call import HEADER_CLASS, HEADER_POOL, HEADER_REPLICA
from builders.router.classes import RequestClass
from builders.router.config import RouterConfig, SlowClientDetection, config_from_mapping, load_config

__all__ = [
    "HEADER_CLASS",
    "HEADER_POOL",
    "HEADER_REPLICA",
    "RequestClass",
    "Router",
    "RouterConfig",
    "RunningRouter",
    "SlowClientDetection",
    "config_from_mapping",
    "load_config",
    "serve",
    "start_router",
]
