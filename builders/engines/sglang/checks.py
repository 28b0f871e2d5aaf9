"""The SGLang CPU image's test stage: sgl-kernel's CPU ops are registered with torch (counted, and the one SGLang's
AMX backend looks for is among them), the runtime carries no compilers, and SGLang's server serves a tiny random
Llama: /v1/models lists it and a streamed chat completion arrives as SSE chunks ending in `data: [DONE]`."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import requests

from builders.container import Engine, RunSpec
from builders.engines.checks import (
    CheckDataEntry,
    CheckResult,
    check_no_compilers,
    free_port,
    server_log_excerpt,
    streamed_chat,
)
from builders.plan import BuildPlan

CPU_CHECKS = ("kernel-ops", "no-compilers", "serve-tiny")
SERVED_NAME = "tiny"
# SGLang's CPU backend decides whether to use sgl-kernel's AMX paths by this op's presence
# (sglang/srt/utils/common.py: is_intel_amx_backend_available).
AMX_BACKEND_OP = "convert_weight_packed"
# Start-up imports torch and SGLang in two processes (the tokenizer manager and the scheduler) and packs the
# weights for AMX; on a loaded 2-core machine that has taken minutes, not seconds.
SERVE_DEADLINE_S = 600
MARKER = "FORGE-KERNELS "

# Run in the image: what torch knows of the sgl_kernel namespace once the package is imported, and whether
# SGLang itself then takes its AMX backend. Schemas, not attributes: torch.ops resolves names lazily.
KERNEL_PROBE = f"""
import json, torch, sgl_kernel
names = sorted({{s.name.split("::", 1)[1] for s in torch._C._jit_get_all_schemas() if s.name.startswith("sgl_kernel::")}})
from sglang.srt.utils.common import cpu_has_amx_support
print({MARKER!r} + json.dumps({{
    "torch": torch.__version__,
    "ops": names,
    "amx_tile": bool(torch._C._cpu._is_amx_tile_supported()),
    "sglang_amx_backend": bool(cpu_has_amx_support()),
}}))
"""


def run(engine: Engine, image: str, plan: BuildPlan) -> list[CheckResult]:
    results = [check_kernel_ops(engine, image)]
    if not results[0].ok:
        return results
    if "no-compilers" in plan.test_checks:
        results.append(check_no_compilers(engine, image))
    if "serve-tiny" in plan.test_checks:
        results.append(check_serve(engine, image, plan))
    return results


def parse_kernel_probe(rc: int, out: str) -> tuple[bool, str, CheckDataEntry | None]:
    """Judge KERNEL_PROBE's output: (ok, detail, data: the ops' names, kept in the report). Ok needs the ops
    registered, SGLang's AMX op among them."""
    line = next((ln for ln in reversed(out.splitlines()) if ln.startswith(MARKER)), None)
    if rc != 0 or line is None:
        return False, f"exit {rc}: " + (out.strip()[-1200:] or "(no output)"), None
    try:
        data = json.loads(line.removeprefix(MARKER))
        ops = [str(op) for op in data["ops"]]
    except (ValueError, KeyError, TypeError) as exc:
        return False, f"unreadable probe output ({exc}): {line[:300]}", None
    missing = AMX_BACKEND_OP not in ops
    detail = (
        f"{len(ops)} ops registered under torch.ops.sgl_kernel (torch {data.get('torch')}); "
        f"{AMX_BACKEND_OP}: {'MISSING' if missing else 'present'}; AMX tiles: {data.get('amx_tile')}; "
        f"SGLang's intel_amx backend: {'on' if data.get('sglang_amx_backend') else 'off'}"
    )
    return bool(ops) and not missing, detail, {"ops": ops}


def check_kernel_ops(engine: Engine, image: str) -> CheckResult:
    start = time.monotonic()
    rc, out = engine.run_once(
        RunSpec(image=image, command=["-c", KERNEL_PROBE], entrypoint=["python3"], network_host=False), timeout=300
    )
    ok, detail, data = parse_kernel_probe(rc, out)
    return CheckResult(name="kernel-ops", ok=ok, detail=detail, seconds=time.monotonic() - start, data=data)


def serve_command(port: int, device: str = "cpu") -> list[str]:
    """SGLang's server on the tiny model: dummy weights (none are stored), and a KV pool bounded in tokens, since
    on CPU SGLang sizes it from the host's free memory otherwise."""
    return [
        *("--model-path", "/model", "--served-model-name", SERVED_NAME, "--load-format", "dummy"),
        *("--host", "127.0.0.1", "--port", str(port), "--device", device, "--dtype", "bfloat16"),
        *("--max-total-tokens", "4096", "--context-length", "1024", "--max-running-requests", "4"),
        "--skip-server-warmup",
    ]


def check_serve(engine: Engine, image: str, plan: BuildPlan, *, device: str = "cpu") -> CheckResult:
    """device cuda: the container is handed the host's GPUs (the GPU wheel image's serve-models-gpu)."""
    from builders.engines.tiny_model import ModelShape, write_tiny_model

    start = time.monotonic()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="forge-tiny-sglang-") as tmp:
        write_tiny_model(Path(tmp), max_position_embeddings=1024, shape=ModelShape(torch_dtype="bfloat16"))
        Path(tmp).chmod(0o755)
        for child in Path(tmp).iterdir():
            child.chmod(0o644)
        cid = engine.run_detached(
            RunSpec(
                image=image,
                command=serve_command(port, device),
                volumes={tmp: "/model"},
                gpus=device == "cuda",
                labels={"forge.test": plan.session_id},
            )
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + SERVE_DEADLINE_S
            while True:
                if not engine.is_running(cid):
                    return _failed(start, "the SGLang server exited:\n" + server_log_excerpt(engine, cid))
                if time.monotonic() > deadline:
                    return _failed(
                        start, f"/health not 200 within {SERVE_DEADLINE_S}s:\n" + server_log_excerpt(engine, cid)
                    )
                try:
                    if requests.get(f"{base}/health", timeout=2).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                time.sleep(1)
            ready = time.monotonic() - start
            ids = [m["id"] for m in requests.get(f"{base}/v1/models", timeout=10).json().get("data", [])]
            if SERVED_NAME not in ids:
                return _failed(start, f"/v1/models -> {ids}, without {SERVED_NAME!r}")
            chunks, finish = streamed_chat(base, SERVED_NAME, timeout=300)
        except (requests.RequestException, ValueError) as exc:
            return _failed(start, f"{exc}\n" + server_log_excerpt(engine, cid))
        finally:
            engine.stop_and_remove(cid)
    detail = (
        f"/v1/models -> {ids}; streamed chat: {chunks} content chunks, finish_reason {finish or '?'} "
        f"(healthy after {ready:.0f} s)"
    )
    return CheckResult(name="serve-tiny", ok=chunks > 0, detail=detail, seconds=time.monotonic() - start)


def _failed(start: float, detail: str) -> CheckResult:
    return CheckResult(name="serve-tiny", ok=False, detail=detail, seconds=time.monotonic() - start)
