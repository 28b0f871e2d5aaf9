"""The test stage: checks run in the image just built, before it is tagged.

Each check is a real process in a throwaway container: vLLM imported, its version, tcmalloc mapped into a
running Python (not only named in LD_PRELOAD), and `vllm serve` answering /v1/models with a tiny model.
"""

from __future__ import annotations

import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from builders.engine import Engine
from builders.plan import BuildPlan

SERVE_DEADLINE_S = 420


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    name: str
    ok: bool
    detail: str
    seconds: float


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _python(engine: Engine, image: str, code: str, timeout: float = 300) -> tuple[int, str]:
    return engine.run_once(image, ["-c", code], entrypoint=["python3"], timeout=timeout)


def check_import(engine: Engine, image: str, plan: BuildPlan) -> CheckResult:
    start = time.monotonic()
    rc, out = _python(engine, image, "import vllm, torch; print('VERSIONS', vllm.__version__, torch.__version__)")
    line = next((ln for ln in out.splitlines() if ln.startswith("VERSIONS ")), "")
    ok = rc == 0 and bool(line)
    return CheckResult(
        name="import-vllm",
        ok=ok,
        detail=line.removeprefix("VERSIONS ") if ok else out[-800:],
        seconds=time.monotonic() - start,
    )


def check_version(import_result: CheckResult, plan: BuildPlan) -> CheckResult:
    version = import_result.detail.split()[0] if import_result.ok else ""
    expected = plan.vllm_version or ""
    ok = import_result.ok and (not expected or version.startswith(expected))
    return CheckResult(
        name="vllm-version", ok=ok, detail=f"{version or '?'} (expected {expected or 'any'})", seconds=0.0
    )


def check_tcmalloc(engine: Engine, image: str, plan: BuildPlan) -> CheckResult:
    start = time.monotonic()
    code = "print('MAPPED', [l.split()[-1] for l in open('/proc/self/maps') if 'tcmalloc' in l][:1])"
    rc, out = _python(engine, image, code)
    line = next((ln for ln in out.splitlines() if ln.startswith("MAPPED ")), "MAPPED []")
    ok = rc == 0 and "tcmalloc" in line
    return CheckResult(
        name="tcmalloc-mapped",
        ok=ok,
        detail=line.removeprefix("MAPPED ") if ok else out[-800:],
        seconds=time.monotonic() - start,
    )


def check_serve(engine: Engine, image: str, plan: BuildPlan) -> CheckResult:
    from builders.smoke.tiny_model import write_tiny_model

    start = time.monotonic()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="forge-tiny-model-") as tmp:
        model = write_tiny_model(Path(tmp) / "model")
        model.chmod(0o755)
        for child in model.iterdir():
            child.chmod(0o644)
        Path(tmp).chmod(0o755)
        cid = engine.run_detached(
            image=image,
            command=[
                "/model",
                "--load-format",
                "dummy",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--max-model-len",
                "512",
                "--max-num-seqs",
                "4",
                "--served-model-name",
                "tiny",
                "--dtype",
                "float32",
            ],
            volumes={str(model): "/model"},
            env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"},
            shm_size="2g",
            labels={"forge.test": plan.session_id},
        )
        try:
            deadline = time.monotonic() + SERVE_DEADLINE_S
            while time.monotonic() < deadline:
                if not engine.is_running(cid):
                    return CheckResult(
                        name="serve-models",
                        ok=False,
                        seconds=time.monotonic() - start,
                        detail="vllm serve exited:\n" + engine.logs(cid, tail=40),
                    )
                try:
                    resp = requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                    if resp.status_code == 200:
                        ids = [m["id"] for m in resp.json().get("data", [])]
                        return CheckResult(
                            name="serve-models",
                            ok="tiny" in ids,
                            seconds=time.monotonic() - start,
                            detail=f"/v1/models -> {ids}",
                        )
                except requests.RequestException:
                    pass
                time.sleep(2)
            return CheckResult(
                name="serve-models",
                ok=False,
                seconds=time.monotonic() - start,
                detail=f"no answer within {SERVE_DEADLINE_S}s:\n" + engine.logs(cid, tail=40),
            )
        finally:
            engine.stop_and_remove(cid)


def check_entrypoint(engine: Engine, image: str, plan: BuildPlan) -> CheckResult:
    start = time.monotonic()
    rc, out = engine.run_once(image, ["--help"], timeout=60)
    return CheckResult(
        name="entrypoint-help",
        ok=rc == 0,
        detail=out.strip().splitlines()[0] if out.strip() else "",
        seconds=time.monotonic() - start,
    )


def run_checks(engine: Engine, image: str, plan: BuildPlan) -> list[CheckResult]:
    results: list[CheckResult] = []
    if "entrypoint-help" in plan.test_checks:
        results.append(check_entrypoint(engine, image, plan))
    if "import-vllm" in plan.test_checks:
        imported = check_import(engine, image, plan)
        results += [imported, check_version(imported, plan)]
        if not imported.ok:
            return results
    if "tcmalloc-mapped" in plan.test_checks:
        results.append(check_tcmalloc(engine, image, plan))
    if "serve-models" in plan.test_checks:
        results.append(check_serve(engine, image, plan))
    return results
