"""Replica state and the choice of a replica inside a pool: least in-flight, with prefix affinity."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(kw_only=True)
class Replica:
    """One vLLM server; the router is optimistic about it until a check or a request says otherwise."""

    pool: str
    url: str
    healthy: bool = True
    in_flight: int = 0
    served: int = 0
    failures: int = 0
    last_error: str | None = None
    last_check: float | None = None
    models: tuple[str, ...] | None = None
    """The model names its GET /v1/models listed (builders/router/served_models.py); None until it answered."""
    models_asked: float = 0.0
    """When its models were last asked (time.monotonic)."""

    def mark_down(self, reason: str) -> None:
        self.healthy = False
        self.failures += 1
        self.last_error = reason

    def as_json(self) -> dict[str, object]:
        age = None if self.last_check is None else round(time.monotonic() - self.last_check, 3)
        return {
            "url": self.url,
            "healthy": self.healthy,
            "in_flight": self.in_flight,
            "served": self.served,
            "failures": self.failures,
            "last_error": self.last_error,
            "last_check_age_s": age,
            "models": None if self.models is None else list(self.models),
        }


@dataclass(kw_only=True)
class Pool:
    name: str
    replicas: list[Replica]
    max_extra_in_flight: int
    max_affinity_entries: int
    _affinity: OrderedDict[str, str] = field(default_factory=OrderedDict)

    def healthy(self, exclude: Iterable[str] = ()) -> list[Replica]:
        skip = set(exclude)
        return [r for r in self.replicas if r.healthy and r.url not in skip]

    def choose(self, prefix: str | None, exclude: Iterable[str] = ()) -> tuple[Replica | None, bool]:
        """The replica to try next and whether affinity chose it; None when no healthy replica is left.

        Affinity keeps a shared prefix on the replica whose KV cache already holds it, unless that
        replica is unhealthy or carries more than max_extra_in_flight requests above the least loaded.
        """
        candidates = self.healthy(exclude)
        if not candidates:
            return None, False
        # Ties go to the replica that has served least, so an idle pool still spreads its load.
        least = min(candidates, key=lambda r: (r.in_flight, r.served))
        if prefix is not None:
            url = self._affinity.get(prefix)
            for replica in candidates:
                if replica.url == url and replica.in_flight <= least.in_flight + self.max_extra_in_flight:
                    return replica, True
        return least, False

    def remember(self, prefix: str | None, replica: Replica) -> None:
        if prefix is None:
            return
        self._affinity[prefix] = replica.url
        self._affinity.move_to_end(prefix)
        while len(self._affinity) > self.max_affinity_entries:
            self._affinity.popitem(last=False)

    def affinity_of(self, prefix: str) -> str | None:
        return self._affinity.get(prefix)
