"""A real vLLM replica behind the router for the paths that are not chat: the generated tiny Llama served as an
embedding model (`--runner pooling --convert embed`, the arguments profiles/two-models.yaml gives its embed pool),
reached through the router by the official client's embeddings and by vLLM's own /tokenize, /detokenize and
/version, next to a chat pool of another model. No class_pools: each request finds its pool by its model alone.

One vLLM start on one core (the cheapest real instance of the path); the chat pool is a stand-in, since chat
through the router on real vLLM is what every other server test runs.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import aiohttp
import openai
import pytest
import requests
from router_fakes import FakeReplica, router_config, run

from builders.cpusets import parse_cpuset
from builders.router import start_router
from builders.serving_dtype import choose_dtype, this_host
from builders.smoke.plan import plan_stack
from builders.smoke.profile import load_profile
from builders.smoke.runtimes import LaunchedProcess, start_process

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "smoke"))
from smoke_helpers import ROOT, free_base_port, local_vllm

pytestmark = [pytest.mark.server]


def wait_healthy(url: str, launched: LaunchedProcess, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not launched.alive():
            raise AssertionError(f"vLLM exited before it was healthy:\n{launched.logs(60)}")
        try:
            if requests.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise AssertionError(f"vLLM not healthy within {timeout_s}s:\n{launched.logs(60)}")


@pytest.mark.timeout(420)
def test_a_real_vllm_embedding_replica_serves_embeddings_and_tokenize_through_the_router(tmp_path: Path) -> None:
    binary = local_vllm()
    profile, _ = load_profile("two-models", root=ROOT)
    # float32, as on CI's AVX2-only runner and in rendered manifests: on this 2-core Xeon VM vLLM 0.32's bfloat16
    # worker died of SIGILL (exit -4) at its first forward pass, generation and pooling alike (2026-12-04).
    float32 = choose_dtype("float32", this_host())
    plan = plan_stack(profile, run_id="embed", base_port=free_base_port(profile.replica_count), dtype=float32)
    replica = next(r for r in plan.replicas if r.pool == "embed")
    assert replica.args[replica.args.index("--runner") :][:4] == ("--runner", "pooling", "--convert", "embed")
    model_dir = tmp_path / "model"
    replica.serving.write_model(model_dir, profile, dtype=plan.dtype.dtype)
    launched = start_process(
        [str(binary), "serve", str(model_dir), *replica.args],
        name=replica.name,
        env=replica.env,
        log_path=tmp_path / "vllm.log",
        cpus=parse_cpuset(replica.cpuset) if replica.cpuset is not None else None,
    )
    try:
        wait_healthy(replica.url, launched, timeout_s=300)

        async def body() -> None:
            chat = await FakeReplica(name="chat").start()
            # The embedding pool first and the default: every request without a model lands on real vLLM.
            router = await start_router(router_config({"embed": [replica.url], "chat": [chat.url]}))
            try:
                await router.router.health.check_all()
                client = openai.AsyncOpenAI(base_url=f"{router.url}/v1", api_key="none", max_retries=0, timeout=60)
                raw = await client.embeddings.with_raw_response.create(
                    model="forge-tiny-embed", input=["hello world", "a second text"]
                )
                assert raw.headers["x-forge-pool"] == "embed"
                vectors = [d.embedding for d in raw.parse().data]
                assert len(vectors) == 2 and len(vectors[0]) == profile.model.hidden_size
                # vLLM's embed converter normalises: each vector has length 1.
                assert all(math.isclose(math.hypot(*v), 1.0, rel_tol=1e-3) for v in vectors)
                assert vectors[0] != vectors[1]
                # Chat for the chat pool's model goes there, though every class's pool is the embedding pool.
                answer = await client.chat.completions.with_raw_response.create(
                    model="m", messages=[{"role": "user", "content": "hi"}]
                )
                assert answer.headers["x-forge-pool"] == "chat"
                with pytest.raises(openai.NotFoundError) as unknown:
                    await client.embeddings.create(model="forge-tiny", input="x")
                assert "forge-tiny-embed" in unknown.value.message

                async with aiohttp.ClientSession() as s:
                    tokenize = {"model": "forge-tiny-embed", "prompt": "hello world"}
                    async with s.post(f"{router.url}/tokenize", json=tokenize) as resp:
                        assert resp.status == 200, await resp.text()
                        assert resp.headers["x-forge-class"] == "tokenize"
                        tokens = await resp.json()
                    assert tokens["count"] == len(tokens["tokens"]) > 0
                    assert tokens["max_model_len"] == profile.model.max_model_len
                    async with s.post(f"{router.url}/detokenize", json={"tokens": tokens["tokens"]}) as resp:
                        assert resp.status == 200, await resp.text()
                        assert "hello" in (await resp.json())["prompt"]
                    async with s.get(f"{router.url}/version") as resp:
                        assert resp.status == 200 and (await resp.json())["version"].startswith("0.")
                    async with s.get(f"{router.url}/metrics") as resp:
                        text = await resp.text()
                assert 'forge_router_requests_total{class="embeddings",pool="embed"} 1' in text
                assert 'forge_router_requests_total{class="tokenize",pool="embed"} 2' in text
            finally:
                await router.stop()
                await chat.stop()

        run(body(), timeout=120)
    finally:
        launched.stop()
    assert not launched.group_alive()
