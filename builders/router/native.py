"""Which relay moves a stream's events: the C one (builders/router/_fastrelay.c) where it was built, else Python's.

The C relay is an optional extension: `pip install` builds it where a C compiler and Python's headers are
present, and the router image builds it in its venv stage. Both relays produce the same bytes, metrics and
flow control (tests/router/test_router_native_relay.py runs one against the other); the C one costs less
CPU per streamed event. FORGE_ROUTER_NATIVE=0 turns it off, to compare the two or to rule it out.
"""

from __future__ import annotations

import os

try:
    from builders.router._fastrelay import Relay as NativeRelay
except ImportError:  # built without a C compiler: the Python relay does the same work
    NativeRelay = None  # type: ignore[assignment,misc]

__all__ = ["ENV_SWITCH", "NativeRelay", "native_relay", "relay_name"]

ENV_SWITCH = "FORGE_ROUTER_NATIVE"


def native_relay() -> type[NativeRelay] | None:
    """The C relay's type if it is built and not switched off with FORGE_ROUTER_NATIVE=0."""
    if NativeRelay is None or os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    return NativeRelay


def relay_name() -> str:
    """'native' or 'python', for the router's start-up line and the benchmark's header."""
    return "native" if native_relay() is not None else "python"
