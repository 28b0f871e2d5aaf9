"""Two models behind one router in a whole smoke run (profiles/two-models.yaml): a chat pool and an embedding pool,
the router routing by `model`, and the run's check that each model is reached through it. The replicas are the
stand-in `vllm` (fake_vllm.py, which serves embeddings only when started with --runner pooling, as vLLM does) and
the router a process of this checkout, so the run's own machinery is what is tested, in seconds."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fake_vllm import install
from smoke_helpers import ROOT, free_base_port
from smoke_runs import local_run

from builders.smoke.model_pools import reach_every_model, warm_up_requests
from builders.smoke.profile import load_profile, profile_from_mapping
from builders.smoke.stack import SmokeOptions


@pytest.mark.timeout(180)
def test_each_model_is_reached_through_the_router_and_the_embedding_pool_runs_as_one(tmp_path: Path) -> None:
    profile, path = load_profile("two-models", root=ROOT)
    assert profile.model_pools() == {"embed": "forge-tiny-embed"}
    options = SmokeOptions(
        profile=profile, profile_path=path, report_dir=tmp_path, base_port=free_base_port(profile.replica_count)
    )
    run = local_run(options, install(tmp_path))
    report = json.loads(run.execute().to_json())
    assert report["gates"] == {"passed": True, "failures": []}, report["gates"]
    models = report["checks"]["models"]
    assert models["passed"] is True
    assert models["models"]["forge-tiny"] | {"status": 200, "pool": "chat"} == models["models"]["forge-tiny"]
    assert models["models"]["forge-tiny-embed"]["path"] == "/v1/embeddings"
    assert models["models"]["forge-tiny-embed"]["pool"] == "embed"
    # The chat traffic never touched the embedding pool: every class was served by the chat pool.
    assert {row["pool"] for row in report["traffic"]["main"]["classes"].values()} == {"chat"}
    assert report["teardown"]["clean"] is True


def test_an_embed_pool_warms_up_with_an_embedding_and_a_chat_pool_with_a_chat_turn_and_a_long_completion() -> None:
    profile = load_profile("two-models", root=ROOT)[0]
    half_context = " the" * (profile.model.max_model_len // 2)
    [(path, body)] = warm_up_requests(profile, "embed")
    assert (path, body) == ("/v1/embeddings", {"model": "forge-tiny-embed", "input": half_context})
    chat, completion = warm_up_requests(profile, "chat")
    assert chat[0] == "/v1/chat/completions"
    assert chat[1]["model"] == "forge-tiny" and chat[1]["messages"] == [{"role": "user", "content": "hi"}]
    assert completion == ("/v1/completions", {"model": "forge-tiny", "max_tokens": 8, "prompt": half_context})


class _WrongPool(BaseHTTPRequestHandler):
    """A router that answers every request from the chat pool, whatever its model: what the check must catch."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        status = 404 if self.path == "/v1/embeddings" else 200
        body = json.dumps({"object": "list", "data": []}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("x-forge-pool", "chat")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.mark.parametrize("embed_task", ["embed", "generate"])
def test_the_model_check_fails_naming_a_model_answered_badly_or_by_the_wrong_pool(embed_task: str) -> None:
    data = load_profile("two-models", root=ROOT)[0].model_dump(mode="json", exclude={"name"})
    data["pools"]["embed"]["task"] = embed_task
    profile = profile_from_mapping(data, source="test", name="two-models")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _WrongPool)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        check = reach_every_model(profile, url, "key", timeout_s=5)
    finally:
        server.shutdown()
    assert check.passed is False
    assert check.models["forge-tiny"].pool == "chat"
    [failure] = check.failures
    if embed_task == "embed":
        assert failure.startswith("forge-tiny-embed: /v1/embeddings through the router answered 404")
    else:
        assert failure == "forge-tiny-embed: answered by pool 'chat', which does not serve it (served by: embed)"
