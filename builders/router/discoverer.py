"""The discovery interface: what the router's membership loop (builders/router/discovery.py) asks of a source
of replicas. Each source is one module behind it (static and DNS in discovery.py, the Kubernetes API in
kubernetes_discovery.py), and a source module needs only this one, never the loop that drives it.
"""

from __future__ import annotations

from typing import Protocol


class DiscoveryFailed(Exception):
    """The source could not be asked (a DNS timeout): the pool is left as it was."""


class Discoverer(Protocol):
    """Where one pool's replicas are."""

    @property
    def interval_s(self) -> float | None:
        """Seconds between questions; None: the answer never changes."""
        ...

    async def urls(self) -> list[str]:
        """The pool's replica base URLs now; DiscoveryFailed when the source could not be asked."""
        ...

    async def close(self) -> None:
        """Let go of what asking needs (a watch, a connection); the router is stopping."""
        ...
