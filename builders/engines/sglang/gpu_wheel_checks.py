"""The test stage of SGLang's GPU image from PyPI (gpu_wheel.py), run on the image just built, with or without a GPU.

Without a GPU it proves what it can and says what it did not: sglang imports with its torch; sgl_kernel imports, or
is "skipped: not passed" when the driver's libcuda.so.1 is all it lacks; cuobjdump reads the archs of sgl_kernel's
libraries and torch's CUDA ones, and SGLang's core kernels and torch must cover the recipe's arch_list; serving is
"skipped: no GPU" unless `nvidia-smi -L` on the build host lists one.

The core set is sgl_kernel's common_ops, both of its builds: sgl_kernel/load_utils.py loads sm90/common_ops on a
capability 9.0 GPU and sm100/common_ops on every other one, and every model runs through it (norms, activations,
rotary embedding, sampling, the KV cache's copies). sgl_kernel's other libraries (flash_ops, flashmla_ops,
infllm_ops, spatial_ops) are attention backends and model-specific ops that SGLang picks per GPU and model at start
up; they are read and recorded (`kernel-archs`), not gated, as vLLM's attention backends are.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import time

# pydantic reads a TypedDict's fields from typing_extensions' on Python 3.11.
from typing_extensions import TypedDict

from builders.container import Engine, RunSpec
from builders.engines.checks import CheckDataEntry, CheckResult, Cuobjdump, probe_line
from builders.engines.sglang import checks
from builders.gpu_archs import LibraryArchs, coverage_gaps, parse_listing
from builders.plan import BuildPlan

# sgl_kernel's libraries every model needs, by path without extension (sgl_kernel/sm90/common_ops.abi3.so).
CORE_KERNELS = ("sgl_kernel/sm90/common_ops", "sgl_kernel/sm100/common_ops")
# torch's own CUDA operators: SGLang calls them on every forward pass.
TORCH_CORE = "torch/lib/libtorch_cuda"
DRIVER_LIB = "libcuda.so.1"
DRIVER_SUPPLIER = (
    "the NVIDIA driver's libcuda.so.1, which the image must not carry: the NVIDIA Container Toolkit mounts the "
    "host's (docker run --gpus all, podman --device nvidia.com/gpu=all, Kubernetes' NVIDIA device plugin)"
)

# Run in the image: versions, and sgl_kernel's import error if any (its import loads common_ops).
IMPORT_PROBE = """
import importlib.metadata as md, json, torch, sglang
out = {'sglang': md.version('sglang'), 'sgl_kernel': md.version('sglang-kernel'), 'torch': torch.__version__,
       'cuda': torch.version.cuda, 'error': None}
try:
    import sgl_kernel
except Exception as exc:
    out['error'] = f'{type(exc).__name__}: {exc}'[-2000:]
print('SGLANG ' + json.dumps(out))
"""

# Run in the image: cuobjdump on sgl_kernel's libraries and torch's CUDA ones. One line per arch is kept of each
# listing (flash_ops alone lists 372 kernels per arch), in cuobjdump's own format, so the host parses it with the
# reader tested on captured output.
ARCHS_PROBE = """
import glob, json, os, subprocess, sysconfig
sp = sysconfig.get_paths()['purelib']
tools = glob.glob(os.path.join(sp, 'nvidia', '*', 'bin', 'cuobjdump'))
libs = sorted(glob.glob(os.path.join(sp, 'sgl_kernel', '**', '*.so'), recursive=True))
libs += sorted(glob.glob(os.path.join(sp, 'torch', 'lib', 'lib*cuda*.so')))
out = {}
for lib in libs if tools else []:
    entry = {}
    for flag in ('--list-elf', '--list-ptx'):
        p = subprocess.run([tools[0], flag, lib], capture_output=True, text=True)
        seen = {}
        for line in (p.stdout + p.stderr).splitlines():
            key = line.rsplit('.', 2)[-2] if line.startswith(('ELF file', 'PTX file')) else line
            seen.setdefault(key, line)
        entry[flag] = [p.returncode, list(seen.values())]
    out[os.path.relpath(lib, sp)] = entry
print('CUOBJDUMP ' + json.dumps({'tool': tools[0] if tools else None, 'libs': out}))
"""


class Imported(TypedDict):
    """IMPORT_PROBE's line."""

    sglang: str
    sgl_kernel: str
    torch: str
    cuda: str | None
    error: str | None


def judge_imports(rc: int, out: str, seconds: float) -> list[CheckResult]:
    """import-sglang fails unless sglang and torch import; import-sgl-kernel fails for any error but the missing
    driver, which leaves it skipped, not passed."""
    facts = probe_line(out, "SGLANG", Imported) if rc == 0 else None
    if facts is None:
        failed = CheckResult(name="import-sglang", ok=False, detail=out[-1200:] or f"exited {rc}", seconds=seconds)
        return [failed, skip("import-sgl-kernel", "skipped: sglang did not import")]
    head = f"{facts['sglang']} {facts['torch']} (CUDA {facts['cuda']})"
    imported = CheckResult(name="import-sglang", ok=True, detail=head, seconds=seconds)
    error = facts["error"]
    kernel = f"sgl_kernel {facts['sgl_kernel']}"
    if error is None:
        return [imported, CheckResult(name="import-sgl-kernel", ok=True, detail=f"{kernel} imported", seconds=0.0)]
    if DRIVER_LIB in error:
        detail = f"skipped: not passed, {kernel} needs {DRIVER_LIB} to load its kernels: {DRIVER_SUPPLIER}"
        return [imported, skip("import-sgl-kernel", detail)]
    return [imported, CheckResult(name="import-sgl-kernel", ok=False, detail=f"{kernel}: {error}", seconds=0.0)]


