"""The GPU gate: refuse a GPU that an image has no kernels for, before vLLM dies with "no kernel image is available
for execution on the device".

The run host's GPUs come from `nvidia-smi --query-gpu=name,compute_cap --format=csv` (read live, or from a file
saved on that host), NVML through nvidia-ml-py, or a Kubernetes node's `nvidia.com/gpu.product` label. The
image's archs come from its build report (what cuobjdump read) or, before a build, from an arch list.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from builders.errors import ConfigError, GpuUnsupported, UsageError
from builders.gates.findings import Finding, PreflightReport, blocker, passed
from builders.gpu_archs import Capability, LibraryArchs, core, declared_library


@dataclass(frozen=True, kw_only=True)
class Gpu:
    name: str
    capability: Capability
    source: str  # where it was read: nvidia-smi, a file, NVML, a node label


def parse_nvidia_smi(text: str, *, source: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=name,compute_cap --format=csv` (header optional, noheader too)."""
    gpus: list[Gpu] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.replace(" ", "").lower() == "name,compute_cap":
            continue
        name, sep, cap = line.rpartition(",")
        if not sep or not name.strip():
            raise UsageError(
                f"{source}:{number}: {line.strip()!r} is not a `name, compute_cap` line",
                hint="save `nvidia-smi --query-gpu=name,compute_cap --format=csv` from the run host",
            )
        try:
            capability = Capability.parse(cap.strip(), where=f"{source}:{number}")
        except ConfigError as exc:
            # compute_cap is "[N/A]" on drivers older than 510, which do not know the field.
            raise UsageError(
                exc.message, hint="nvidia-smi 510 or later reports compute_cap; or use --gpu-product"
            ) from exc
        gpus.append(Gpu(name=name.strip(), capability=capability, source=source))
    if not gpus:
        raise UsageError(
            f"{source}: no GPU listed", hint="the run host's nvidia-smi sees no GPU: is the driver loaded?"
        )
    return gpus


# GPU Feature Discovery's nvidia.com/gpu.product label is the product name with spaces as dashes
# (NVIDIA-H100-80GB-HBM3, Tesla-T4); its capability comes from NVIDIA's published table, matched on the model.
# The first match wins, so a longer name sits before the shorter one it contains.
_PRODUCTS: tuple[tuple[str, Capability], ...] = (
    (r"GB300|B300", Capability(10, 3)),
    (r"GB200|B200|B100", Capability(10, 0)),
    (r"RTX-?PRO-?6000-?Blackwell|RTX-?50\d0|GB10\b", Capability(12, 0)),
    (r"GH200|H200|H100|H800|H20\b", Capability(9, 0)),
    (r"L40S?|L4\b|RTX-?40\d0|RTX-?6000-?Ada|L20\b", Capability(8, 9)),
    (r"A100|A800|A30\b", Capability(8, 0)),
    (r"A10G?\b|A40\b|A16\b|A2\b|RTX-?30\d0|RTX-?A6000", Capability(8, 6)),
    (r"T4\b|RTX-?20\d0|Quadro-?RTX", Capability(7, 5)),
    (r"V100", Capability(7, 0)),
    (r"P100", Capability(6, 0)),
    (r"P4\b|P40\b", Capability(6, 1)),
)


def gpu_from_product(label: str) -> Gpu:
    """A node label's value (NVIDIA-H100-80GB-HBM3), or the whole `nvidia.com/gpu.product=...` pair."""
    value = label.split("=", 1)[1] if "=" in label else label
    for pattern, capability in _PRODUCTS:
        if re.search(pattern, value, re.IGNORECASE):
            return Gpu(name=value, capability=capability, source="node label nvidia.com/gpu.product")
    raise UsageError(
        f"--gpu-product {label}: not a GPU Forge knows the compute capability of",
        hint="save `nvidia-smi --query-gpu=name,compute_cap --format=csv` on a node and pass it as --gpu-query",
    )


def read_nvml() -> list[Gpu] | None:
    """Every GPU NVML sees, or None where nvidia-ml-py or the driver's libnvidia-ml is missing."""
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append(
                Gpu(
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    capability=Capability(int(major), int(minor)),
                    source="NVML",
                )
            )
        return gpus
    finally:
        pynvml.nvmlShutdown()


