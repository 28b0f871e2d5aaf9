"""Replica discovery by DNS: replicas join and leave one name while streams run, and no stream is lost."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from router_fakes import Behavior, FakeReplica, chat_body, run, sse_data

from builders.errors import ConfigError
from builders.router import start_router
from builders.router.config import config_from_mapping
from builders.router.discoverer import DiscoveryFailed
from builders.router.discovery import system_resolver

NAME = "forge-pool-p.test.svc.cluster.local"
ROOT = Path(__file__).resolve().parents[2]


class Answers:
    """A resolver the test controls: the A records of each name, changed while the router runs."""

    def __init__(self, records: dict[str, list[str]]) -> None:
        self.records = records
        self.asked = 0
        self.failing = False

    async def __call__(self, name: str, port: int) -> list[str]:
        self.asked += 1
        if self.failing:
            raise DiscoveryFailed(f"resolving {name}: timed out")
        return list(self.records.get(name, []))


def dns_config(port: int, **overrides: object) -> dict[str, object]:
    return {
        "host": "127.0.0.1",
        "port": 0,
        "pools": {"p": []},
        "discovery": {"p": {"dns": NAME, "port": port, "interval_s": 0.05}},
        "default_pool": "p",
        **overrides,
    }


async def stream_once(session: aiohttp.ClientSession, url: str) -> tuple[str, list[str]]:
    async with session.post(f"{url}/v1/chat/completions", json=chat_body("x", stream=True)) as resp:
        assert resp.status == 200, await resp.text()
        return resp.headers["x-forge-replica"], sse_data(await resp.read())


def test_replicas_join_and_leave_one_name_while_streams_run_and_none_is_lost() -> None:
    async def body() -> None:
        # Same port, two loopback addresses: what two pods behind one headless Service look like.
        slow = Behavior(tokens=30, delay_s=0.02)
        first = await FakeReplica(slow, name="first").start()
        port = int(first.url.rsplit(":", 1)[1])
        second = await FakeReplica(slow, name="second", host="127.0.0.2", port=port).start()
        answers = Answers({NAME: ["127.0.0.1"]})
        router = await start_router(config_from_mapping(dns_config(port), source="test"), resolver=answers)
        results: list[tuple[float, str, list[str]]] = []
        stop = asyncio.Event()

        async def client(session: aiohttp.ClientSession) -> None:
            while not stop.is_set():
                served_by, events = await stream_once(session, router.url)
                results.append((time.monotonic(), served_by, events))

        try:
            async with aiohttp.ClientSession() as session:
                clients = [asyncio.create_task(client(session)) for _ in range(4)]
                await asyncio.sleep(0.8)
                answers.records[NAME] = ["127.0.0.1", "127.0.0.2"]
                await asyncio.sleep(1.2)
                # The first replica stops resolving while streams are running on it.
                assert first.url in [r.url for r in router.router.pools["p"].replicas]
                running_on_first = next(r for r in router.router.pools["p"].replicas if r.url == first.url).in_flight
                answers.records[NAME] = ["127.0.0.2"]
                left_at = time.monotonic()
                await asyncio.sleep(1.2)
                stop.set()
                await asyncio.gather(*clients)
        finally:
            await router.stop()
            await first.stop()
            await second.stop()

        assert running_on_first > 0, "the removal must happen while streams run on the replica that leaves"
        # Every stream, including those running on the replica as it left, ended whole.
        for _, _, events in results:
            assert events[-1] == "[DONE]"
            contents = [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]]
            assert contents == [f"t{i} " for i in range(30)]
        assert first.aborted == 0 and second.aborted == 0
        served = [by for _, by, _ in results]
        assert second.url in served, "the replica that joined took streams"
        # Nothing new reached the replica that left, beyond what was chosen before the answer was read.
        late = [by for at, by, _ in results if at > left_at + 0.7 and by == first.url]
        assert late == []
        assert first.completed >= running_on_first

    run(body(), timeout=30)


def test_a_failing_resolver_keeps_the_pool_and_an_empty_answer_empties_it() -> None:
    async def body() -> None:
        replica = await FakeReplica(name="only").start()
        port = int(replica.url.rsplit(":", 1)[1])
        answers = Answers({NAME: ["127.0.0.1"]})
        router = await start_router(config_from_mapping(dns_config(port), source="test"), resolver=answers)
        try:
            async with aiohttp.ClientSession() as session:
                answers.failing = True
                asked = answers.asked
                while answers.asked < asked + 3:
                    await asyncio.sleep(0.02)
                # A DNS timeout says nothing about the replicas: they stay.
                served_by, _ = await stream_once(session, router.url)
                assert served_by == replica.url
                answers.failing = False
                answers.records[NAME] = []
                while router.router.pools["p"].replicas:
                    await asyncio.sleep(0.02)
                async with session.post(f"{router.url}/v1/chat/completions", json=chat_body("x")) as resp:
                    assert resp.status == 503
                async with session.get(f"{router.url}/health") as resp:
                    assert (await resp.json())["pool_serving"] == {"p": False}
        finally:
            await router.stop()
            await replica.stop()

    run(body(), timeout=20)


# The resolver under test, by its import path: a child process in a namespace of its own runs it.
RESOLVE = (
    f"import asyncio, sys; from {system_resolver.__module__} import {system_resolver.__name__} as resolve; "
    "print(asyncio.run(resolve(sys.argv[1], 80)))"
)


def test_system_resolver_returns_every_address_of_a_name(tmp_path: Path) -> None:
    # A headless Service's name has one A record per ready pod. The seam is the system resolver's own input: a
    # hosts file the test writes, bind-mounted over /etc/hosts in a user and mount namespace of the resolving
    # process alone (glibc's files source returns every line of a name), so no DNS server and no root.
    hosts = tmp_path / "hosts"
    hosts.write_text(
        "127.0.0.1 localhost\n10.88.0.12 forge-pool.test\n10.88.0.3 forge-pool.test\n10.88.0.7 forge-pool.test\n"
        "10.88.0.9 forge-one.test\n"
    )
    unshare = shutil.which("unshare")
    assert unshare, "unshare (util-linux) runs the resolver in a namespace of its own"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    answers = []
    for name in ("forge-pool.test", "forge-one.test"):
        done = subprocess.run(
            [unshare, "--user", "--map-root-user", "--mount", "sh", "-c",
             'mount --bind "$0" /etc/hosts && exec "$1" -c "$2" "$3"', hosts, sys.executable, RESOLVE, name],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"the resolver could not run in a namespace of its own: {done.stderr}"
        answers.append(done.stdout.strip())
    # Every address, deduplicated and sorted as strings (the discoverer diffs sets of URLs).
    assert answers == ["['10.88.0.12', '10.88.0.3', '10.88.0.7']", "['10.88.0.9']"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"pools": {"p": ["http://127.0.0.1:9"]}}, "lists replicas and has discovery"),
        ({"pools": {"p": [], "q": []}}, "pool 'q' has no replicas"),
        ({"discovery": {"pp": {"dns": NAME, "port": 80}}}, "discovery.pp: unknown pool (did you mean 'p'?)"),
        ({"discovery": {"p": {"dns": NAME, "port": 80, "intervall_s": 1}}}, "did you mean 'interval_s'?"),
    ],
    ids=["both", "neither", "unknown-pool", "typo"],
)
def test_discovery_config_errors_name_the_key(change: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_mapping({**dns_config(80), **change}, source="router.yaml")
    assert expected in err.value.message
    assert "router.yaml" in err.value.message