def read_archs(out: str) -> list[LibraryArchs]:
    """The probe's listings through the tested parser; a cuobjdump failure other than "no device code" raises."""
    facts = probe_line(out, "CUOBJDUMP", Cuobjdump)
    if facts is None or not facts["tool"]:
        raise ValueError("no cuobjdump in the image (nvidia-cuda-cuobjdump in the wheelhouse)")
    libs = []
    for lib, entry in facts["libs"].items():
        found = {}
        for flag, kind in (("--list-elf", "sass"), ("--list-ptx", "ptx")):
            rc, lines = entry[flag]
            text = "\n".join(lines)
            if rc != 0 and "does not contain device code" not in text and "No PTX file found" not in text:
                raise ValueError(f"cuobjdump {flag} {lib} exited {rc}: {text[-300:]}")
            found[kind] = parse_listing(text, "sass" if kind == "sass" else "ptx", where=f"cuobjdump {flag} {lib}")
        libs.append(LibraryArchs(library=lib, sass=found["sass"], ptx=found["ptx"]))
    return libs


def stem(library: str) -> str:
    """sgl_kernel/sm90/common_ops.abi3.so → sgl_kernel/sm90/common_ops."""
    head, _, name = library.rpartition("/")
    return f"{head}/{name.split('.', 1)[0]}" if head else name.split(".", 1)[0]


def summary(lib: LibraryArchs) -> str:
    j = lib.to_json()
    return f"{lib.library}: SASS {' '.join(j['sass']) or '-'}; PTX {' '.join(j['ptx']) or '-'}"


def judge_archs(rc: int, out: str, arch_list: str, seconds: float) -> list[CheckResult]:
    """cuda-archs: the core set (common_ops, both builds) and torch's libtorch_cuda cover arch_list; its data holds
    the core set alone, which is what `--image-archs report.json` judges a GPU by. kernel-archs: every library's
    archs, recorded."""
    try:
        libs = read_archs(out) if rc == 0 else None
    except ValueError as exc:
        return [CheckResult(name="cuda-archs", ok=False, detail=str(exc), seconds=seconds)]
    if libs is None:
        return [CheckResult(name="cuda-archs", ok=False, detail=out[-800:] or f"exited {rc}", seconds=seconds)]
    with_code = [lib for lib in libs if lib.has_device_code]
    core = [lib for lib in with_code if stem(lib.library) in CORE_KERNELS]
    torch = [lib for lib in with_code if stem(lib.library) == TORCH_CORE]
    recorded = CheckResult(
        name="kernel-archs",
        ok=True,
        detail="read, not gated: " + " | ".join(summary(lib) for lib in with_code),
        seconds=0.0,
        data={"cuda_archs": {lib.library: lib.to_json() for lib in with_code}},
    )
    missing = sorted(set(CORE_KERNELS) - {stem(lib.library) for lib in core})
    if missing or not torch:
        gone = [f"{m}.*.so" for m in missing] + ([] if torch else [f"{TORCH_CORE}.so"])
        detail = f"no device code read from {', '.join(gone)}: the core kernels are not where SGLang loads them"
        return [CheckResult(name="cuda-archs", ok=False, detail=detail, seconds=seconds), recorded]
    data: CheckDataEntry = {"cuda_archs": {lib.library: lib.to_json() for lib in core}}
    # One library at a time: each must cover the list on its own, whichever of them a GPU loads.
    gaps = [gap for lib in [*core, *torch] for gap in coverage_gaps([lib], arch_list, where="cuda.arch_list")]
    if gaps:
        detail = f"{len(gaps)} gap(s) against arch_list {arch_list}:\n" + "\n".join(g.message() for g in gaps)
        return [CheckResult(name="cuda-archs", ok=False, detail=detail, seconds=seconds, data=data), recorded]
    detail = f"arch_list {arch_list} covered (cuobjdump): " + " | ".join(summary(lib) for lib in [*core, *torch])
    return [CheckResult(name="cuda-archs", ok=True, detail=detail, seconds=seconds, data=data), recorded]


def skip(name: str, reason: str) -> CheckResult:
    return CheckResult(name=name, ok=True, skipped=True, detail=reason, seconds=0.0)


def gpus_listed(timeout: float = 30) -> str | None:
    """The GPUs `nvidia-smi -L` lists on the build host; None when there is no tool, no driver or no GPU."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    gpus = [line.strip() for line in proc.stdout.splitlines() if line.startswith("GPU ")]
    return "; ".join(gpus) if proc.returncode == 0 and gpus else None


def _python(engine: Engine, image: str, code: str, timeout: float) -> tuple[int, str]:
    return engine.run_once(
        RunSpec(image=image, command=["-c", code], entrypoint=["python3"], network_host=False), timeout=timeout
    )


def run(engine: Engine, image: str, plan: BuildPlan) -> list[CheckResult]:
    assert plan.cuda is not None
    start = time.monotonic()
    rc, out = _python(engine, image, IMPORT_PROBE, timeout=600)
    results = judge_imports(rc, out, time.monotonic() - start)
    start = time.monotonic()
    rc, out = _python(engine, image, ARCHS_PROBE, timeout=900)
    results += judge_archs(rc, out, plan.cuda.arch_list, time.monotonic() - start)
    gpus = gpus_listed()
    if gpus is None:
        results.append(skip("serve-models-gpu", "skipped: no GPU (`nvidia-smi -L` on the build host lists none)"))
    elif not all(r.ok for r in results):
        results.append(skip("serve-models-gpu", "skipped: an earlier check failed"))
    else:
        served = checks.check_serve(engine, image, plan, device="cuda")
        results.append(dataclasses.replace(served, name="serve-models-gpu", detail=f"{gpus}: {served.detail}"))
    return [r for r in results if r.name in plan.test_checks]
