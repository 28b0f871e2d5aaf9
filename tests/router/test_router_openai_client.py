"""The router as a new user meets it: the official `openai` client and vLLM's own paths over plain HTTP, against
replicas that answer in vLLM's shapes (vllm_fakes.py), with three models in three pools behind one address and no
class_pools. Each request must reach a replica that serves its model, and its answer must parse."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest
from router_fakes import Behavior, FakeReplica, metric, router_config, run, sse_data
from vllm_fakes import VERSION, VllmReplica

from builders.router import RunningRouter, start_router

KEY = "router-key"


@dataclass
class Stack:
    router: RunningRouter
    chat: VllmReplica
    embed: VllmReplica
    asr: VllmReplica

    @property
    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.router.url}/v1", api_key=KEY, max_retries=0, timeout=20)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {KEY}"}


@asynccontextmanager
async def three_models(**overrides: Any) -> AsyncIterator[Stack]:
    """A chat model, an embedding model and a speech model, each in a pool of its own; the config names no
    class_pools (every class falls back to the default pool) and no models (learnt from /v1/models)."""
    chat = await VllmReplica(models=("chat-model",)).start()
    embed = await VllmReplica(models=("embed-model",)).start()
    asr = await VllmReplica(models=("asr-model",)).start()
    config = router_config({"chat": [chat.url], "embed": [embed.url], "asr": [asr.url]}, api_key=KEY, **overrides)
    assert not config.class_pools and not config.models
    router = await start_router(config)
    try:
        await router.router.health.check_all()
        yield Stack(router=router, chat=chat, embed=embed, asr=asr)
    finally:
        await router.stop()
        for replica in (chat, embed, asr):
            await replica.stop()


def test_the_openai_client_reaches_every_endpoint_through_the_router() -> None:
    async def body() -> None:
        async with three_models() as stack:
            client = stack.client
            raw = await client.chat.completions.with_raw_response.create(
                model="chat-model", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert raw.headers["x-forge-pool"] == "chat" and raw.headers["x-forge-class"] == "interactive"
            completion = raw.parse()
            assert completion.choices[0].message.content == "t0 t1 t2 t3 "
            assert completion.usage is not None and completion.usage.completion_tokens == 4

            chunks = [
                c
                async for c in await client.chat.completions.create(
                    model="chat-model",
                    messages=[{"role": "user", "content": "hi"}],
                    stream=True,
                    stream_options={"include_usage": True},
                )
            ]
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text == "t0 t1 t2 t3 "
            # include_usage: the last chunk has no choices and carries the usage.
            assert chunks[-1].choices == [] and chunks[-1].usage is not None
            assert chunks[-1].usage.total_tokens == 7
            plain = [
                c
                async for c in await client.chat.completions.create(
                    model="chat-model", messages=[{"role": "user", "content": "hi"}], stream=True
                )
            ]
            assert all(c.usage is None for c in plain) and len(plain) == len(chunks) - 1

            done = await client.completions.create(model="chat-model", prompt="once upon", max_tokens=4)
            assert done.choices[0].text == "t0 t1 t2 t3 "
            streamed = [
                c
                async for c in await client.completions.create(
                    model="chat-model", prompt="once upon", max_tokens=4, stream=True
                )
            ]
            assert "".join(c.choices[0].text for c in streamed) == "t0 t1 t2 t3 "

            embeddings = await client.embeddings.with_raw_response.create(model="embed-model", input=["ab", "abcd"])
            assert embeddings.headers["x-forge-pool"] == "embed"
            assert embeddings.headers["x-forge-class"] == "embeddings"
            vectors = [d.embedding for d in embeddings.parse().data]
            # Asked as base64 by the client and decoded by it: the bytes crossed the router unchanged.
            assert vectors == [[2.0, 0.5, -0.25, 0.0], [4.0, 0.5, -0.25, 1.0]]

            response = await client.responses.create(model="chat-model", input="hi", max_output_tokens=4)
            assert response.output_text == "t0 t1 t2 t3 " and response.status == "completed"
            events = [e async for e in await client.responses.create(model="chat-model", input="hi", stream=True)]
            assert [e.type for e in events][:2] == ["response.created", "response.in_progress"]
            assert events[-1].type == "response.completed"
            deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
            assert "".join(deltas) == "t0 t1 t2 t3 "

            audio = b"RIFF" + bytes(range(256)) * 64
            transcript = await client.audio.transcriptions.create(
                model="asr-model", file=("hello.wav", audio, "audio/wav")
            )
            assert transcript.text.startswith(f"{len(audio)} bytes sha256 ")

            # Each request reached a replica serving its model, on the path it was sent to.
            assert {(s.path, s.model) for s in stack.chat.seen} == {
                ("/v1/chat/completions", "chat-model"),
                ("/v1/completions", "chat-model"),
                ("/v1/responses", "chat-model"),
            }
            assert {(s.path, s.model) for s in stack.embed.seen} == {("/v1/embeddings", "embed-model")}
            assert [(s.path, s.model, s.upload_bytes) for s in stack.asr.seen] == [
                ("/v1/audio/transcriptions", "asr-model", len(audio))
            ]
            async with aiohttp.ClientSession() as s, s.get(f"{stack.router.url}/metrics") as resp:
                text = await resp.text()
            assert metric(text, 'forge_router_requests_total{class="embeddings",pool="embed"}') == 1
            assert metric(text, 'forge_router_requests_total{class="transcription",pool="asr"}') == 1
            assert metric(text, 'forge_router_requests_total{class="interactive",pool="chat"}') == 7
            # Generation classes stay generation: no embedding was counted as one.
            assert metric(text, 'forge_router_requests_total{class="interactive",pool="embed"}') == 0

    run(body(), timeout=60)


def test_errors_reach_the_client_with_their_status_and_an_unserved_model_is_a_404_naming_the_served() -> None:
    async def body() -> None:
        async with three_models() as stack:
            client = stack.client
            # The replica's own 400 and 404 pass through with their status and message.
            with pytest.raises(openai.BadRequestError) as bad:
                await client.chat.completions.create(
                    model="chat-model", messages=[{"role": "user", "content": "hi"}], max_tokens=100_000
                )
            assert bad.value.status_code == 400 and "'max_tokens' is too large" in bad.value.message
            with pytest.raises(openai.BadRequestError):
                await client.chat.completions.create(
                    model="chat-model", messages=[{"role": "user", "content": "hi"}], max_tokens=100_000, stream=True
                )
            with pytest.raises(openai.NotFoundError) as gone:
                await client.responses.create(model="chat-model", input="hi", previous_response_id="resp_old")
            assert gone.value.status_code == 404 and "resp_old" in gone.value.message
            # A model no pool serves: the router's own 404, in OpenAI's shape, naming what is served.
            with pytest.raises(openai.NotFoundError) as unknown:
                await client.embeddings.create(model="no-such-model", input="x")
            error = unknown.value.body
            assert isinstance(error, dict)
            assert error["type"] == "model_not_found" and error["param"] == "model"
            assert error["served_models"] == ["asr-model", "chat-model", "embed-model"]
            assert "no-such-model" in unknown.value.message and "embed-model" in unknown.value.message
            # The router's own 400 (a body it cannot route), before any replica is asked.
            with pytest.raises(openai.BadRequestError) as malformed:
                await client.chat.completions.create(model="chat-model", messages=[])
            assert "messages" in malformed.value.message
            with pytest.raises(openai.AuthenticationError):
                await openai.AsyncOpenAI(
                    base_url=f"{stack.router.url}/v1", api_key="wrong", max_retries=0
                ).embeddings.create(model="embed-model", input="x")
            assert stack.embed.seen == []

    run(body(), timeout=60)


def test_vllm_own_paths_go_through_over_plain_http_with_the_key() -> None:
    async def body() -> None:
        async with three_models() as stack:
            url = stack.router.url
            async with aiohttp.ClientSession(headers=stack.headers()) as s:
                calls: list[tuple[str, dict[str, Any], str]] = [
                    ("/tokenize", {"model": "embed-model", "prompt": "abc"}, "embed"),
                    ("/detokenize", {"model": "chat-model", "tokens": [0, 1, 2]}, "chat"),
                    ("/score", {"model": "embed-model", "text_1": "q", "text_2": ["a", "b"]}, "embed"),
                    ("/v1/score", {"model": "embed-model", "text_1": "q", "text_2": ["a"]}, "embed"),
                    ("/rerank", {"model": "embed-model", "query": "q", "documents": ["a", "b", "c"]}, "embed"),
                    ("/v1/rerank", {"model": "embed-model", "query": "q", "documents": ["a"]}, "embed"),
                    # No model: the default pool (the first), as vLLM's own tokenize allows.
                    ("/tokenize", {"prompt": "xyz"}, "chat"),
                ]
                for path, request, pool in calls:
                    async with s.post(f"{url}{path}", json=request) as resp:
                        assert resp.status == 200, (path, await resp.text())
                        assert resp.headers["x-forge-pool"] == pool, path
                        answer = await resp.json()
                    if path == "/tokenize":
                        assert answer["count"] == 3 and len(answer["tokens"]) == 3
                    elif path == "/detokenize":
                        assert answer["prompt"] == "abc"
                    elif "score" in path:
                        assert [d["score"] for d in answer["data"]] == [1.0, 0.5][: len(request["text_2"])]
                    else:
                        assert len(answer["results"]) == len(request["documents"])
                async with s.get(f"{url}/version") as resp:
                    assert resp.status == 200 and await resp.json() == {"version": VERSION}
                    assert resp.headers["x-forge-pool"] == "chat"
                async with s.get(f"{url}/v1/models") as resp:
                    assert sorted(m["id"] for m in (await resp.json())["data"]) == [
                        "asr-model",
                        "chat-model",
                        "embed-model",
                    ]
                # A transcription streamed (its form's stream field) stays a stream, ending with [DONE].
                form = aiohttp.FormData()
                form.add_field("model", "asr-model")
                form.add_field("stream", "true")
                form.add_field("file", b"\x00" * 1000, filename="a.wav", content_type="audio/wav")
                async with s.post(f"{url}/v1/audio/transcriptions", data=form) as resp:
                    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
                    events = sse_data(await resp.read())
                assert events[-1] == "[DONE]"
                words = "".join(json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1])
                assert words.startswith("1000 bytes sha256 ")
                # Every routed path and /version want the key; /health and /metrics do not.
            async with aiohttp.ClientSession() as s:
                for path in ("/tokenize", "/v1/score", "/rerank", "/v1/embeddings", "/v1/audio/transcriptions"):
                    async with s.post(f"{url}{path}", json={}) as resp:
                        assert resp.status == 401, path
                async with s.get(f"{url}/version") as resp:
                    assert resp.status == 401
                async with s.get(f"{url}/health") as resp:
                    assert resp.status == 200
                # A path neither served nor relayed: today's 404, listing what is.
                async with s.post(f"{url}/v1/moderations", json={}) as resp:
                    assert resp.status == 404
                    message = (await resp.json())["error"]["message"]
                assert "/v1/moderations" in message and "/tokenize" in message and "/v1/audio/transcriptions" in message
                async with s.get(f"{url}/tokenize") as resp:
                    assert resp.status == 405

    run(body(), timeout=60)


def test_a_responses_stream_ends_with_its_message_and_one_cut_mid_event_ends_with_an_error_event() -> None:
    """vLLM's Responses API sends no data: [DONE]: its stream is whole when its HTTP message ends between events."""
    whole = b'event: response.created\ndata: {"type": "response.created"}\n\n'
    whole += b'event: response.completed\ndata: {"type": "response.completed"}\n\n'

    async def body() -> None:
        replica = await FakeReplica(Behavior(raw_stream=whole)).start()
        router = await start_router(router_config({"p": [replica.url]}))
        request = {"model": "m", "input": "hi", "stream": True}
        try:
            async with aiohttp.ClientSession() as s:
                async with s.post(f"{router.url}/v1/responses", json=request) as resp:
                    assert resp.status == 200
                    assert await resp.read() == whole
                replica.behavior.raw_stream = whole[:-20]
                async with s.post(f"{router.url}/v1/responses", json=request) as resp:
                    events = sse_data(await resp.read())
            assert events[0] == '{"type": "response.created"}'
            error = json.loads(events[1])["error"]
            assert error["type"] == "upstream_error" and "mid-event" in error["message"]
            assert events[-1] == "[DONE]"
            errors = router.router.metrics.errors
            assert errors.value({"class": "interactive", "pool": "p", "kind": "upstream_error"}) == 1
        finally:
            await router.stop()
            await replica.stop()

    run(body())
