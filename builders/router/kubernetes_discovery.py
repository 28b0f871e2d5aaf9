"""How the router finds a pool's replicas through the Kubernetes API: the Ready pods a label selector picks.

One list, then a watch from the list's resourceVersion, through the `kubernetes` client's asyncio half
(`kubernetes.aio`, imported only when a pool asks for it: `pip install 'forge-vllm[kubernetes]'`). In a pod it
uses the pod's service account (in-cluster config); elsewhere the kubeconfig ($KUBECONFIG or ~/.kube/config).
The service account needs get, list and watch on pods in the namespace (`forge deploy render` writes that Role
when the profile's `deploy.discovery` is `kubernetes`).

A pod serves only while it is Running, has an IP, is Ready, and is not terminating. When it turns NotReady
(vLLM's router repo #279: such pods kept getting traffic) or starts terminating, it leaves the list new requests
choose from at the next interval; the streams it runs keep their replica and connection (builders/router/
discovery.py apply()), so none is cut. While the API cannot be reached the pool is kept as it was
(DiscoveryFailed), and the watch is re-established with a fresh list.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from builders.errors import ConfigError
from builders.router.config import KubernetesDiscovery
from builders.router.discoverer import DiscoveryFailed

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
WATCH_TIMEOUT_S = 240
"""Server-side end of each watch: the API server closes it and the watch resumes from the last resourceVersion."""
RETRY_S = 2.0


def _client() -> Any:
    try:
        import kubernetes.aio as k8s
    except ImportError:
        raise ConfigError(
            "the router config asks for Kubernetes API discovery (a discovery entry with label_selector), but "
            "the `kubernetes` client is not installed",
            hint="pip install 'forge-vllm[kubernetes]' in the router's environment, or use DNS discovery",
        ) from None
    return k8s


def pod_url(pod: Any, settings: KubernetesDiscovery) -> str | None:
    """The pod's base URL while it may take new requests, else None."""
    if pod.metadata is None or pod.metadata.deletion_timestamp is not None or pod.status is None:
        return None
    status = pod.status
    if status.phase != "Running" or not status.pod_ip:
        return None
    if not any(c.type == "Ready" and c.status == "True" for c in status.conditions or ()):
        return None
    host = f"[{status.pod_ip}]" if ":" in status.pod_ip else status.pod_ip
    return f"{settings.scheme}://{host}:{settings.port}"


class KubernetesDiscoverer:
    """The Ready pods of one label selector, kept current by a watch that runs beside the router."""

    def __init__(self, settings: KubernetesDiscovery) -> None:
        self.settings = settings
        self._k8s = _client()
        self._pods: dict[str, str | None] = {}
        """Pod key (namespace/name) -> its URL while it serves, None while it does not."""
        self._error: str | None = "not listed yet"
        self._task: asyncio.Task[None] | None = None
        self._api: Any = None
        self._namespace = settings.namespace or "(the default namespace)"
        self.lists = 0
        """Full lists made (one at start, one after each lost watch): how tests see a relist."""

    @property
    def interval_s(self) -> float | None:
        return self.settings.interval_s

    async def urls(self) -> list[str]:
        if self._task is None:
            if self._api is None:
                try:
                    self._api = await self._core_api()
                except Exception as exc:  # no in-cluster config and no kubeconfig, or an unreadable one
                    raise DiscoveryFailed(f"no Kubernetes API to ask: {_describe(exc)}") from None
            # The first answer is a list, so the pool is filled before the router takes traffic.
            version = await self._list_or_error()
            self._task = asyncio.create_task(self._watch(version))
        if self._error is not None:
            raise DiscoveryFailed(f"pods {self.settings.label_selector!r} in {self._namespace}: {self._error}")
        return sorted({url for url in self._pods.values() if url is not None})

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._api is not None:
            await self._api.api_client.close()

    # --- the API ----------------------------------------------------------------------------------

    async def _core_api(self) -> Any:
        k8s = self._k8s
        configuration = k8s.client.Configuration()
        try:
            k8s.config.load_incluster_config(client_configuration=configuration)
            in_cluster = True
        except k8s.config.ConfigException:
            # $KUBECONFIG as it is now: the client reads it once, when first imported.
            await k8s.config.load_kube_config(
                config_file=os.environ.get("KUBECONFIG") or None, client_configuration=configuration
            )
            in_cluster = False
        self._namespace = self.settings.namespace or self._default_namespace(in_cluster)
        return k8s.client.CoreV1Api(k8s.client.ApiClient(configuration))

    def _default_namespace(self, in_cluster: bool) -> str:
        if in_cluster and SERVICE_ACCOUNT_NAMESPACE.is_file():
            return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip()
        with contextlib.suppress(Exception):
            _, active = self._k8s.config.list_kube_config_contexts(os.environ.get("KUBECONFIG") or None)
            namespace = active.get("context", {}).get("namespace")
            if namespace:
                return str(namespace)
        return "default"

    async def _list(self) -> str:
        self.lists += 1
        pods = await self._api.list_namespaced_pod(self._namespace, label_selector=self.settings.label_selector)
        self._pods = {self._key(pod): pod_url(pod, self.settings) for pod in pods.items}
        self._error = None
        return str(pods.metadata.resource_version)

    async def _list_or_error(self) -> str | None:
        try:
            return await self._list()
        except Exception as exc:  # the client raises ApiException and aiohttp's errors alike
            self._error = _describe(exc)
            return None

    async def _watch(self, version: str | None) -> None:
        k8s = self._k8s
        while True:
            if version is None:
                await asyncio.sleep(RETRY_S)
                version = await self._list_or_error()
                continue
            watch = k8s.watch.Watch()
            try:
                async with watch.stream(
                    self._api.list_namespaced_pod,
                    self._namespace,
                    label_selector=self.settings.label_selector,
                    resource_version=version,
                    timeout_seconds=WATCH_TIMEOUT_S,
                    allow_watch_bookmarks=True,
                ) as events:
                    async for event in events:
                        self._apply(event["type"], event["object"])
                        version = watch.resource_version or version
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # 410 Gone (the version is too old) or a lost connection: what happened meanwhile is unknown,
                # so the pods are listed afresh rather than trusted.
                self._error = _describe(exc)
                print(
                    f"forge router: watch of pods {self.settings.label_selector!r}: {self._error}; listing again",
                    file=sys.stderr,
                    flush=True,
                )
                version = None

    def _apply(self, kind: str, pod: Any) -> None:
        if kind == "BOOKMARK":
            return
        key = self._key(pod)
        if kind == "DELETED":
            self._pods.pop(key, None)
        else:
            self._pods[key] = pod_url(pod, self.settings)

    @staticmethod
    def _key(pod: Any) -> str:
        return f"{pod.metadata.namespace}/{pod.metadata.name}"


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(exc).__name__}: {exc}"
