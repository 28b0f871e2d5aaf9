"""Health checks of the replicas, what discovery's membership changes trigger, and when a replica's models are
asked (builders/router/served_models.py: when it is first found healthy, when it comes back, and every
models_refresh_s)."""

from __future__ import annotations

import asyncio
import sys
import time

import aiohttp

from builders.router.call import REPLICA_DOWN
from builders.router.config import RouterConfig
from builders.router.discovery import Change
from builders.router.dispatch import Dispatcher
from builders.router.replicas import Pool, Replica
from builders.router.served_models import ModelCatalog


class HealthChecker:
    """GET /health on every replica each health_interval_s, on connections of its own; a replica that fails
    is marked down, and the calls waiting on it are released at once (failover, or an error answer)."""

    def __init__(
        self, config: RouterConfig, pools: dict[str, Pool], dispatcher: Dispatcher, catalog: ModelCatalog
    ) -> None:
        self.config = config
        self.pools = pools
        self._dispatcher = dispatcher
        self._catalog = catalog
        self._session: aiohttp.ClientSession | None = None

    def start(self, session: aiohttp.ClientSession) -> None:
        self._session = session

    async def check_replica(self, replica: Replica) -> None:
        timeout = aiohttp.ClientTimeout(total=self.config.health_timeout_s)
        if self._session is None:
            raise RuntimeError("the router's health session exists only while the app runs")
        try:
            async with self._session.get(f"{replica.url}/health", timeout=timeout) as resp:
                ok = resp.status == 200
                error = None if ok else f"GET /health answered {resp.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            ok, error = False, f"GET /health failed: {type(exc).__name__}: {exc}"
        replica.last_check = time.monotonic()
        if ok:
            came_back = not replica.healthy
            replica.healthy = True
            # A server that was down may have come back serving another model; one never asked is asked now.
            due = replica.last_check - replica.models_asked >= self.config.models_refresh_s
            if self._catalog.asks(replica) and (replica.models is None or came_back or due):
                await self._catalog.ask(
                    self._session, replica, self._dispatcher.upstream_headers(), self.config.health_timeout_s
                )
        else:
            replica.mark_down(error or "unhealthy")
            # Requests already waiting on it would otherwise wait out first_byte_timeout_s or
            # upstream_idle_timeout_s on a replica known to be gone. One that is still receiving bytes
            # is not hung, whatever /health says (a check can time out on a busy replica): it goes on.
            quiet_since = time.monotonic() - self.config.health_timeout_s
            for call in [c for c in self._dispatcher.calls if c.replica is replica and c.last_upstream <= quiet_since]:
                self._dispatcher.interrupt(
                    call, REPLICA_DOWN, f"replica {replica.url} was marked down by its health check"
                )

    async def membership_changed(self, change: Change) -> None:
        added = ", ".join(r.url for r in change.added) or "none"
        removed = ", ".join(f"{r.url} ({r.in_flight} in flight, left to finish)" for r in change.removed) or "none"
        print(f"forge router: pool {change.pool}: joined {added}; left {removed}", file=sys.stderr, flush=True)
        # What the pool serves is its replicas' models: one that left takes its models with it.
        self._catalog.rebuild()
        # A new replica is checked at once rather than at the next round, so a wrong address is not chosen
        # for a whole health interval.
        await asyncio.gather(*(self.check_replica(r) for r in change.added))

    async def check_all(self) -> None:
        replicas = [r for pool in self.pools.values() for r in pool.replicas]
        await asyncio.gather(*(self.check_replica(r) for r in replicas))

    async def run(self) -> None:
        while True:
            await self.check_all()
            await asyncio.sleep(self.config.health_interval_s)
