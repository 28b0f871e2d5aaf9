"""Class-aware router: an OpenAI-compatible front that sends six classes of traffic to their vLLM pools.

Run it with ``python -m builders.router --config FILE``; embed it with ``start_router(config)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from builders.router.call import HEADER_CLASS, HEADER_POOL, HEADER_REPLICA
from builders.router.classes import RequestClass
from builders.router.config import RouterConfig, SlowClientDetection, config_from_mapping, load_config

if TYPE_CHECKING:
    from builders.router.app import Router, RunningRouter, serve, start_router

# The server (aiohttp and the relay) is loaded when one of its names is first asked for: every CLI command imports
# this package for its classes and config, and the server's imports were a quarter of `forge --help`'s second.
_APP_NAMES = frozenset({"Router", "RunningRouter", "serve", "start_router"})


def __getattr__(name: str) -> Any:
    if name in _APP_NAMES:
        from builders.router import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
