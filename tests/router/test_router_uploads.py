"""Multipart uploads (audio transcriptions) through the router: relayed as they arrive, never held whole, bounded in
size (413 naming the limit) and time (408), and routed by the `model` field that precedes the file."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest
from router_fakes import router_config, run, start_router_process
from vllm_fakes import VllmReplica

from builders.router import start_router
from builders.router.uploads import SNIFF_BYTES, form_model, multipart_boundary

MB = 1_000_000


def form(fields: list[tuple[str, str]], file: bytes, boundary: str = "b0und") -> bytes:
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode() for k, v in fields]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n".encode()
        + file
        + b"\r\n"
    )
    return b"".join(parts) + f"--{boundary}--\r\n".encode()


def test_the_model_field_is_found_before_the_file_and_only_there() -> None:
    assert multipart_boundary("multipart/form-data; boundary=b0und") == b"b0und"
    assert multipart_boundary('multipart/form-data; boundary="a b"') == b"a b"
    assert multipart_boundary("application/json") is None
    assert multipart_boundary("multipart/form-data") is None
    body = form([("language", "en"), ("model", "asr-model")], b"\x00" * 100)
    assert form_model(body, b"b0und") == (True, "asr-model")
    # Every cut of the body before the model's value ends says "not decided yet", never a wrong model.
    end = body.index(b"asr-model") + len(b"asr-model\r\n--b0und")
    for cut in range(end - 1):
        assert form_model(body[:cut], b"b0und") == (False, None), cut
    # The file first: what follows it is not read to route, so the request has no model (the default pool).
    assert form_model(form([], b"\x00" * 10) + b"", b"b0und") == (True, None)
    late = form([], b"x").replace(
        b"--b0und--", b'--b0und\r\nContent-Disposition: form-data; name="model"\r\n\r\nm\r\n--b0und--'
    )
    assert form_model(late, b"b0und") == (True, None)
    # A field whose name merely ends in "model", or a filename parameter, is not the model.
    assert form_model(form([("submodel", "x"), ("model", "y")], b""), b"b0und") == (True, "y")


def test_a_50_mb_upload_passes_with_the_router_s_memory_bounded_and_one_over_the_limit_gets_a_413(
    tmp_path: Path,
) -> None:
    """The router runs as its own process, so its RSS is its own: sampled every 5 ms while 50 MB go through."""
    limit = 60 * MB

    async def body() -> None:
        replica = await VllmReplica(models=("asr-model",)).start()
        router = await start_router_process(
            tmp_path, {"pools": {"asr": [replica.url]}, "default_pool": "asr", "max_request_bytes": limit}
        )
        client = openai.AsyncOpenAI(base_url=f"{router.url}/v1", api_key="none", max_retries=0, timeout=120)
        try:
            small = os.urandom(64 * 1024)
            await client.audio.transcriptions.create(model="asr-model", file=("warm.wav", small, "audio/wav"))
            baseline = router.rss_bytes()
            peak = baseline
            audio = os.urandom(50 * MB)
            sending = asyncio.create_task(
                client.audio.transcriptions.create(model="asr-model", file=("big.wav", audio, "audio/wav"))
            )
            while not sending.done():
                peak = max(peak, router.rss_bytes())
                await asyncio.sleep(0.005)
            transcript = await sending
            print(f"router RSS {baseline / 2**20:.1f} MiB before, {peak / 2**20:.1f} MiB at peak for a 50 MB upload")
            assert transcript.text == f"{len(audio)} bytes sha256 {hashlib.sha256(audio).hexdigest()}"
            assert replica.seen[-1].upload_bytes == len(audio)
            # A quarter of the upload, at most: the body went through, not into the router.
            assert peak - baseline < 12 * 2**20, (baseline, peak)

            with pytest.raises(openai.APIStatusError) as refused:
                await client.audio.transcriptions.create(
                    model="asr-model", file=("huge.wav", os.urandom(limit + MB), "audio/wav")
                )
            assert refused.value.status_code == 413
            assert f"over {limit} bytes (max_request_bytes)" in refused.value.message
            assert len(replica.seen) == 2  # the oversized upload never reached the replica
        finally:
            await router.stop()
            await replica.stop()

    run(body(), timeout=120)


async def chunks(total: int, piece: int = 256 * 1024) -> AsyncIterator[bytes]:
    sent = 0
    while sent < total:
        n = min(piece, total - sent)
        yield b"\x01" * n
        sent += n


def test_a_chunked_upload_is_cut_at_the_limit_with_a_413_and_its_replica_sees_it_end() -> None:
    """No Content-Length: the router counts as it relays, and the replica's upload stops where the limit is."""

    async def body() -> None:
        replica = await VllmReplica(models=("asr-model",)).start()
        router = await start_router(router_config({"asr": [replica.url]}, max_request_bytes=2 * MB))
        try:
            head = form([("model", "asr-model")], b"").split(b'--b0und\r\nContent-Disposition: form-data; name="file"')[
                0
            ]

            async def payload() -> AsyncIterator[bytes]:
                yield head + b'--b0und\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
                async for chunk in chunks(5 * MB):
                    yield chunk

            async with (
                aiohttp.ClientSession() as s,
                s.post(
                    f"{router.url}/v1/audio/transcriptions",
                    data=payload(),
                    headers={"Content-Type": "multipart/form-data; boundary=b0und"},
                ) as resp,
            ):
                assert resp.status == 413
                assert "over 2000000 bytes" in (await resp.json())["error"]["message"]
            assert router.router.metrics.upstream_aborts.value({"class": "transcription", "pool": "asr"}) == 1
        finally:
            await router.stop()
            await replica.stop()

    run(body(), timeout=60)


def test_an_upload_that_stops_arriving_gets_a_408_and_its_connection_closed() -> None:
    async def body() -> None:
        replica = await VllmReplica(models=("asr-model",)).start()
        router = await start_router(router_config({"asr": [replica.url]}, body_timeout_s=0.5))
        try:
            host, port = router.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            start = form([("model", "asr-model")], b"\x00" * 1000)[:-200]
            writer.write(
                b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: multipart/form-data; boundary=b0und\r\n"
                + f"Content-Length: {len(start) + 5000}\r\n\r\n".encode()
                + start
            )
            answer = await asyncio.wait_for(reader.read(), 5)
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
            assert b"did not arrive within the body timeout" in answer
            writer.close()
        finally:
            await router.stop()
            await replica.stop()

    run(body(), timeout=30)


def test_an_upload_fails_over_while_its_body_is_whole_in_the_router() -> None:
    """A replica healthy at its last check that refuses the connection now: the upload, still whole here (it fits in
    the part read to route it), goes to the next replica of the pool."""

    async def body() -> None:
        gone = await VllmReplica(models=("asr-model",)).start()
        replica = await VllmReplica(models=("asr-model",)).start()
        router = await start_router(router_config({"asr": [gone.url, replica.url]}, health_interval_s=600))
        try:
            await router.router.health.check_all()
            await gone.stop()
            client = openai.AsyncOpenAI(base_url=f"{router.url}/v1", api_key="none", max_retries=0)
            audio = b"\x02" * (SNIFF_BYTES // 4)
            raw = await client.audio.transcriptions.with_raw_response.create(
                model="asr-model", file=("a.wav", audio, "audio/wav")
            )
            assert raw.headers["x-forge-replica"] == replica.url
            assert raw.parse().text.startswith(f"{len(audio)} bytes")
            assert router.router.metrics.failovers.value({"class": "transcription", "pool": "asr"}) == 1
        finally:
            await router.stop()
            await replica.stop()

    run(body(), timeout=30)
