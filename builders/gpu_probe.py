"""`forge gpu probe`: ask the driver itself whether the GPU gate's rules hold on this host's GPUs.

For each arch in the image's list it compiles one tiny kernel twice with nvcc (from the host, else PyPI's wheels):
SASS-only (`-gencode arch=compute_XY,code=sm_XY`) and PTX-only (`code=compute_XY`). cuobjdump reads what each
fatbin carries, through the same reader the gate uses (builders/gpu_archs.py), and the gate's rules predict, per
GPU, whether the driver will run it: `LibraryArchs.runs_on` for the arch, and for PTX also whether the driver's
CUDA is at least nvcc's (a driver refuses a newer PTX ISA). Then, per local GPU, the driver loads each fatbin
(cuModuleLoadData through ctypes on libcuda.so.1), launches the kernel and reads back what it wrote.

Exit 0 when the driver did what the gate predicted for every variant on every GPU; 23 (GpuProbeMismatch) naming the
variants where it did not; 9 (GpuNotEvaluated) where there is no GPU (the compile and the read have run, and the
JSON says what was compiled), or where a variant could not be compiled or read as built: a variant never run is
never counted as agreeing. It needs only the standard library, Forge's gpu_archs and cuda_driver, and rich and
PyYAML (what the GPU hosts within reach have): `python3 -m builders.gpu_probe` runs it without Forge's CLI.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, NotRequired, TextIO, TypedDict

from builders.cuda_driver import CudaVersion, DriverVersion, ptx_jits
from builders.errors import ForgeError, GpuNotEvaluated, GpuProbeMismatch, UsageError
from builders.gpu_archs import (
    Arch,
    Capability,
    LibraryArchs,
    core,
    cuobjdump_from_pypi,
    nvcc_from_pypi,
    read_library,
    wheel_cache,
)
from builders.gpu_image import image_facts

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RECIPE = ROOT / "recipes" / "vllm-gpu-wheel.yaml"
KERNEL = "forge_probe"
THREADS = 32
MAGIC = 0x466F7267  # "Forg": each thread writes MAGIC + its index, so a kernel that did not run is seen
KERNEL_SOURCE = f"""extern "C" __global__ void {KERNEL}(unsigned int *out) {{
    out[threadIdx.x] = {MAGIC}u + threadIdx.x;
}}
"""

Kind = Literal["sass", "ptx"]
ProbeVerdict = Literal["not evaluated", "agree", "disagree", "incomplete"]

# probe.json's shape. TypedDicts, not pydantic models: the probe runs where pydantic is not installed.


class RunRecord(TypedDict):
    """One variant on one GPU: what the gate predicted and why, what the driver did, and whether they agree."""

    predicted: bool
    why: str
    ran: bool
    driver: str
    agree: bool


class VariantRecord(TypedDict):
    variant: str
    gencode: str
    error: str | None
    read: dict[str, list[str]] | None  # what cuobjdump read: {"sass": [...], "ptx": [...]}
    runs: dict[str, RunRecord]  # by GPU index


class HostRecord(TypedDict):
    machine: str
    cpus: int | None
    python: str


class NvccRecord(TypedDict):
    path: str
    release: str
    source: str


class DriverRecord(TypedDict):
    cuda: str  # the newest CUDA the driver runs (cuDriverGetVersion)
    version: str | None  # nvidia-smi's driver_version, where nvidia-smi is there


class GpuRecord(TypedDict):
    index: int
    name: str
    capability: str


class ProbeResult(TypedDict):
    when: str
    host: HostRecord
    archs_from: str
    nvcc: NvccRecord
    cuobjdump: str
    compile_s: float
    variants: list[VariantRecord]
    gpus: list[GpuRecord]
    verdict: ProbeVerdict
    why_not_evaluated: NotRequired[str]
    driver: NotRequired[DriverRecord]
    seconds: NotRequired[float]


@dataclass(frozen=True, kw_only=True)
class Variant:
    arch: Arch
    kind: Kind

    @property
    def name(self) -> str:
        return f"{self.arch.sm()} SASS" if self.kind == "sass" else f"{self.arch.compute()} PTX"

    @property
    def file_stem(self) -> str:
        return f"{self.kind}-{self.arch.sm()}"

    def gencode(self) -> str:
        code = self.arch.sm() if self.kind == "sass" else self.arch.compute()
        return f"arch={self.arch.compute()},code={code}"


@dataclass(kw_only=True)
class Built:
    variant: Variant
    fatbin: Path | None = None
    error: str | None = None  # nvcc's refusal (an arch this nvcc does not know) or cuobjdump's reading gone wrong
    read: LibraryArchs | None = None
    runs: dict[int, RunRecord] = field(default_factory=dict)  # GPU index -> prediction and the driver's answer


# --- the image's archs --------------------------------------------------------------------------------------


def parse_archs(text: str, *, where: str) -> list[Arch]:
    """An arch list with suffixes kept: "7.5 9.0a 10.0f 12.0+PTX" (+PTX changes nothing: both variants are built)."""
    archs = []
    for item in re.split(r"[\s;,]+", text.strip()):
        if not item:
            continue
        m = re.fullmatch(r"(\d+)\.(\d)([af]?)(?:\+PTX)?", item)
        if not m:
            raise UsageError(f"{where}: {item!r} is not an arch such as 9.0, 9.0a or 12.0+PTX")
        archs.append(Arch(int(m[1]), int(m[2]), m[3]))  # type: ignore[arg-type]
    if not archs:
        raise UsageError(f"{where}: no arch in it")
    return sorted(set(archs))


def image_archs(spec: str | None) -> tuple[list[Arch], str]:
    """The archs to probe: --image-archs (a build report: every arch a core library carries, SASS or PTX; or a
    list), else the gpu-wheel recipe's cuda.arch_list."""
    if spec is None:
        import yaml

        data = yaml.safe_load(DEFAULT_RECIPE.read_text(encoding="utf-8"))
        text = str(data["cuda"]["arch_list"])
        return parse_archs(text, where=f"{DEFAULT_RECIPE.name}: cuda.arch_list"), f"recipes/{DEFAULT_RECIPE.name}"
    if not Path(spec).is_file():
        return parse_archs(spec, where="--image-archs"), f"--image-archs {spec!r}"
    facts = image_facts(spec)
    archs = {a for lib in core(facts.libraries) for a in (*lib.sass, *lib.ptx)}
    return sorted(archs), facts.archs_from


