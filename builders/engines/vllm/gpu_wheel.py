"""The GPU image whose CUDA comes from PyPI: vLLM's CUDA wheel and torch's nvidia-* wheels on a plain distro base.

No NVIDIA base image is needed, so it builds where NVIDIA's registry cannot be reached. Its test stage proves
what it can without a GPU, and says what it did not check: vLLM's CUDA libraries load (a missing driver
libcuda.so.1 is reported, never passed), cuobjdump reads the GPU archs of vLLM's and torch's kernels, which must
cover the recipe's arch_list, and serving is "skipped: no GPU" unless a GPU reaches the container.
"""

from __future__ import annotations

import time

# pydantic reads a TypedDict's fields from typing_extensions' on Python 3.11.
from typing_extensions import TypedDict

from builders.config.models import Distro, Recipe
from builders.container import Engine
from builders.distros import family_for
from builders.engines.checks import CheckDataEntry, CheckResult, Cuobjdump, probe_line
from builders.engines.vllm.image_tests import _python
from builders.errors import ConfigError
from builders.gpu_archs import LibraryArchs, coverage_gaps, library_stem, parse_listing
from builders.plan import BuildPlan, ContextItem, CudaPlan, PlanOptions, image_build_args, image_labels, torch_spec
from builders.platforms import platform_of
from builders.target import Target


def make_gpu_wheel_plan(distro: Distro, recipe: Recipe, options: PlanOptions) -> BuildPlan:
    target = Target.resolve(distro, recipe)
    assert recipe.cuda is not None and recipe.wheelhouse is not None  # device=cuda, kind=wheel
    wheel = next((w for w in recipe.cuda.wheels if w.arch == distro.arch), None)
    if wheel is None:
        raise ConfigError(
            f"recipes/{recipe.name}.yaml: cuda.wheels has no {distro.arch} wheel for {distro.name}",
            hint="pin the wheel's file name and sha256 for that architecture from PyPI",
        )
    family = family_for(distro)
    version = recipe.cuda.wheel_version
    arch_list = options.cuda_arch_list or recipe.cuda.arch_list
    torch = torch_spec(target, options)
    cuda = CudaPlan(
        mode="wheel",
        # torch's nvidia-* wheels decide the CUDA: the recipe names which, and the test stage checks it.
        version=recipe.cuda.runtime or "from PyPI's nvidia-* wheels",
        devel_ref=None,
        runtime_ref=distro.base.local_tag,
        home="",
        torch_tag="",
        arch_list=arch_list,
        nvcc_threads=recipe.cuda.nvcc_threads,
        host_cxx=None,
        toolkit_install=None,
        wheel_requirement=f"{recipe.cuda.wheel_project}=={version}",
        wheel=wheel,
        build_python_packages=(),
    )
    labels = image_labels(
        distro,
        recipe,
        version=version,
        base_name=distro.base.pinned_ref,
        base_digest=options.base_digest or distro.base.digest or "unpinned",
        with_source=False,
    )
    labels["dev.forge.platform"] = platform_of(distro).name
    labels["dev.forge.gpu.mode"] = "pypi-wheels"
    labels["dev.forge.cuda.arch_list"] = arch_list
    if recipe.cuda.runtime:
        # What the driver gate of smoke and deploy render reads: the driver a host needs follows this CUDA.
        labels["dev.forge.cuda.version"] = recipe.cuda.runtime
    labels["dev.forge.vllm.wheel.sha256"] = wheel.sha256
    # Triton compiles its CUDA launcher with a C compiler and Python.h at first use; no C++ compiler is needed.
    runtime = [*family.packages(["runtime", "python", "python_headers"]), "gcc"]
    return BuildPlan(
        distro=distro,
        recipe=recipe,
        target=recipe.target,
        base_ref=distro.base.local_tag,
        image_tag=options.tag or f"forge/{distro.name}-{recipe.target}{platform_of(distro).suffix}:{version}",
        containerfile="Containerfile",
        template=recipe.template,
        final_stage="runtime",
        max_jobs=options.max_jobs,
        buildkit=options.buildkit,
        trust_ca_bundle=options.trust_ca_bundle,
        cmake_from_pip=False,
        torch=torch,
        compile_env={},
        build_args=image_build_args({"BASE_IMAGE": distro.base.local_tag}, options),
        context=(
            ContextItem(name="scripts", kind="script", origin="containers/scripts"),
            ContextItem(name="wheelhouse", kind="wheelhouse", origin="`forge fetch` of the recipe's wheelhouse"),
        ),
        labels=labels,
        secrets=("ca_bundle",) if options.trust_ca_bundle else (),
        runtime_packages=tuple(dict.fromkeys(runtime)),
        build_packages=(),
        vllm_version=version,
        test_checks=(
            "import-vllm",
            "vllm-version",
            "bytecode",
            "tcmalloc-mapped",
            "cuda-libs-load",
            "cuda-archs",
            "serve-models-gpu",
        ),
        cuda=cuda,
    )


# Run in the image: load each of vLLM's shared libraries after torch, as vLLM does, and say what each needs.
LIBS_PROBE = """
import ctypes, glob, json, os, torch, vllm
root = os.path.dirname(os.path.dirname(vllm.__file__))
out = {}
for lib in sorted(glob.glob(os.path.join(os.path.dirname(vllm.__file__), '**', '*.so'), recursive=True)):
    try:
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
        out[os.path.relpath(lib, root)] = None
    except OSError as exc:
        out[os.path.relpath(lib, root)] = str(exc)
print('CUDALIBS ' + json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'libs': out}))
"""

