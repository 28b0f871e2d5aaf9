"""How the router finds a pool's replicas: a fixed list, every address a DNS name resolves to, or the Ready pods
of a label selector through the Kubernetes API (builders/router/kubernetes_discovery.py, an optional client).

This module only keeps each pool's replica list equal to what its discoverer finds; choosing a replica
(builders/router/replicas.py) and moving bytes (relay.py, upstream.py) are elsewhere.

A replica that leaves a pool is only taken out of the list new requests choose from. A request already
running on it holds its Replica object and its connection, and ends as it would have: a DNS answer that
drops a pod (Kubernetes drops a pod that turns NotReady or terminating from its headless Service) never
cuts a stream. DNS discovery needs no Kubernetes API permission: the cluster's DNS is the source.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from builders.router.config import DnsDiscovery, KubernetesDiscovery, RouterConfig
from builders.router.discoverer import Discoverer, DiscoveryFailed
from builders.router.replicas import Pool, Replica

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""(name, port) -> the IPv4 addresses the name resolves to now; [] when it names nothing."""

# getaddrinfo's answers for a name that exists but has no address (every pod of a headless Service gone):
# the pool is empty, which is different from a resolver that could not be asked.
_NO_ADDRESS = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


async def system_resolver(name: str, port: int) -> list[str]:
    """Every A record of `name` through the system resolver (glibc returns all of a headless Service's)."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(name, port, family=socket.AF_INET, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in _NO_ADDRESS:
            return []
        raise DiscoveryFailed(f"resolving {name}: {exc.strerror or exc}") from None
    return sorted({str(info[4][0]) for info in infos})


@dataclass(frozen=True, kw_only=True)
class StaticDiscoverer:
    """The URLs the config lists."""

    listed: tuple[str, ...]
    interval_s: float | None = None

    async def urls(self) -> list[str]:
        return list(self.listed)

    async def close(self) -> None:
        pass


@dataclass(frozen=True, kw_only=True)
class DnsDiscoverer:
    """Every address of a DNS name, each at the same port: a Kubernetes headless Service's ready pods."""

    settings: DnsDiscovery
    resolver: Resolver = system_resolver

    @property
    def interval_s(self) -> float | None:
        return self.settings.interval_s

    async def urls(self) -> list[str]:
        s = self.settings
        addresses = await self.resolver(s.dns, s.port)
        return [f"{s.scheme}://{address}:{s.port}" for address in addresses]

    async def close(self) -> None:
        pass


def discoverers(config: RouterConfig, *, resolver: Resolver = system_resolver) -> dict[str, Discoverer]:
    """One discoverer per pool, decided once from the config."""
    found: dict[str, Discoverer] = {}
    for name, urls in config.pools.items():
        settings = config.discovery.get(name)
        if isinstance(settings, KubernetesDiscovery):
            # Imported here: the `kubernetes` client is an extra, needed only by a config that asks for it.
            from builders.router.kubernetes_discovery import KubernetesDiscoverer

            found[name] = KubernetesDiscoverer(settings)
        elif settings is not None:
            found[name] = DnsDiscoverer(settings=settings, resolver=resolver)
        else:
            found[name] = StaticDiscoverer(listed=tuple(urls))
    return found


@dataclass(kw_only=True)
class Change:
    pool: str
    added: list[Replica] = field(default_factory=list)
    removed: list[Replica] = field(default_factory=list)


def apply(pool: Pool, urls: Iterable[str]) -> Change:
    """Make `pool`'s replica list match `urls`: new ones join (optimistic, as a listed replica starts), gone ones
    leave. A replica that stays keeps its state (health, in-flight count, affinity)."""
    wanted = list(dict.fromkeys(urls))
    current = {r.url: r for r in pool.replicas}
    change = Change(pool=pool.name)
    change.removed = [r for r in pool.replicas if r.url not in wanted]
    change.added = [Replica(pool=pool.name, url=url) for url in wanted if url not in current]
    if change.added or change.removed:
        # A new list, not an edit in place: a loop over the old one (a health round) finishes undisturbed.
        pool.replicas = [current.get(url) or next(r for r in change.added if r.url == url) for url in wanted]
    return change


OnChange = Callable[[Change], Awaitable[None]]


class Membership:
    """Keeps every pool's replicas equal to its discoverer's answer, re-asking each on its own interval."""

    def __init__(self, pools: dict[str, Pool], found: dict[str, Discoverer], on_change: OnChange | None = None) -> None:
        self.pools = pools
        self.discoverers = found
        self.on_change = on_change
        self.last_error: dict[str, str | None] = dict.fromkeys(found)

    @property
    def dynamic(self) -> bool:
        return any(d.interval_s is not None for d in self.discoverers.values())

    async def refresh(self, name: str) -> Change | None:
        """Ask pool `name`'s discoverer once and apply the answer; None (pool unchanged) when it failed."""
        try:
            urls = await self.discoverers[name].urls()
        except DiscoveryFailed as exc:
            self.last_error[name] = str(exc)
            print(f"forge router: discovery of pool {name}: {exc}; keeping its replicas", file=sys.stderr, flush=True)
            return None
        self.last_error[name] = None
        change = apply(self.pools[name], urls)
        if (change.added or change.removed) and self.on_change is not None:
            await self.on_change(change)
        return change

    async def refresh_all(self) -> None:
        await asyncio.gather(*(self.refresh(name) for name in self.discoverers))

    async def run(self) -> None:
        """Re-ask every dynamic pool on its interval until cancelled."""
        loops = [
            asyncio.create_task(self._every(name, d.interval_s))
            for name, d in self.discoverers.items()
            if d.interval_s is not None
        ]
        try:
            await asyncio.gather(*loops)
        finally:
            for task in loops:
                task.cancel()
            for task in loops:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await asyncio.gather(*(d.close() for d in self.discoverers.values()), return_exceptions=True)

    async def _every(self, name: str, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.refresh(name)