def read_local() -> list[Gpu] | None:
    """This host's GPUs: nvidia-smi where it is on PATH, else NVML; None where neither answers."""
    smi = shutil.which("nvidia-smi")
    if smi:
        proc = subprocess.run(
            [smi, "--query-gpu=name,compute_cap", "--format=csv"], capture_output=True, text=True, check=False
        )
        if proc.returncode == 0:
            return parse_nvidia_smi(proc.stdout, source="nvidia-smi")
    return read_nvml()


def image_libraries(spec: str, *, where: str = "--image-archs") -> tuple[list[LibraryArchs], str]:
    """--image-archs: a build's report.json (the archs cuobjdump read) or an arch list ("7.5 8.0 9.0+PTX")."""
    path = Path(spec)
    if not path.is_file():
        if re.fullmatch(r"[\d.\s;,+PTXaf]+", spec):
            return [declared_library(spec, where=where)], f"{where} {spec!r} (declared, not read from binaries)"
        raise UsageError(
            f"--image-archs {spec}: neither a file nor an arch list",
            hint="pass the build's reports/DISTRO-TARGET/report.json, or an arch list such as '8.0 9.0'",
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"--image-archs {path}: not a readable JSON report ({exc})") from exc
    archs = data.get("cuda_archs") if isinstance(data, dict) else None
    if archs is None and isinstance(data, dict):
        # A build report keeps them in its cuda-archs test entry.
        tests = [t for t in data.get("tests") or () if isinstance(t, dict) and t.get("name") == "cuda-archs"]
        archs = (tests[0].get("data") or {}).get("cuda_archs") if tests else None
    if not isinstance(archs, dict) or not archs:
        raise UsageError(
            f"--image-archs {path}: no cuda_archs in it",
            hint="it is written by the test stage of a GPU image built with cuobjdump (forge build debian-13 gpu-wheel)",
        )
    libs = [LibraryArchs.from_json(lib, v, where=f"{path}: cuda_archs") for lib, v in archs.items()]
    return libs, f"{path} (read by cuobjdump)"


@dataclass(frozen=True, kw_only=True)
class Verdict:
    gpu: Gpu
    runs: dict[str, str | None]  # core library → how its kernels reach the GPU, None where they cannot

    @property
    def supported(self) -> bool:
        return all(v is not None for v in self.runs.values())


def judge(gpus: list[Gpu], libraries: list[LibraryArchs]) -> list[Verdict]:
    libs = core(libraries)
    if not libs:
        raise UsageError("the image's arch list holds no library with device code: nothing to judge a GPU by")
    return [Verdict(gpu=g, runs={lib.library: lib.runs_on(g.capability) for lib in libs}) for g in gpus]


def arch_summary(libraries: list[LibraryArchs]) -> str:
    parts = []
    for lib in core(libraries):
        j = lib.to_json()
        parts.append(f"{lib.library}: SASS {' '.join(j['sass']) or 'none'}; PTX {' '.join(j['ptx']) or 'none'}")
    return " | ".join(parts)


def enforce(gpus: list[Gpu], libraries: list[LibraryArchs], archs_from: str) -> list[Verdict]:
    """Raise GpuUnsupported naming the first refused GPU, its capability and the image's archs."""
    verdicts = judge(gpus, libraries)
    refused = [v for v in verdicts if not v.supported]
    if refused:
        v = refused[0]
        missing = ", ".join(lib for lib, how in v.runs.items() if how is None)
        raise GpuUnsupported(
            f"{v.gpu.name} (compute capability {v.gpu.capability}, from {v.gpu.source}) has no kernels in the "
            f"image: {missing} carry no SASS for {v.gpu.capability} and no PTX the driver can JIT to it. "
            f"Image archs, from {archs_from}: {arch_summary(libraries)}",
            hint=f"run on a GPU the image covers, or build one whose kernels include {v.gpu.capability}: a source "
            f"build with --cuda-arch-list naming it (or an older arch with +PTX); a wheel image cannot add archs",
        )
    return verdicts


