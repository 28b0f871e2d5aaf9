"""A fake replica that answers in vLLM's own shapes (vLLM 0.32's OpenAI server): chat and completions (streamed with
`include_usage`), responses (streamed as `event:`/`data:` pairs with no [DONE]), embeddings (floats or base64),
tokenize, detokenize, score, rerank, audio transcriptions (multipart, streamed or not), /version and vLLM's error
body. The OpenAI client parses what it gets, so these shapes are what make a client test mean something.

Each request is recorded with its path and model, so a test can say which replica served what.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from fake_servers import serve

VERSION = "0.32.0"


def error_body(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    """vLLM's ErrorResponse."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


@dataclass
class Seen:
    path: str
    model: str | None
    stream: bool = False
    upload_bytes: int = 0


@dataclass
class VllmReplica:
    models: tuple[str, ...]
    tokens: int = 4
    seen: list[Seen] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> VllmReplica:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/version", self._version)
        for path in ("/v1/chat/completions", "/v1/completions"):
            app.router.add_post(path, self._generate)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/detokenize", self._detokenize)
        for path in ("/score", "/v1/score"):
            app.router.add_post(path, self._score)
        for path in ("/rerank", "/v1/rerank"):
            app.router.add_post(path, self._rerank)
        app.router.add_post("/v1/audio/transcriptions", self._transcribe)
        self._runner, self.url = await serve(app)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def served(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]

    # --- helpers ------------------------------------------------------------------------------------------

    async def _body(self, request: web.Request) -> tuple[dict[str, Any], web.Response | None]:
        body = await request.json()
        model = body.get("model")
        self.seen.append(Seen(path=request.path, model=model, stream=bool(body.get("stream"))))
        if model is not None and model not in self.models:
            # vLLM's answer to a model it does not serve.
            return body, web.json_response(
                error_body(404, f"The model `{model}` does not exist.", "NotFoundError", "model"), status=404
            )
        return body, None

    def _model(self, body: dict[str, Any]) -> str:
        return str(body.get("model") or self.models[0])

    def _usage(self, prompt: int, completion: int) -> dict[str, Any]:
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": None,
        }

    # --- small endpoints ----------------------------------------------------------------------------------

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, _request: web.Request) -> web.Response:
        cards = [
            {
                "id": m,
                "object": "model",
                "created": 0,
                "owned_by": "vllm",
                "root": m,
                "parent": None,
                "max_model_len": 2048,
            }
            for m in self.models
        ]
        return web.json_response({"object": "list", "data": cards})

    async def _version(self, request: web.Request) -> web.Response:
        self.seen.append(Seen(path=request.path, model=None))
        return web.json_response({"version": VERSION})

    async def _tokenize(self, request: web.Request) -> web.Response:
        body, refused = await self._body(request)
        if refused is not None:
            return refused
        text = body.get("prompt")
        if not isinstance(text, str):
            return web.json_response(error_body(400, "prompt or messages is required", "BadRequestError"), status=400)
        tokens = [ord(c) % 1024 for c in text]
        return web.json_response({"count": len(tokens), "max_model_len": 2048, "tokens": tokens, "token_strs": None})

    async def _detokenize(self, request: web.Request) -> web.Response:
        body, refused = await self._body(request)
        if refused is not None:
            return refused
        return web.json_response({"prompt": "".join(chr(97 + t % 26) for t in body.get("tokens", []))})

    async def _score(self, request: web.Request) -> web.Response:
        body, refused = await self._body(request)
        if refused is not None:
            return refused
        items = body.get("text_2") or body.get("data_2") or body.get("queries") or [""]
        items = items if isinstance(items, list) else [items]
        data = [{"index": i, "object": "score", "score": 1.0 / (i + 1)} for i in range(len(items))]
        return web.json_response(
            {"id": "score-1", "object": "list", "created": int(time.time()), "model": self._model(body), "data": data}
            | {"usage": self._usage(len(items), 0)}
        )

    async def _rerank(self, request: web.Request) -> web.Response:
        body, refused = await self._body(request)
        if refused is not None:
            return refused
        documents = body.get("documents") or []
        results = [
            {"index": i, "document": {"text": d}, "relevance_score": 1.0 / (i + 1)} for i, d in enumerate(documents)
        ]
        return web.json_response(
            {
                "id": "rerank-1",
                "model": self._model(body),
                "usage": {"total_tokens": len(documents)},
                "results": results,
            }
        )

    async def _embeddings(self, request: web.Request) -> web.Response:
        body, refused = await self._body(request)
        if refused is not None:
            return refused
        given = body.get("input")
        inputs = given if isinstance(given, list) else [given]
        data = []
        for i, text in enumerate(inputs):
            vector = [float(len(str(text))), 0.5, -0.25, float(i)]
            if body.get("encoding_format") == "base64":
                # The OpenAI client asks for base64 unless told otherwise: little-endian float32, as vLLM sends.
                embedding: Any = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            else:
                embedding = vector
            data.append({"index": i, "object": "embedding", "embedding": embedding})
        return web.json_response(
            {
                "id": "embd-1",
                "object": "list",
                "created": int(time.time()),
                "model": self._model(body),
                "data": data,
                "usage": self._usage(len(inputs), 0),
            }
        )

    # --- generation ---------------------------------------------------------------------------------------

    def _completion_chunk(self, chat: bool, model: str, text: str | None, finish: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        if chat:
            choice["delta"] = {"role": "assistant", "content": ""} if text is None else {"content": text}
        else:
            choice["text"] = text or ""
        kind = "chat.completion.chunk" if chat else "text_completion"
        return {"id": "cmpl-1", "object": kind, "created": int(time.time()), "model": model, "choices": [choice]}

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body, refused = await self._body(request)
        if refused is not None:
            return refused
        chat = request.path.endswith("/chat/completions")
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or self.tokens
        if max_tokens > 2048:
            message = f"'max_tokens' is too large: {max_tokens}. This model's maximum context length is 2048 tokens."
            return web.json_response(error_body(400, message, "BadRequestError", "max_tokens"), status=400)
        model = self._model(body)
        words = [f"t{i} " for i in range(min(max_tokens, self.tokens))]
        if not body.get("stream"):
            text = "".join(words)
            choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length", "stop_reason": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": text, "refusal": None, "tool_calls": []}
            else:
                choice["text"] = text
            return web.json_response(
                {
                    "id": "cmpl-1",
                    "object": "chat.completion" if chat else "text_completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [choice],
                    "usage": self._usage(3, len(words)),
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        events: list[dict[str, Any]] = [self._completion_chunk(chat, model, None, None)] if chat else []
        events += [self._completion_chunk(chat, model, w, None) for w in words]
        events.append(self._completion_chunk(chat, model, "", "length"))
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            usage = self._completion_chunk(chat, model, "", None) | {"choices": [], "usage": self._usage(3, len(words))}
            events.append(usage)
        for event in events:
            await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _response(self, model: str, text: str, status: str) -> dict[str, Any]:
        content: list[dict[str, Any]] = (
            [{"type": "output_text", "text": text, "annotations": [], "logprobs": None}] if text else []
        )
        return {
            "id": "resp_1",
            "object": "response",
            "created_at": int(time.time()),
            "model": model,
            "status": status,
            "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": status, "content": content}],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": 3,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": self.tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 3 + self.tokens,
            },
        }

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body, refused = await self._body(request)
        if refused is not None:
            return refused
        if body.get("previous_response_id"):
            # What vLLM answers for a response it does not have stored.
            message = f"Response with id '{body['previous_response_id']}' not found."
            return web.json_response(error_body(404, message, "NotFoundError"), status=404)
        model = self._model(body)
        words = [f"t{i} " for i in range(self.tokens)]
        if not body.get("stream"):
            return web.json_response(self._response(model, "".join(words), "completed"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        sequence = 0

        async def send(kind: str, payload: dict[str, Any]) -> None:
            nonlocal sequence
            event = {"type": kind, "sequence_number": sequence, **payload}
            sequence += 1
            await resp.write(f"event: {kind}\ndata: {json.dumps(event)}\n\n".encode())

        item = {"item_id": "msg_1", "output_index": 0}
        await send("response.created", {"response": self._response(model, "", "in_progress")})
        await send("response.in_progress", {"response": self._response(model, "", "in_progress")})
        for word in words:
            await send("response.output_text.delta", {**item, "content_index": 0, "delta": word, "logprobs": []})
        await send("response.output_text.done", {**item, "content_index": 0, "text": "".join(words), "logprobs": []})
        await send("response.completed", {"response": self._response(model, "".join(words), "completed")})
        await resp.write_eof()
        return resp

    async def _transcribe(self, request: web.Request) -> web.StreamResponse:
        """Reads the multipart body part by part as it arrives (as Starlette does), hashing the file's bytes."""
        fields: dict[str, str] = {}
        digest = hashlib.sha256()
        size = 0
        reader = await request.multipart()
        async for part in reader:
            if not isinstance(part, aiohttp.BodyPartReader):
                continue
            if part.filename is None:
                fields[part.name or ""] = (await part.read()).decode()
                continue
            while chunk := await part.read_chunk(256 * 1024):
                digest.update(chunk)
                size += len(chunk)
        model = fields.get("model")
        stream = fields.get("stream") == "true"
        self.seen.append(Seen(path=request.path, model=model, stream=stream, upload_bytes=size))
        if model is not None and model not in self.models:
            return web.json_response(
                error_body(404, f"The model `{model}` does not exist.", "NotFoundError", "model"), status=404
            )
        text = f"{size} bytes sha256 {digest.hexdigest()}"
        if not stream:
            return web.json_response({"text": text, "usage": {"type": "duration", "seconds": 1}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in text.split(" "):
            event = {
                "id": "trsc-1",
                "object": "transcription.chunk",
                "created": int(time.time()),
                "model": model,
                "choices": [{"delta": {"content": word + " "}, "finish_reason": None, "stop_reason": None}],
            }
            await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            await asyncio.sleep(0)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
