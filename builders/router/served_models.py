"""Which models each pool serves: named in the config (`models`), or learnt from its replicas' GET /v1/models.

The model side of discovery: discovery (builders/router/discovery.py) says which replicas a pool has, this module
which models they serve, and the policy (builders/router/pool_choice.py) reads the index kept here. A replica is
asked when the health checker first finds it healthy (at start, when discovery adds it) and again each time it comes
back after being down, since a restarted server may serve another model; until one of a pool's replicas has answered,
the pool's models are unknown, and the policy still lets it take requests for models no known pool serves.
"""

from __future__ import annotations

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
        """Model name -> the pools that serve it, in config order."""
        self.unknown: tuple[Pool, ...] = ()
        """Pools whose models are not known yet (no replica has answered GET /v1/models)."""
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
        return sorted(self.serving)

    def rebuild(self) -> None:
        serving: dict[str, list[Pool]] = {}
        unknown: list[Pool] = []
        for pool in self._pools.values():
            models = self.models_of(pool)
            if models is None:
                unknown.append(pool)
                continue
            for model in models:
                serving.setdefault(model, []).append(pool)
        # Replaced whole, never edited: a request reading the old index meanwhile sees a consistent one.
        self.serving = {model: tuple(pools) for model, pools in serving.items()}
        self.unknown = tuple(unknown)

    def learn(self, replica: Replica, models: tuple[str, ...]) -> None:
        if replica.models != models:
            replica.models = models
            self.rebuild()

    async def ask(
        self, session: aiohttp.ClientSession, replica: Replica, headers: Mapping[str, str], timeout_s: float
    ) -> str | None:
        """Ask one replica which models it serves and learn the answer; None, or why it could not be learnt (the
        replica keeps what was learnt before)."""
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