def add_gpu_gate_args(p: argparse.ArgumentParser) -> None:
    """--gpu-query, --gpu-product and --image-archs, shared by preflight, smoke and deploy render."""
    g = p.add_argument_group("GPU gate (refuses a GPU the image has no kernels for; exit 20)")
    g.add_argument(
        "--gpu-query",
        default=None,
        metavar="FILE",
        help="the run host's `nvidia-smi --query-gpu=name,compute_cap --format=csv` saved to FILE "
        "(default: this host's nvidia-smi or NVML, when present)",
    )
    g.add_argument(
        "--gpu-product",
        default=None,
        metavar="LABEL",
        help="a Kubernetes node's nvidia.com/gpu.product label value, e.g. NVIDIA-H100-80GB-HBM3",
    )
    g.add_argument(
        "--image-archs",
        default=None,
        metavar="REPORT_OR_LIST",
        help="the GPU image's build report.json (archs read by cuobjdump) or an arch list such as '8.0 9.0+PTX'",
    )


def gpus_of(args: argparse.Namespace) -> list[Gpu] | None:
    if getattr(args, "gpu_query", None) and getattr(args, "gpu_product", None):
        raise UsageError("--gpu-query and --gpu-product both given", hint="name the run host's GPUs one way")
    if getattr(args, "gpu_query", None):
        path = Path(args.gpu_query)
        try:
            text = path.read_text()
        except OSError as exc:
            raise UsageError(f"--gpu-query {path}: cannot read it ({exc.strerror})") from exc
        return parse_nvidia_smi(text, source=str(path))
    if getattr(args, "gpu_product", None):
        return [gpu_from_product(args.gpu_product)]
    return None


@dataclass(frozen=True, kw_only=True)
class GateInput:
    gpus: list[Gpu]
    libraries: list[LibraryArchs]
    archs_from: str


def gate_input(args: argparse.Namespace, *, default_archs: tuple[str, str] | None = None) -> GateInput | None:
    """What the gate judges, from --gpu-query/--gpu-product/--image-archs; None when there is nothing to judge.

    GPUs named on the command line with no arch list to judge them by are a usage error; GPUs merely found on
    this host, with no arch list, are not judged (the image may be a CPU image).
    default_archs: (arch list, where it comes from), used when --image-archs is not given."""
    given = gpus_of(args)
    spec, where = (
        (args.image_archs, "--image-archs") if getattr(args, "image_archs", None) else default_archs or ("", "")
    )
    if not spec:
        if given is not None:
            raise UsageError(
                "the run host's GPUs were given, but not the image's archs",
                hint="add --image-archs reports/DISTRO-TARGET/report.json (or an arch list such as '8.0 9.0')",
            )
        return None
    gpus = given if given is not None else read_local()
    if not gpus:
        return None
    libraries, archs_from = image_libraries(spec, where=where)
    return GateInput(gpus=gpus, libraries=libraries, archs_from=archs_from)


def gate_from_args(args: argparse.Namespace, *, default_archs: tuple[str, str] | None = None) -> list[Verdict] | None:
    """smoke and deploy render: raise GpuUnsupported (exit 20) for a GPU the image cannot run on."""
    gate = gate_input(args, default_archs=default_archs)
    return None if gate is None else enforce(gate.gpus, gate.libraries, gate.archs_from)


def preflight_finding(gate: GateInput) -> Finding:
    """preflight: the gate as one finding, blocking (exit 3) for a GPU the image would carry no kernels for."""
    gpus = ", ".join(f"{g.name} ({g.capability})" for g in gate.gpus)
    required = f"SASS or JIT-able PTX for each GPU in {arch_summary(gate.libraries)}"
    source = f"GPUs from {gate.gpus[0].source}; archs from {gate.archs_from}"
    try:
        enforce(gate.gpus, gate.libraries, gate.archs_from)
    except GpuUnsupported as exc:
        return blocker(
            "gpu-arch",
            gpus,
            required,
            source,
            exc.hint or "",
            message=exc.message,
        )
    return passed("gpu-arch", gpus, required, source, message="each run-host GPU has kernels in the image")


def with_finding(report: PreflightReport, finding: Finding) -> PreflightReport:
    fields = report.model_dump(exclude={"blocked", "complete", "not_evaluated", "verdict", "findings", "passed"})
    return PreflightReport.from_findings([*report.findings, *report.passed, finding], **fields)
