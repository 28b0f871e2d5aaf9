"""Which models each pool serves: named in the config (`models`), or learnt from its replicas' GET /v1/models.

The model side of discovery: discovery (builders/router/discovery.py) says which replicas a pool has, this module
which models they serve, and the policy (builders/router/pool_choice.py) reads the index kept here. A replica is
asked when the health checker first finds it healthy (at start, when discovery adds it), again each time it comes
back after being down, since a restarted server may serve another model, and every models_refresh_s while healthy
(a LoRA adapter loaded at run time). Until one of a pool's replicas has answered, the pool's models are unknown,
and the policy counts it as serving every model.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import aiohttp

from builders.router.replicas import Pool, Replica

MAX_MODELS = 1000
"""Model names kept per replica: a replica listing more is trusted for the first ones only (LoRA adapters count)."""


class ModelCatalog:
    """The model -> pools index the policy reads on every request, rebuilt only when what a pool serves changes."""

    def __init__(self, pools: Mapping[str, Pool], configured: Mapping[str, Sequence[str]]) -> None:
        self._pools = pools
        self._configured = {name: tuple(models) for name, models in configured.items()}
        self.serving: dict[str, tuple[Pool, ...]] = {}
        """Model name -> the pools that serve it or may (their models are not known yet), in config order."""
        self.unknown: tuple[Pool, ...] = ()
        """Pools whose models are not known yet (no replica has answered GET /v1/models): the candidates for a
        model no known pool serves."""
        self._names: list[str] = []
        self.rebuild()

    def asks(self, replica: Replica) -> bool:
        """Whether the replica's models are learnt from it (its pool's are not named in the config)."""
        return replica.pool not in self._configured

    def models_of(self, pool: Pool) -> tuple[str, ...] | None:
        configured = self._configured.get(pool.name)
        if configured is not None:
            return configured
        # Down replicas count: a model whose only replica is down is served but unavailable (a 503), not unknown.
        learnt = [r.models for r in pool.replicas if r.models is not None]
        if not learnt:
            return None
        return tuple(dict.fromkeys(model for models in learnt for model in models))

    def served(self) -> list[str]:
        """The models known to be served, sorted."""
        return self._names

    def rebuild(self) -> None:
        known: dict[str, tuple[str, ...]] = {}
        for pool in self._pools.values():
            models = self.models_of(pool)
            if models is not None:
                known[pool.name] = models
        unknown = tuple(pool for pool in self._pools.values() if pool.name not in known)
        names = dict.fromkeys(model for models in known.values() for model in models)
        # A pool not asked yet may serve any model: it stays a candidate for each, in config order, so that the
        # class policy still finds its own pool while the replicas are being asked (at start).
        serving = {
            model: tuple(p for p in self._pools.values() if p.name not in known or model in known[p.name])
            for model in names
        }
        # Replaced whole, never edited: a request reading the old index meanwhile sees a consistent one.
        self.serving, self.unknown, self._names = serving, unknown, sorted(names)

    def learn(self, replica: Replica, models: tuple[str, ...]) -> None:
        if replica.models != models:
            replica.models = models
            self.rebuild()

    async def ask(
        self, session: aiohttp.ClientSession, replica: Replica, headers: Mapping[str, str], timeout_s: float
    ) -> str | None:
        """Ask one replica which models it serves and learn the answer; None, or why it could not be learnt (the
        replica keeps what was learnt before)."""
        replica.models_asked = time.monotonic()
        try:
            async with session.get(
                f"{replica.url}/v1/models", headers=dict(headers), timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                if resp.status != 200:
                    return f"GET /v1/models answered {resp.status}"
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            return f"GET /v1/models failed: {type(exc).__name__}"
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            return "GET /v1/models answered no model list"
        ids = [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
        self.learn(replica, tuple(dict.fromkeys(ids[:MAX_MODELS])))
        return None
