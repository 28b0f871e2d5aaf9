"""The GPU gate: refuse a GPU that an image has no kernels for, before vLLM dies with "no kernel image is available
for execution on the device".

The run host's GPUs come from `nvidia-smi --query-gpu=name,compute_cap --format=csv` (read live, or from a file
saved on that host), NVML through nvidia-ml-py, or a Kubernetes node's `nvidia.com/gpu.product` label. The
image's archs come from its build report (what cuobjdump read) or, before a build, from an arch list.

An nvidia-smi that answers with an error is never passed over: a saved file holding one is a usage error, and a
live one that exits non-zero leaves the gate not evaluated, with its exit status and output, and what its words
mean when Forge knows them (a driver before 510, a tool older than the kernel driver, a driver/library mismatch).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from builders.errors import ConfigError, GpuUnsupported, PreflightIncomplete, UsageError
from builders.gates.findings import Finding, PreflightReport, blocker, passed, unchecked
from builders.gpu_archs import Capability, LibraryArchs, core, declared_library
from builders.input_files import read_small_text

CSV_LIMIT_BYTES = 2**20
"""nvidia-smi's CSV is a line per GPU: a file larger than this is not one."""
REPORT_LIMIT_BYTES = 64 * 2**20


@dataclass(frozen=True, kw_only=True)
class Gpu:
    name: str
    capability: Capability
    source: str  # where it was read: nvidia-smi, a file, NVML, a node label


SMI_QUERY = ("--query-gpu=name,compute_cap", "--format=csv")

# What nvidia-smi prints instead of GPUs (on stdout), and what it means. A driver before 510 does not know the
# compute_cap field: it prints this line and a blank one and exits 2 (public reports show drivers 470.82.01 and
# 470.182.03, and a snap's 470 tool beside a 580 kernel driver). NVML's own failures come as "Failed to
# initialize NVML: <why>", exit 18 for a driver/library mismatch.
NO_COMPUTE_CAP = 'Field "compute_cap" is not a valid field to query.'
OLD_DRIVER = "needs driver 510 or later for compute_cap, or pass --gpu-product"
_NVML_FAILED = re.compile(r"Failed to initialize NVML: (.+)")
_MISMATCH = "Driver/library version mismatch"


def smi_failure(text: str) -> tuple[str, str] | None:
    """(what nvidia-smi's words mean, what to do) when its output is one of its errors; None when it is not."""
    if NO_COMPUTE_CAP in text:
        return (
            "nvidia-smi does not know the compute_cap field: it " + OLD_DRIVER,
            "upgrade the NVIDIA driver to 510 or later, or name the GPUs with --gpu-product (a node's "
            "nvidia.com/gpu.product label) instead",
        )
    failed = _NVML_FAILED.search(text)
    if failed and _MISMATCH.lower() in failed.group(1).lower():
        library = re.search(r"NVML library version: (\S+)", text)
        return (
            f"nvidia-smi cannot reach the kernel driver: {_MISMATCH}"
            + (f" (NVML library {library.group(1)})" if library else "")
            + ": the loaded kernel module is not the version of the driver's libraries",
            "reboot (or reload the nvidia kernel modules) after a driver upgrade, or pass --gpu-product",
        )
    if failed:
        return f"nvidia-smi cannot start NVML: {failed.group(1).strip()}", "check the driver, or pass --gpu-product"
    return None


