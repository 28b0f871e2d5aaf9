"""The llama-cpp image's test stage: llama-server runs as built, the runtime carries no compilers, and the server
serves a Forge-written GGUF: /v1/models lists it and a streamed chat completion arrives as SSE chunks."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import requests

from builders.container import Engine, RunSpec
from builders.engines.checks import CheckResult, check_no_compilers, free_port, server_log_excerpt, streamed_chat
from builders.plan import BuildPlan

SERVED_NAME = "tiny"
# A 2-layer, 64-wide model loads in well under a second; the rest of the budget is a loaded CI machine.
SERVE_DEADLINE_S = 120


def run(engine: Engine, image: str, plan: BuildPlan) -> list[CheckResult]:
    results = [check_version(engine, image)]
    if not results[0].ok:
        return results
    if "no-compilers" in plan.test_checks:
        results.append(check_no_compilers(engine, image))
    if "serve-gguf" in plan.test_checks:
        results.append(check_serve(engine, image, plan))
    return results


def check_version(engine: Engine, image: str) -> CheckResult:
    start = time.monotonic()
    rc, out = engine.run_once(RunSpec(image=image, command=["--version"], network_host=False), timeout=60)
    lines = [ln for ln in out.strip().splitlines() if ln.startswith("version") or "built with" in ln]
    return CheckResult(
        name="llama-server-version",
        ok=rc == 0 and bool(lines),
        detail="; ".join(lines) if rc == 0 and lines else out[-800:],
        seconds=time.monotonic() - start,
    )


def check_serve(engine: Engine, image: str, plan: BuildPlan) -> CheckResult:
    from builders.engines.llama_cpp.gguf_model import write_tiny_gguf

    start = time.monotonic()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="forge-tiny-gguf-") as tmp:
        model = write_tiny_gguf(Path(tmp) / "tiny.gguf")
        Path(tmp).chmod(0o755)
        model.chmod(0o644)
        cid = engine.run_detached(
            RunSpec(
                image=image,
                command=[
                    *("-m", "/model/tiny.gguf", "--host", "127.0.0.1", "--port", str(port), "--alias", SERVED_NAME),
                    *("-c", "1024", "-np", "2", "-t", "2"),
                ],
                volumes={tmp: "/model"},
                labels={"forge.test": plan.session_id},
            )
        )
        base = f"http://127.0.0.1:{port}"
        try:
            # llama-server answers /health with 503 while it loads the model, then 200.
            deadline, loading = time.monotonic() + SERVE_DEADLINE_S, 0
            while True:
                if not engine.is_running(cid):
                    return _failed(start, "llama-server exited:\n" + server_log_excerpt(engine, cid))
                if time.monotonic() > deadline:
                    return _failed(
                        start, f"/health not 200 within {SERVE_DEADLINE_S}s:\n" + server_log_excerpt(engine, cid)
                    )
                try:
                    status = requests.get(f"{base}/health", timeout=2).status_code
                except requests.RequestException:
                    status = 0
                if status == 200:
                    break
                loading += status == 503
                time.sleep(0.5)
            ids = [m["id"] for m in requests.get(f"{base}/v1/models", timeout=10).json().get("data", [])]
            if SERVED_NAME not in ids:
                return _failed(start, f"/v1/models -> {ids}, without {SERVED_NAME!r}")
            chunks, finish = streamed_chat(base, SERVED_NAME)
        except (requests.RequestException, ValueError) as exc:
            return _failed(start, f"{exc}\n" + server_log_excerpt(engine, cid))
        finally:
            engine.stop_and_remove(cid)
    ok = chunks > 0
    detail = (
        f"/v1/models -> {ids}; streamed chat: {chunks} content chunks, finish_reason {finish or '?'}"
        f" (/health answered 503 {loading}x while loading)"
    )
    return CheckResult(name="serve-gguf", ok=ok, detail=detail, seconds=time.monotonic() - start)


def _failed(start: float, detail: str) -> CheckResult:
    return CheckResult(name="serve-gguf", ok=False, detail=detail, seconds=time.monotonic() - start)