# --- the tools ----------------------------------------------------------------------------------------------


def find_tool(name: str, explicit: str | None, *, beside: Path | None = None) -> Path | None:
    if explicit:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise UsageError(f"--{name} {explicit}: not an executable file")
        return path
    candidates = [beside / name] if beside else []
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]) / "bin" / name)
    found = shutil.which(name)
    if found:
        candidates.append(Path(found))
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def nvcc_release(nvcc: Path) -> CudaVersion:
    proc = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=False, timeout=60)
    m = re.search(r"release (\d+\.\d+)", proc.stdout)
    if proc.returncode != 0 or not m:
        raise ForgeError(f"{nvcc} --version did not name its release: {(proc.stdout + proc.stderr).strip()[-300:]}")
    return CudaVersion.parse(m[1])


def compile_variant(nvcc: Path, source: Path, variant: Variant, out: Path) -> Built:
    target = out / f"{variant.file_stem}.fatbin"
    cmd = [str(nvcc), "-fatbin", "-gencode", variant.gencode(), "-o", str(target), str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
    if proc.returncode != 0 or not target.is_file():
        text = (proc.stdout + proc.stderr).strip().splitlines()
        return Built(variant=variant, error=f"nvcc exited {proc.returncode}: {' '.join(text[-3:])[:300]}")
    return Built(variant=variant, fatbin=target)


def read_variant(cuobjdump: Path, built: Built) -> None:
    """What cuobjdump reads in the fatbin; a variant that holds anything but the one kind and arch it was built for
    is an error of the probe, not a verdict on the GPU."""
    assert built.fatbin is not None
    read = read_library(cuobjdump, built.fatbin, name=built.variant.name)
    want, other = (read.sass, read.ptx) if built.variant.kind == "sass" else (read.ptx, read.sass)
    arch = built.variant.arch
    if other or [(a.major, a.minor) for a in want] != [(arch.major, arch.minor)]:
        listed = ", ".join(str(a) for a in (*read.sass, *read.ptx)) or "nothing"
        built.error = f"cuobjdump read {listed} in a {built.variant.name} build"
    built.read = read


# --- the driver, through ctypes -----------------------------------------------------------------------------


class DriverApi:
    """The few CUDA driver API calls the probe needs, from the driver's own libcuda.so.1."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise GpuNotEvaluated(
                f"no NVIDIA driver here: libcuda.so.1 does not load ({exc})",
                hint="run forge gpu probe on the GPU host (or in a container started with its GPUs)",
            ) from exc
        rc = self.lib.cuInit(0)
        if rc != 0:
            raise GpuNotEvaluated(
                f"the NVIDIA driver found no GPU to use: cuInit returned {self.error(rc)}",
                hint="check nvidia-smi on this host; in a container, start it with its GPUs",
            )

    def error(self, rc: int) -> str:
        name = ctypes.c_char_p()
        if self.lib.cuGetErrorName(rc, ctypes.byref(name)) == 0 and name.value:
            return f"{name.value.decode()} ({rc})"
        return f"CUresult {rc}"

    def check(self, rc: int, call: str) -> None:
        if rc != 0:
            raise ForgeError(f"{call} failed: {self.error(rc)}")

    def version(self) -> CudaVersion:
        value = ctypes.c_int()
        self.check(self.lib.cuDriverGetVersion(ctypes.byref(value)), "cuDriverGetVersion")
        return CudaVersion.parse(str(value.value))

    def devices(self) -> list[tuple[str, Capability]]:
        count = ctypes.c_int()
        self.check(self.lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
        found = []
        for index in range(count.value):
            dev = ctypes.c_int()
            self.check(self.lib.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
            name = ctypes.create_string_buffer(256)
            self.check(self.lib.cuDeviceGetName(name, 256, dev), "cuDeviceGetName")
            major, minor = ctypes.c_int(), ctypes.c_int()
            # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR
            self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev), "cuDeviceGetAttribute")
            self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev), "cuDeviceGetAttribute")
            found.append((name.value.decode(), Capability(major.value, minor.value)))
        return found

    def run(self, index: int, image: bytes) -> tuple[bool, str]:
        """Load the fatbin on GPU `index`, launch its kernel and read back: (ran, what happened)."""
        lib = self.lib
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.check(lib.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
        self.check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        try:
            self.check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
            module = ctypes.c_void_p()
            rc = lib.cuModuleLoadData(ctypes.byref(module), image)
            if rc != 0:
                return False, f"cuModuleLoadData: {self.error(rc)}"
            try:
                return self._launch(module)
            finally:
                lib.cuModuleUnload(module)
        finally:
            lib.cuDevicePrimaryCtxRelease_v2(dev)

    def _launch(self, module: ctypes.c_void_p) -> tuple[bool, str]:
        lib = self.lib
        function = ctypes.c_void_p()
        rc = lib.cuModuleGetFunction(ctypes.byref(function), module, KERNEL.encode())
        if rc != 0:
            return False, f"cuModuleGetFunction: {self.error(rc)}"
        size = THREADS * 4
        buffer = ctypes.c_uint64()
        self.check(lib.cuMemAlloc_v2(ctypes.byref(buffer), ctypes.c_size_t(size)), "cuMemAlloc")
        try:
            self.check(lib.cuMemsetD8_v2(buffer, 0, ctypes.c_size_t(size)), "cuMemsetD8")
            arg = ctypes.c_uint64(buffer.value)
            params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(arg), ctypes.c_void_p))
            rc = lib.cuLaunchKernel(function, 1, 1, 1, THREADS, 1, 1, 0, None, params, None)
            if rc == 0:
                rc = lib.cuCtxSynchronize()
            if rc != 0:
                return False, f"cuLaunchKernel: {self.error(rc)}"
            host = (ctypes.c_uint32 * THREADS)()
            self.check(
                lib.cuMemcpyDtoH_v2(ctypes.cast(host, ctypes.c_void_p), buffer, ctypes.c_size_t(size)), "cuMemcpyDtoH"
            )
            wrong = [i for i in range(THREADS) if host[i] != MAGIC + i]
            if wrong:
                return False, f"ran, but {len(wrong)} of {THREADS} threads wrote the wrong value"
            return True, "ran: every thread wrote its value"
        finally:
            lib.cuMemFree_v2(buffer)


def _configure(lib: ctypes.CDLL) -> None:
    """Argument types for the calls that take 64-bit handles or sizes; every call returns a CUresult (int)."""
    u64, size, vp = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p
    lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), size]
    lib.cuMemsetD8_v2.argtypes = [u64, ctypes.c_ubyte, size]
    lib.cuMemcpyDtoH_v2.argtypes = [vp, u64, size]
    lib.cuMemFree_v2.argtypes = [u64]
    lib.cuLaunchKernel.argtypes = [
        vp,
        *([ctypes.c_uint] * 6),
        ctypes.c_uint,
        vp,
        ctypes.POINTER(vp),
        ctypes.POINTER(vp),
    ]
    lib.cuModuleLoadData.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p]
    lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
    lib.cuModuleUnload.argtypes = [vp]
    lib.cuCtxSetCurrent.argtypes = [vp]
    lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(vp), ctypes.c_int]


# --- the probe ----------------------------------------------------------------------------------------------


def predict(built: Built, gpu: Capability, driver_cuda: CudaVersion, nvcc_cuda: CudaVersion) -> tuple[bool, str]:
    """The gate's word on one variant and GPU: its reading of the binary (runs_on), and for PTX the driver's CUDA."""
    assert built.read is not None
    how = built.read.runs_on(gpu)
    if how is None:
        return False, f"no {'SASS' if built.variant.kind == 'sass' else 'PTX'} for {gpu}"
    if built.variant.kind == "ptx" and not ptx_jits(driver_cuda, nvcc_cuda):
        return False, f"PTX of nvcc {nvcc_cuda} is newer than the driver's CUDA {driver_cuda}"
    return True, how


@dataclass(frozen=True, kw_only=True)
class Options:
    image_archs: str | None
    nvcc: str | None
    cuobjdump: str | None
    out: Path
    jobs: int
    work: Path


def run_probe(options: Options, say: Callable[[str], object] = print) -> ProbeResult:
    """Compile, read, and where there is a GPU, run; the result as the JSON written to options.out."""
    started = time.monotonic()
    archs, archs_from = image_archs(options.image_archs)
    # The fatbins go apart from the result: a device command brings back few files.
    work = options.work
    work.mkdir(parents=True, exist_ok=True)
    options.out.mkdir(parents=True, exist_ok=True)
    cache = wheel_cache(ROOT)
    nvcc = find_tool("nvcc", options.nvcc)
    nvcc_source = str(nvcc) if nvcc else "PyPI nvidia-cuda-nvcc 13.0.88"
    if nvcc is None:
        say("forge: no nvcc on this host: PyPI's nvidia-cuda-nvcc 13.0.88 (cached under FORGE_CACHE)")
        nvcc = nvcc_from_pypi(cache)
    nvcc_cuda = nvcc_release(nvcc)
    cuobjdump = find_tool("cuobjdump", options.cuobjdump, beside=nvcc.parent) or cuobjdump_from_pypi(cache)
    source = work / "forge_probe.cu"
    source.write_text(KERNEL_SOURCE, encoding="utf-8")
    kinds: tuple[Kind, ...] = ("sass", "ptx")
    variants = [Variant(arch=a, kind=k) for a in archs for k in kinds]
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
        built = list(pool.map(lambda v: compile_variant(nvcc, source, v, work), variants))
    compile_s = time.monotonic() - t0
    for b in built:
        if b.fatbin is not None:
            read_variant(cuobjdump, b)
    say(
        f"forge: {len(variants)} variants of {len(archs)} archs ({archs_from}) with nvcc {nvcc_cuda} ({nvcc_source}) "
        f"in {compile_s:.1f} s; read with {cuobjdump}"
    )
    result: ProbeResult = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "archs_from": archs_from,
        "nvcc": {"path": str(nvcc), "release": str(nvcc_cuda), "source": nvcc_source},
        "cuobjdump": str(cuobjdump),
        "compile_s": round(compile_s, 2),
        "variants": [],
        "gpus": [],
        "verdict": "not evaluated",
    }
    try:
        api = DriverApi()
        _configure(api.lib)
        driver_cuda = api.version()
        gpus = api.devices()
        if not gpus:
            raise GpuNotEvaluated("the NVIDIA driver lists no GPU", hint="check nvidia-smi on this host")
    except GpuNotEvaluated as exc:
        result["why_not_evaluated"] = exc.message
        result["variants"] = [_variant_json(b) for b in built]
        result["seconds"] = round(time.monotonic() - started, 2)
        _write(options.out, result)
        raise
    result["driver"] = {"cuda": str(driver_cuda), "version": _driver_version()}
    result["gpus"] = [{"index": i, "name": n, "capability": str(c)} for i, (n, c) in enumerate(gpus)]
    for b in built:
        if b.error or b.fatbin is None:
            continue
        image = b.fatbin.read_bytes()
        for index, (_, cap) in enumerate(gpus):
            predicted, why = predict(b, cap, driver_cuda, nvcc_cuda)
            ran, what = api.run(index, image)
            b.runs[index] = {"predicted": predicted, "why": why, "ran": ran, "driver": what, "agree": predicted == ran}
    result["variants"] = [_variant_json(b) for b in built]
    disagree = [r for b in built for r in b.runs.values() if not r["agree"]]
    unrun = [b for b in built if b.error]
    result["verdict"] = "disagree" if disagree else "incomplete" if unrun else "agree"
    result["seconds"] = round(time.monotonic() - started, 2)
    _write(options.out, result)
    return result


def _driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    proc = subprocess.run(
        [smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, check=False
    )
    first = proc.stdout.strip().splitlines()[:1]
    try:
        return str(DriverVersion.parse(first[0])) if proc.returncode == 0 and first else None
    except ValueError:
        return None


def _variant_json(b: Built) -> VariantRecord:
    return {
        "variant": b.variant.name,
        "gencode": b.variant.gencode(),
        "error": b.error,
        "read": b.read.to_json() if b.read else None,
        "runs": {str(i): r for i, r in b.runs.items()},
    }


def _write(out: Path, result: ProbeResult) -> None:
    (out / "probe.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


def print_result(result: ProbeResult, stream: TextIO | None = None) -> None:
    from builders.log import print_table

    gpus = result["gpus"]
    columns = ["variant", "cuobjdump read"] + [f"GPU {g['index']} {g['name']} ({g['capability']})" for g in gpus]
    rows = []
    for v in result["variants"]:
        read = v["read"] or {}
        listed = " ".join([*read.get("sass", []), *read.get("ptx", [])]) or "-"
        cells = [v["variant"], v["error"] or listed]
        for g in gpus:
            r = v["runs"].get(str(g["index"]))
            if r is None:
                cells.append("-")
                continue
            mark = "agree" if r["agree"] else "DISAGREE"
            cells.append(f"{mark}: gate {'runs' if r['predicted'] else 'refuses'}; driver: {r['driver']}")
        rows.append(cells)
    title = f"forge gpu probe: {result['verdict']}"
    if "driver" in result:
        driver = result["driver"]
        title += f" (driver CUDA {driver['cuda']}, driver {driver['version'] or 'unknown'})"
    print_table(title, columns, rows, stream=stream or sys.stdout)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--image-archs",
        default=None,
        metavar="REPORT_OR_LIST",
        help="the archs to probe: a GPU image's build report.json or an arch list such as '8.0 9.0a 12.0' "
        "(default: recipes/vllm-gpu-wheel.yaml's cuda.arch_list)",
    )
    p.add_argument("--nvcc", default=None, metavar="PATH", help="nvcc to use (default: $CUDA_HOME/bin, PATH, PyPI)")
    p.add_argument("--cuobjdump", default=None, metavar="PATH", help="cuobjdump (default: beside nvcc, PATH, PyPI)")
    p.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("OUT") or "reports/gpu-probe"),
        metavar="DIR",
        help="where probe.json goes (default: $OUT, else reports/gpu-probe)",
    )
    p.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "forge-gpu-probe",
        metavar="DIR",
        help="where the kernel source and its fatbins go (default: the temporary folder's forge-gpu-probe)",
    )
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="nvcc compiles at once (default: CPUs)")


def command(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: give 1 or more")
    options = Options(
        image_archs=args.image_archs,
        nvcc=args.nvcc,
        cuobjdump=args.cuobjdump,
        out=args.out,
        jobs=args.jobs,
        work=args.work,
    )
    try:
        result = run_probe(options)
    except GpuNotEvaluated:
        print(f"forge: compiled and read; nothing run: see {options.out / 'probe.json'}", file=sys.stderr)
        raise
    print_result(result)
    print(f"forge: wrote {options.out / 'probe.json'} in {result.get('seconds')} s")
    wrong = [
        f"{v['variant']} on GPU {i}: gate {'runs' if r['predicted'] else 'refuses'} it, driver: {r['driver']}"
        for v in result["variants"]
        for i, r in v["runs"].items()
        if not r["agree"]
    ]
    if wrong:
        raise GpuProbeMismatch(
            "; ".join(wrong),
            hint="Forge's reading of these binaries is wrong for this GPU: report it with probe.json",
        )
    unrun = [f"{v['variant']}: {v['error']}" for v in result["variants"] if v["error"]]
    if unrun:
        raise GpuNotEvaluated(
            f"{len(unrun)} of {len(result['variants'])} variants were not run, so the gate is not checked for them: "
            + "; ".join(unrun),
            hint="give --nvcc a CUDA toolkit that knows every arch in the list (nvcc 13.0 refuses every arch before 7.5), or "
            "leave those archs out of --image-archs",
        )
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("gpu", help="check this host's GPUs against the GPU gate's rules")
    sub = parser.add_subparsers(dest="gpu_command", metavar="ACTION", required=True)
    probe = sub.add_parser(
        "probe",
        help="compile a tiny kernel per arch (SASS-only and PTX-only), run each on every local GPU, compare with "
        "the gate",
        description=__doc__.split("\n\n")[1],
    )
    add_arguments(probe)
    probe.set_defaults(func=command)


def main(argv: Sequence[str] | None = None) -> int:
    """`python3 -m builders.gpu_probe`: the same probe where Forge's CLI cannot be imported (no pydantic)."""
    parser = argparse.ArgumentParser(prog="python3 -m builders.gpu_probe", description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return command(args)
    except ForgeError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