def parse_nvidia_smi(text: str, *, source: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=name,compute_cap --format=csv` (header optional, noheader too)."""
    failure = smi_failure(text)
    if failure is not None:
        raise UsageError(f"{source}: {failure[0]}", hint=failure[1])
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
            raise UsageError(
                exc.message,
                hint="save the output of `nvidia-smi --query-gpu=name,compute_cap --format=csv` as it prints it; "
                "or use --gpu-product",
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


@dataclass(frozen=True, kw_only=True)
class SmiFailure:
    """A live nvidia-smi that did not list the GPUs: the gate is not evaluated, and says why."""

    command: str
    exit_status: int
    output: str
    reason: str
    remedy: str

    def describe(self) -> str:
        return f"`{self.command}` exited {self.exit_status}: {self.reason}"


# The first line of a plain `nvidia-smi`: the tool's own version, then the kernel driver's.
_HEADER = re.compile(r"NVIDIA-SMI\s+((\d+)\.[\d.]+)\s+Driver Version:\s+((\d+)\.[\d.]+)")


def _run_smi(smi: str, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([smi, *args], capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess([smi, *args], 255, "", f"could not run it: {exc}")


def _older_tool(smi: str) -> tuple[str, str] | None:
    """(tool version, kernel driver version) where the nvidia-smi on PATH is older than the driver it talks to:
    a snap or a container that brings its own nvidia-smi prints `NVIDIA-SMI 470.256.02  Driver Version:
    580.95.05`, and its 470 tool lacks compute_cap while the driver has it."""
    header = _HEADER.search(_run_smi(smi).stdout)
    if header is None:
        return None
    tool, tool_major, driver, driver_major = header.groups()
    return (tool, driver) if int(tool_major) < int(driver_major) else None


def read_local() -> list[Gpu] | SmiFailure | None:
    """This host's GPUs: nvidia-smi where it is on PATH, else NVML; None where neither is there. An nvidia-smi
    that fails is a SmiFailure, never a host without GPUs."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return read_nvml()
    command = f"nvidia-smi {' '.join(SMI_QUERY)}"
    proc = _run_smi(smi, *SMI_QUERY)
    output = (proc.stdout + proc.stderr).strip()
    failure = smi_failure(output)
    if proc.returncode == 0 and failure is None:
        try:
            return parse_nvidia_smi(proc.stdout, source="nvidia-smi")
        except UsageError as exc:
            return SmiFailure(
                command=command, exit_status=0, output=output[-2000:], reason=exc.message, remedy=exc.hint or ""
            )
    if failure is not None and NO_COMPUTE_CAP in output and (older := _older_tool(smi)):
        tool, driver = older
        failure = (
            f"the nvidia-smi on PATH ({smi}) is version {tool}, older than the kernel driver {driver}, and does "
            "not know the compute_cap field",
            f"use the nvidia-smi that came with driver {driver} (a snap or a container may bring an older one), "
            "or pass --gpu-product",
        )
    reason, remedy = failure or (
        "nvidia-smi failed, so this host's GPUs are unknown",
        "fix nvidia-smi on this host, or name the GPUs with --gpu-query FILE or --gpu-product LABEL",
    )
    return SmiFailure(
        command=command,
        exit_status=proc.returncode,
        output=output[-2000:] or "(no output)",
        reason=reason,
        remedy=remedy,
    )


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
    hint = "pass the build's reports/DISTRO-TARGET/report.json, or an arch list such as '8.0 9.0'"
    text = read_small_text(path, limit=REPORT_LIMIT_BYTES, what="--image-archs", hint=hint)
    try:
        data = json.loads(text)
    except ValueError as exc:
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
        hint = "save `nvidia-smi --query-gpu=name,compute_cap --format=csv` from the run host"
        text = read_small_text(path, limit=CSV_LIMIT_BYTES, what="--gpu-query", hint=hint)
        return parse_nvidia_smi(text, source=str(path))
    if getattr(args, "gpu_product", None):
        return [gpu_from_product(args.gpu_product)]
    return None


@dataclass(frozen=True, kw_only=True)
class GateInput:
    gpus: list[Gpu]
    libraries: list[LibraryArchs]
    archs_from: str
    unread: SmiFailure | None = None  # this host's nvidia-smi failed: the gate cannot be evaluated


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
    found = given if given is not None else read_local()
    if not found:
        return None
    libraries, archs_from = image_libraries(spec, where=where)
    if isinstance(found, SmiFailure):
        return GateInput(gpus=[], libraries=libraries, archs_from=archs_from, unread=found)
    return GateInput(gpus=found, libraries=libraries, archs_from=archs_from)


def gate_from_args(args: argparse.Namespace, *, default_archs: tuple[str, str] | None = None) -> list[Verdict] | None:
    """smoke and deploy render: raise GpuUnsupported (exit 20) for a GPU the image cannot run on, and
    PreflightIncomplete (exit 9) where this host's nvidia-smi failed and no GPU was named instead."""
    gate = gate_input(args, default_archs=default_archs)
    if gate is not None and gate.unread is not None:
        raise PreflightIncomplete(
            f"GPU gate not evaluated: {gate.unread.describe()}. nvidia-smi said: {gate.unread.output}",
            hint=gate.unread.remedy,
        )
    return None if gate is None else enforce(gate.gpus, gate.libraries, gate.archs_from)


def preflight_finding(gate: GateInput) -> Finding:
    """preflight: the gate as one finding, blocking (exit 3) for a GPU the image would carry no kernels for, not
    evaluated (exit 9) where this host's nvidia-smi failed."""
    required = f"SASS or JIT-able PTX for each GPU in {arch_summary(gate.libraries)}"
    if gate.unread is not None:
        return unchecked(
            "gpu-arch",
            f"not evaluated: {gate.unread.describe()}",
            required,
            f"this host's nvidia-smi; archs from {gate.archs_from}",
            gate.unread.remedy,
            message=f"nvidia-smi said: {gate.unread.output}",
        )
    gpus = ", ".join(f"{g.name} ({g.capability})" for g in gate.gpus)
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