# Run in the image: cuobjdump on vLLM's libraries and torch's CUDA ones. One line per arch is kept of each
# listing (a library has thousands of kernels, the same arch each time), in cuobjdump's own format, so the host
# parses it with the reader tested on captured output.
ARCHS_PROBE = """
import glob, json, os, subprocess, sysconfig
sp = sysconfig.get_paths()['purelib']
tools = glob.glob(os.path.join(sp, 'nvidia', '*', 'bin', 'cuobjdump'))
libs = sorted(glob.glob(os.path.join(sp, 'vllm', '**', '*.so'), recursive=True))
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

DRIVER_LIB = "libcuda.so.1"
DRIVER_SUPPLIER = (
    "the NVIDIA driver's libcuda.so.1, which the image must not carry: the NVIDIA Container Toolkit mounts the "
    "host's (docker run --gpus all, podman --device nvidia.com/gpu=all, Kubernetes' NVIDIA device plugin)"
)


class CudaLibs(TypedDict):
    """LIBS_PROBE's line: torch's version and CUDA, and each vLLM library's load error (null: it loaded)."""

    torch: str
    cuda: str | None
    libs: dict[str, str | None]


def judge_libs(rc: int, out: str, seconds: float, cuda: str | None = None) -> CheckResult:
    """Failed for a library that does not load for any reason but the driver, or a torch built for another CUDA
    than the plan's `cuda` (the release the image's label names); not passed (skipped, with what supplies it) where
    the driver's libcuda.so.1 is all that is missing. Its data carry torch's version and CUDA for the report."""
    facts = probe_line(out, "CUDALIBS", CudaLibs) if rc == 0 else None
    if facts is None:
        return CheckResult(name="cuda-libs-load", ok=False, detail=out[-800:] or f"exited {rc}", seconds=seconds)
    data: CheckDataEntry = {"torch": facts["torch"], "cuda_runtime": str(facts["cuda"])}
    if cuda is not None and facts["cuda"] != cuda:
        return CheckResult(
            name="cuda-libs-load",
            ok=False,
            detail=f"torch {facts['torch']} is built for CUDA {facts['cuda']}, and the recipe's cuda.runtime (the "
            f"image's dev.forge.cuda.version label) says {cuda}: the driver gate would judge hosts by the wrong CUDA",
            seconds=seconds,
            data=data,
        )
    libs = facts["libs"]
    broken = {lib: err for lib, err in libs.items() if err and DRIVER_LIB not in err}
    need_driver = sorted(lib for lib, err in libs.items() if err and DRIVER_LIB in err)
    head = f"torch {facts['torch']} (CUDA {facts['cuda']}): {len(libs) - len(broken) - len(need_driver)}/{len(libs)}"
    if broken:
        lines = [f"{lib}: {err}" for lib, err in sorted(broken.items())]
        return CheckResult(
            name="cuda-libs-load",
            ok=False,
            detail=f"{head} load; failed:\n" + "\n".join(lines),
            seconds=seconds,
            data=data,
        )
    if need_driver:
        return CheckResult(
            name="cuda-libs-load",
            ok=True,
            skipped=True,
            detail=f"skipped: not passed, {len(need_driver)} need {DRIVER_LIB} ({', '.join(need_driver)}): "
            f"{DRIVER_SUPPLIER}; {head} load without it",
            seconds=seconds,
            data=data,
        )
    return CheckResult(name="cuda-libs-load", ok=True, detail=f"{head} load", seconds=seconds, data=data)


def read_archs(out: str) -> list[LibraryArchs]:
    """The probe's listings through the tested parser; a cuobjdump failure other than "no device code" raises."""
    facts = probe_line(out, "CUOBJDUMP", Cuobjdump)
    if facts is None or not facts.get("tool"):
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


def judge_archs(rc: int, out: str, arch_list: str, seconds: float) -> CheckResult:
    try:
        libs = read_archs(out) if rc == 0 else None
    except ValueError as exc:
        return CheckResult(name="cuda-archs", ok=False, detail=str(exc), seconds=seconds)
    if libs is None:
        return CheckResult(name="cuda-archs", ok=False, detail=out[-800:] or f"exited {rc}", seconds=seconds)
    data: CheckDataEntry = {"cuda_archs": {lib.library: lib.to_json() for lib in libs if lib.has_device_code}}
    gaps = coverage_gaps(libs, arch_list, where="cuda.arch_list")
    if gaps:
        detail = f"{len(gaps)} gap(s) against arch_list {arch_list}:\n" + "\n".join(g.message() for g in gaps)
        return CheckResult(name="cuda-archs", ok=False, detail=detail, seconds=seconds, data=data)
    lines = []
    for lib in libs:
        if lib.has_device_code:
            j = lib.to_json()
            lines.append(
                f"{library_stem(lib.library)}: SASS {' '.join(j['sass']) or '-'}; PTX {' '.join(j['ptx']) or '-'}"
            )
    return CheckResult(
        name="cuda-archs",
        ok=True,
        detail=f"arch_list {arch_list} covered (cuobjdump): " + " | ".join(lines),
        seconds=seconds,
        data=data,
    )


def run_gpu_wheel_checks(engine: Engine, image: str, plan: BuildPlan) -> list[CheckResult]:
    assert plan.cuda is not None
    results = []
    if "cuda-libs-load" in plan.test_checks:
        start = time.monotonic()
        rc, out = _python(engine, image, LIBS_PROBE, plan)
        cuda = plan.recipe.cuda.runtime if plan.recipe.cuda else None
        results.append(judge_libs(rc, out, time.monotonic() - start, cuda))
    if "cuda-archs" in plan.test_checks:
        start = time.monotonic()
        rc, out = _python(engine, image, ARCHS_PROBE, plan, timeout=900)
        results.append(judge_archs(rc, out, plan.cuda.arch_list, time.monotonic() - start))
    return results
