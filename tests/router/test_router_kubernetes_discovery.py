"""Replica discovery through the Kubernetes API: the real `kubernetes` client lists and watches pods from an HTTP
fake of the API server's pod endpoints, and pods that turn NotReady leave the pool without cutting a stream."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from router_fakes import Behavior, FakeReplica, chat_body, run, sse_data

from builders.errors import ConfigError
from builders.router import start_router
from builders.router.config import config_from_mapping

pytest.importorskip(
    "kubernetes.aio", reason="the `kubernetes` client is an extra: pip install 'forge-vllm[kubernetes]'"
)

NAMESPACE = "serving"
SELECTOR = "app.kubernetes.io/instance=forge-ci,forge/pool=p"
TOKEN = "fake-service-account-token"


def pod(name: str, ip: str, *, ready: bool = True, version: int, terminating: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": NAMESPACE, "resourceVersion": str(version), "uid": name}
    if terminating:
        metadata["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


class FakeApiServer:
    """GET /api/v1/namespaces/NS/pods as the API server answers it: a PodList, or with watch=true a stream of
    JSON events, one a line, sent when the test pushes them."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.version = 100
        self.watchers: list[asyncio.Queue[dict[str, Any] | None]] = []
        self.requests: list[tuple[str, dict[str, str], str | None]] = []
        self.lists = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> FakeApiServer:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{namespace}/pods", self._pods)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        for queue in self.watchers:
            queue.put_nowait(None)
        assert self._runner is not None
        await self._runner.cleanup()

    def send(self, kind: str, obj: dict[str, Any]) -> None:
        """An event to every open watch, and the change kept for the next list."""
        self.version += 1
        if kind != "ERROR":
            obj["metadata"]["resourceVersion"] = str(self.version)
            if kind == "DELETED":
                self.pods.pop(obj["metadata"]["name"], None)
            else:
                self.pods[obj["metadata"]["name"]] = obj
        for queue in self.watchers:
            queue.put_nowait({"type": kind, "object": obj})

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(
            (request.match_info["namespace"], dict(request.query), request.headers.get("Authorization"))
        )
        if request.query.get("watch") not in ("true", "1", "True"):
            self.lists += 1
            return web.json_response(
                {
                    "apiVersion": "v1",
                    "kind": "PodList",
                    "metadata": {"resourceVersion": str(self.version)},
                    "items": list(self.pods.values()),
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.watchers.append(queue)
        try:
            while (event := await queue.get()) is not None:
                await response.write(json.dumps(event).encode() + b"\n")
                if event["type"] == "ERROR":
                    break
        finally:
            self.watchers.remove(queue)
        return response


@pytest.fixture
def kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A kubeconfig naming the fake server (filled in once it listens) with a bearer token, as KUBECONFIG."""
    path = tmp_path / "kubeconfig"
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    yield path


def write_kubeconfig(path: Path, server: str) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": server}}],
                "users": [{"name": "router", "user": {"token": TOKEN}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "router"}}],
                "current-context": "fake",
            }
        )
    )


def k8s_config(port: int, **discovery: object) -> dict[str, object]:
    settings = {"label_selector": SELECTOR, "namespace": NAMESPACE, "port": port, "interval_s": 0.05, **discovery}
    return {"host": "127.0.0.1", "port": 0, "pools": {"p": []}, "discovery": {"p": settings}, "default_pool": "p"}


async def stream_once(session: aiohttp.ClientSession, url: str) -> tuple[str, list[str]]:
    async with session.post(f"{url}/v1/chat/completions", json=chat_body("x", stream=True)) as resp:
        assert resp.status == 200, await resp.text()
        return resp.headers["x-forge-replica"], sse_data(await resp.read())


async def until(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_pods_join_by_watch_and_a_pod_turning_not_ready_leaves_without_cutting_its_streams(kubeconfig: Path) -> None:
    async def body() -> None:
        slow = Behavior(tokens=30, delay_s=0.02)
        first = await FakeReplica(slow, name="first").start()
        port = int(first.url.rsplit(":", 1)[1])
        # Same port, two loopback addresses: two pod IPs.
        second = await FakeReplica(slow, name="second", host="127.0.0.2", port=port).start()
        api = await FakeApiServer([pod("p-0", "127.0.0.1", version=1)]).start()
        write_kubeconfig(kubeconfig, api.url)
        router = await start_router(config_from_mapping(k8s_config(port), source="test"))
        replicas = router.router.pools["p"].replicas
        results: list[tuple[float, str, list[str]]] = []
        stop = asyncio.Event()

        async def client(session: aiohttp.ClientSession) -> None:
            while not stop.is_set():
                served_by, events = await stream_once(session, router.url)
                results.append((time.monotonic(), served_by, events))

        try:
            # The list filled the pool before the router took traffic.
            assert [r.url for r in router.router.pools["p"].replicas] == [first.url]
            await until(lambda: api.watchers)
            async with aiohttp.ClientSession() as session:
                clients = [asyncio.create_task(client(session)) for _ in range(4)]
                await asyncio.sleep(0.6)
                # A pod that is Running but not yet Ready does not join; once Ready it does.
                api.send("ADDED", pod("p-1", "127.0.0.2", ready=False, version=0))
                await asyncio.sleep(0.3)
                assert [r.url for r in router.router.pools["p"].replicas] == [first.url]
                api.send("MODIFIED", pod("p-1", "127.0.0.2", version=0))
                await until(lambda: second.url in [r.url for r in router.router.pools["p"].replicas])
                await asyncio.sleep(0.8)
                replicas = router.router.pools["p"].replicas
                running_on_first = next(r for r in replicas if r.url == first.url).in_flight
                # The first pod turns NotReady while streams run on it (its readiness probe failed).
                api.send("MODIFIED", pod("p-0", "127.0.0.1", ready=False, version=0))
                left_at = time.monotonic()
                await until(lambda: [r.url for r in router.router.pools["p"].replicas] == [second.url])
                await asyncio.sleep(1.0)
                stop.set()
                await asyncio.gather(*clients)
                # A terminating pod leaves too, and a deleted one: the pool is empty and its class answers 503.
                api.send("MODIFIED", pod("p-1", "127.0.0.2", version=0, terminating=True))
                await until(lambda: not router.router.pools["p"].replicas)
                api.send("DELETED", pod("p-1", "127.0.0.2", version=0, terminating=True))
                async with session.post(f"{router.url}/v1/chat/completions", json=chat_body("x")) as resp:
                    assert resp.status == 503
        finally:
            await router.stop()
            await api.stop()
            await first.stop()
            await second.stop()

        assert running_on_first > 0, "the pod must turn NotReady while streams run on it"
        for _, _, events in results:
            assert events[-1] == "[DONE]"
            contents = [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]]
            assert contents == [f"t{i} " for i in range(30)]
        assert first.aborted == 0 and second.aborted == 0
        assert second.url in [by for _, by, _ in results], "the pod that turned Ready took streams"
        assert [by for at, by, _ in results if at > left_at + 0.7 and by == first.url] == []
        # What the client asked: the pods of the selector in the namespace, with the kubeconfig's token; a list,
        # then one watch from the list's resourceVersion.
        namespaces = {ns for ns, _, _ in api.requests}
        assert namespaces == {NAMESPACE}
        assert {query["labelSelector"] for _, query, _ in api.requests} == {SELECTOR}
        assert {auth for _, _, auth in api.requests} == {f"Bearer {TOKEN}"}
        watches = [query for _, query, _ in api.requests if query.get("watch")]
        assert api.lists == 1 and len(watches) == 1 and watches[0]["resourceVersion"] == "100"

    run(body(), timeout=30)


def test_an_expired_watch_lists_again_and_a_lost_api_keeps_the_pool(kubeconfig: Path) -> None:
    async def body() -> None:
        replica = await FakeReplica(name="only").start()
        port = int(replica.url.rsplit(":", 1)[1])
        api = await FakeApiServer([pod("p-0", "127.0.0.1", version=1)]).start()
        write_kubeconfig(kubeconfig, api.url)
        router = await start_router(config_from_mapping(k8s_config(port), source="test"))
        try:
            await until(lambda: api.watchers)
            # The API server forgot the watch's version: the client must list again, not trust its state.
            api.pods["p-0"] = pod("p-0", "127.0.0.1", ready=False, version=150)
            api.send("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"})
            await until(lambda: api.lists == 2, timeout_s=10)
            await until(lambda: not router.router.pools["p"].replicas)
            await until(lambda: api.watchers)
            api.send("MODIFIED", pod("p-0", "127.0.0.1", version=0))
            await until(lambda: [r.url for r in router.router.pools["p"].replicas] == [replica.url])
            # The API server goes away: the pool is kept as it was (the pods did not change), and requests go on.
            await api.stop()
            await asyncio.sleep(0.5)
            async with aiohttp.ClientSession() as session:
                served_by, _ = await stream_once(session, router.url)
            assert served_by == replica.url
        finally:
            await router.stop()
            await replica.stop()

    run(body(), timeout=30)


def test_kubernetes_discovery_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        config_from_mapping(k8s_config(80, label_selecter="x"), source="router.yaml")
    assert "router.yaml: discovery.p.label_selecter" in err.value.message
    assert "did you mean 'label_selector'?" in err.value.message
