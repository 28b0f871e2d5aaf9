"""The policy that picks a request's pool: its `model` first, then its class.

A request that names a model goes to a pool that serves it (builders/router/served_models.py keeps the index): its
class's own pool (class_pools, default_pool) when that is one of them, else the first of them in config order, so
two models behind one address need no class_pools at all. A request without a model goes to its class's pool, as
before models were known. A model that no pool serves gets a 404 from the caller. A pool whose models are still
unknown (none of its replicas has answered yet, as at start) counts as serving every model, so the class policy
routes as it did before models were known, and the replica decides. Spilling to another pool (work_conserving.py)
comes after this choice, and only onto a pool that serves the same model.
"""

from __future__ import annotations

from collections.abc import Mapping

from builders.router.classes import EVERY_CLASS, TrafficClass
from builders.router.config import RouterConfig
from builders.router.replicas import Pool
from builders.router.served_models import ModelCatalog


class PoolChoice:
    def __init__(self, config: RouterConfig, pools: Mapping[str, Pool], catalog: ModelCatalog) -> None:
        self.catalog = catalog
        # Decided once: a class's pool never changes while the router runs.
        self._home = {c: pools[config.pool_for(c)] for c in EVERY_CLASS}

    def home(self, request_class: TrafficClass) -> Pool:
        """The class's own pool: where a request goes when its model does not decide."""
        return self._home[request_class]

    def choose(self, model: str | None, request_class: TrafficClass) -> Pool | None:
        """The pool for a request, or None when no pool serves its model."""
        home = self._home[request_class]
        if model is None:
            return home
        catalog = self.catalog
        serving = catalog.serving.get(model) or catalog.unknown
        for pool in serving:
            if pool is home:
                return home
        return serving[0] if serving else None

    def may_serve(self, pool: Pool, model: str | None) -> bool:
        """Whether a request for `model` may go to `pool` (a spill target, for one)."""
        if model is None:
            return True
        catalog = self.catalog
        return any(p is pool for p in catalog.serving.get(model) or catalog.unknown)
