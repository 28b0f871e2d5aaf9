"""The GPU gate: refuse a GPU that an image has no kernels for, before vLLM dies with "no kernel image is available
for execution on the device", and a driver older than the image's CUDA runtime accepts, before it dies with "The
NVIDIA driver on your system is too old".

The run host's GPUs come from `nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv`
(read live, or from a file saved on that host), NVML through nvidia-ml-py, a Kubernetes node's GPU Feature Discovery
labels, or its `nvidia.com/gpu.product` label alone. The image's archs and CUDA come from its labels
(`dev.forge.cuda.arch_list`, `dev.forge.cuda.version`), its build report (what cuobjdump read, the CUDA torch was
built for) or, before a build, from an arch list and the recipe's CUDA.

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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from builders.cuda_driver import (
    MINOR_COMPAT_MINIMUM,
    CudaVersion,
    DriverCheck,
    DriverVersion,
    check_driver,
    highest_cuda,
    is_datacentre,
)
from builders.errors import ConfigError, GpuDriverTooOld, GpuUnsupported, PreflightIncomplete, UsageError
from builders.gates.findings import Finding, PreflightReport, blocker, passed, unchecked
from builders.gpu_archs import Capability, LibraryArchs, core
from builders.gpu_image import (
    LABEL_ARCHS,
    LABEL_CUDA,
    ImageCuda,
    ImageFacts,
    LabelsRead,
    image_facts,
    image_facts_from_labels,
)
from builders.input_files import read_small_text

CSV_LIMIT_BYTES = 2**20
"""nvidia-smi's CSV is a line per GPU: a file larger than this is not one."""


QUERY = "name,compute_cap,driver_version,memory.total"
"""The fields Forge asks nvidia-smi for, in this order; a file of only the first two is read too."""
SAVE_HINT = f"save `nvidia-smi --query-gpu={QUERY} --format=csv` from the run host"
SMI_QUERY = (f"--query-gpu={QUERY}", "--format=csv")

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


@dataclass(frozen=True, kw_only=True)
class Gpu:
    name: str
    capability: Capability
    source: str  # where it was read: nvidia-smi, a file, NVML, a node label
    driver: DriverVersion | None = None
    memory_mib: int | None = None
    cuda: CudaVersion | None = None  # the newest CUDA its driver runs, where the source says (NVML, GFD)


# nvidia-smi's CSV header names, as it prints them for --query-gpu (memory.total carries its unit).
_COLUMNS = {"name": "name", "compute_cap": "cap", "driver_version": "driver", "memory.total [mib]": "memory"}
_FIELDS = {column: field.split(" ")[0] for field, column in _COLUMNS.items()}


def _columns(fields: list[str]) -> list[str] | None:
    """The columns a header line names, or None when the line is not a header."""
    names = [f.strip().lower() for f in fields]
    if not names or names[0] != "name":
        return None
    return [_COLUMNS.get(n, n) for n in names]


def parse_nvidia_smi(text: str, *, source: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=name,compute_cap[,driver_version,memory.total] --format=csv` (header optional)."""
    failure = smi_failure(text)
    if failure is not None:
        raise UsageError(f"{source}: {failure[0]}", hint=failure[1])
    gpus: list[Gpu] = []
    columns = ["name", "cap"]
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        header = _columns(line.split(","))
        if header is not None:
            columns = header
            continue
        where = f"{source}:{number}"
        # A header-less file of four fields is the full query; a name may itself hold commas, so fields are
        # taken from the right.
        if len(columns) == 2 and line.count(",") == 3 and line.rstrip().endswith("MiB"):
            columns = ["name", "cap", "driver", "memory"]
        parts = line.rsplit(",", len(columns) - 1)
        if len(parts) != len(columns) or not parts[0].strip() or "cap" not in columns:
            raise UsageError(
                f"{where}: {line.strip()!r} is not a `{', '.join(_FIELDS.get(c, c) for c in columns)}` line",
                hint=SAVE_HINT,
            )
        row = dict(zip(columns, (p.strip() for p in parts), strict=True))
        try:
            capability = Capability.parse(row["cap"], where=where)
        except ConfigError as exc:
            raise UsageError(
                exc.message,
                hint=f"save the output of `nvidia-smi --query-gpu={QUERY} --format=csv` as it prints it; "
                "or use --gpu-product",
            ) from exc
        driver = _driver(row.get("driver"), where=where)
        memory = re.fullmatch(r"(\d+)\s*MiB", row.get("memory", ""))
        gpus.append(
            Gpu(
                name=row["name"],
                capability=capability,
                source=source,
                driver=driver,
                memory_mib=int(memory[1]) if memory else None,
            )
        )
    if not gpus:
        raise UsageError(
            f"{source}: no GPU listed", hint="the run host's nvidia-smi sees no GPU: is the driver loaded?"
        )
    return gpus


def _driver(text: str | None, *, where: str) -> DriverVersion | None:
    if text is None or text in ("", "[N/A]"):
        return None
    try:
        return DriverVersion.parse(text)
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}", hint=SAVE_HINT) from exc


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


# GPU Feature Discovery's node labels (NVIDIA/k8s-device-plugin, docs/gpu-feature-discovery/README.md, "Generated
# Labels"): the driver and the newest CUDA it runs under both the deprecated names and their newer spelling, and the
# compute capability. Each pair is (newer, deprecated): a node of an older GFD carries only the second.
GFD_DRIVER = (
    ("nvidia.com/cuda.driver-version.major", "nvidia.com/cuda.driver.major"),
    ("nvidia.com/cuda.driver-version.minor", "nvidia.com/cuda.driver.minor"),
    ("nvidia.com/cuda.driver-version.revision", "nvidia.com/cuda.driver.rev"),
)
GFD_RUNTIME = (
    ("nvidia.com/cuda.runtime-version.major", "nvidia.com/cuda.runtime.major"),
    ("nvidia.com/cuda.runtime-version.minor", "nvidia.com/cuda.runtime.minor"),
)
GFD_COMPUTE = ("nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor")
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_COUNT = "nvidia.com/gpu.count"
LABELS_HINT = (
    "save a node's labels: `kubectl get node NODE -o jsonpath='{.metadata.labels}'` (JSON), or one key=value a line"
)


def parse_node_labels(text: str, *, source: str) -> dict[str, str]:
    """A node's labels: the JSON object kubectl prints, `key=value` lines, or `kubectl get node --show-labels`'
    comma-separated pairs."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except ValueError as exc:
            raise UsageError(f"{source}: not a JSON object of labels ({exc})", hint=LABELS_HINT) from exc
        if not isinstance(data, dict):
            raise UsageError(f"{source}: not a JSON object of labels", hint=LABELS_HINT)
        return {str(k): str(v) for k, v in data.items()}
    labels: dict[str, str] = {}
    for number, line in enumerate(stripped.splitlines(), 1):
        for pair in line.split(","):
            if not pair.strip():
                continue
            key, sep, value = pair.strip().partition("=")
            if not sep or not key:
                raise UsageError(f"{source}:{number}: {pair.strip()!r} is not key=value", hint=LABELS_HINT)
            labels[key] = value
    return labels


def gpus_from_node_labels(labels: Mapping[str, str], *, source: str) -> list[Gpu]:
    """The node's GPUs as GFD labels them: one entry per `nvidia.com/gpu.count` (they are alike by GFD's rules)."""

    def first(*keys: str) -> str | None:
        return next((labels[k] for k in keys if labels.get(k, "").strip()), None)

    def number(*keys: str) -> int | None:
        value = first(*keys)
        if value is None:
            return None
        if not value.strip().isdigit():
            raise UsageError(f"{source}: {keys[0]}={value!r} is not a whole number", hint=LABELS_HINT)
        return int(value)

    product = first(GFD_PRODUCT)
    major, minor = number(GFD_COMPUTE[0]), number(GFD_COMPUTE[1])
    if major is not None and minor is not None:
        capability = Capability(major, minor)
        name = product or f"GPU of compute capability {capability}"
    elif product is not None:
        from_product = gpu_from_product(product)
        capability, name = from_product.capability, from_product.name
    else:
        raise UsageError(
            f"{source}: no {GFD_PRODUCT} or {GFD_COMPUTE[0]} label: not a GPU node labelled by GPU Feature Discovery",
            hint=LABELS_HINT,
        )
    parts = [number(*pair) for pair in GFD_DRIVER]
    driver = DriverVersion(parts[0], parts[1] or 0, parts[2] or 0) if parts[0] is not None else None
    runtime = [number(*pair) for pair in GFD_RUNTIME]
    cuda = CudaVersion(runtime[0], runtime[1] or 0) if runtime[0] is not None else None
    gpu = Gpu(name=name, capability=capability, source=f"{source} (node labels)", driver=driver, cuda=cuda)
    return [gpu] * max(1, number(GFD_COUNT) or 1)


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
        version = pynvml.nvmlSystemGetDriverVersion()
        driver = DriverVersion.parse(version.decode() if isinstance(version, bytes) else str(version))
        # The newest CUDA the driver runs, as 13000 for 13.0 (what nvidia-smi prints as "CUDA Version").
        cuda = CudaVersion.parse(str(pynvml.nvmlSystemGetCudaDriverVersion()))
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
                    driver=driver,
                    memory_mib=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // 2**20,
                    cuda=cuda,
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


@dataclass(frozen=True, kw_only=True)
class Verdict:
    gpu: Gpu
    runs: dict[str, str | None]  # core library → how its kernels reach the GPU, None where they cannot
    driver: DriverCheck | None = None
    driver_note: str = ""  # why the driver was not judged, where it was not

    @property
    def supported(self) -> bool:
        return all(v is not None for v in self.runs.values())

    def lines(self) -> list[str]:
        """What smoke and deploy render print for a GPU that passed."""
        out = [f"GPU gate: {self.gpu.name} ({self.gpu.capability}) runs on the image's kernels"]
        if self.driver is not None and self.driver.ok:
            out.append(
                f"GPU gate: driver {self.driver.driver} runs the image's CUDA {self.driver.cuda}: {self.driver.how}"
                + (f" ({self.driver.limits})" if self.driver.limits else "")
            )
        else:
            out.append(f"GPU gate: driver not checked: {self.driver_note}")
        return out


def judge(gpus: list[Gpu], libraries: list[LibraryArchs], cuda: ImageCuda | None = None) -> list[Verdict]:
    libs = core(libraries)
    if not libs:
        raise UsageError("the image's arch list holds no library with device code: nothing to judge a GPU by")
    verdicts = []
    for g in gpus:
        runs = {lib.library: lib.runs_on(g.capability) for lib in libs}
        check, note = _driver_check(g, cuda)
        verdicts.append(Verdict(gpu=g, runs=runs, driver=check, driver_note=note))
    return verdicts


def _driver_check(gpu: Gpu, cuda: ImageCuda | None) -> tuple[DriverCheck | None, str]:
    if cuda is None:
        return None, (
            "the image's CUDA is not known (no dev.forge.cuda.version label or report; pass --image-cuda MAJOR.MINOR)"
        )
    if gpu.driver is None:
        return None, (
            f"{gpu.source} does not give the driver's version: pass --gpu-query with the driver_version field "
            "or --node-labels with GPU Feature Discovery's labels"
        )
    check = check_driver(gpu.driver, cuda.version, compat_package=cuda.compat, datacentre=is_datacentre(gpu.name))
    return check, "" if check.ok is not None else check.how


def arch_summary(libraries: list[LibraryArchs]) -> str:
    parts = []
    for lib in core(libraries):
        j = lib.to_json()
        parts.append(f"{lib.library}: SASS {' '.join(j['sass']) or 'none'}; PTX {' '.join(j['ptx']) or 'none'}")
    return " | ".join(parts)


def enforce(
    gpus: list[Gpu], libraries: list[LibraryArchs], archs_from: str, cuda: ImageCuda | None = None
) -> list[Verdict]:
    """Raise GpuUnsupported naming the first refused GPU, its capability and the image's archs, or GpuDriverTooOld
    naming its driver and the image's CUDA."""
    verdicts = judge(gpus, libraries, cuda)
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
    too_old = [v for v in verdicts if v.driver is not None and v.driver.ok is False]
    if too_old:
        message, hint = driver_refusal(too_old[0], cuda)
        raise GpuDriverTooOld(message, hint=hint)
    return verdicts


def driver_refusal(verdict: Verdict, cuda: ImageCuda | None) -> tuple[str, str]:
    check = verdict.driver
    assert check is not None and cuda is not None
    gpu = verdict.gpu
    runs = gpu.cuda or highest_cuda(check.driver)
    minimum = MINOR_COMPAT_MINIMUM.get(check.cuda.major)
    message = (
        f"{gpu.name} (from {gpu.source}) has driver {check.driver}, and the image's CUDA {check.cuda} runtime (from "
        f"{cuda.source}) needs {check.required}: {check.how}"
    )
    hint = (
        f"upgrade the run host's NVIDIA driver to {minimum or check.required} or later, or run an image built for the "
        f"CUDA this driver runs ({f'CUDA {runs} or older' if runs else 'an older CUDA'}): a source build on a CUDA "
        "base of that release"
    )
    return message, hint


def add_gpu_gate_args(p: argparse.ArgumentParser) -> None:
    """The run host's GPUs and the image's archs and CUDA, shared by preflight, smoke and deploy render."""
    g = p.add_argument_group(
        "GPU gate (refuses a GPU the image has no kernels for, or a driver too old for its CUDA; exit 20)"
    )
    g.add_argument(
        "--gpu-query",
        default=None,
        metavar="FILE",
        help=f"the run host's `nvidia-smi --query-gpu={QUERY} --format=csv` saved to FILE "
        "(default: this host's nvidia-smi or NVML, when present)",
    )
    g.add_argument(
        "--gpu-product",
        default=None,
        metavar="LABEL",
        help="a Kubernetes node's nvidia.com/gpu.product label value, e.g. NVIDIA-H100-80GB-HBM3 (no driver)",
    )
    g.add_argument(
        "--node-labels",
        default=None,
        metavar="FILE",
        help="a Kubernetes node's labels saved to FILE (`kubectl get node NODE -o jsonpath='{.metadata.labels}'`): "
        "GPU Feature Discovery's compute capability, driver and CUDA",
    )
    g.add_argument(
        "--image-archs",
        default=None,
        metavar="REPORT_OR_LIST",
        help="the GPU image's build report.json (archs read by cuobjdump) or an arch list such as '8.0 9.0+PTX' "
        f"(default: the image's {LABEL_ARCHS} label, where the image is local)",
    )
    g.add_argument(
        "--image-cuda",
        default=None,
        metavar="MAJOR.MINOR",
        help=f"the CUDA release of the image's runtime (default: its {LABEL_CUDA} label or its report)",
    )


def gpus_of(args: argparse.Namespace) -> list[Gpu] | None:
    given = [f for f in ("gpu_query", "gpu_product", "node_labels") if getattr(args, f, None)]
    if len(given) > 1:
        flags = " and ".join("--" + f.replace("_", "-") for f in given)
        raise UsageError(f"{flags} both given", hint="name the run host's GPUs one way")
    if getattr(args, "gpu_query", None):
        path = Path(args.gpu_query)
        text = read_small_text(path, limit=CSV_LIMIT_BYTES, what="--gpu-query", hint=SAVE_HINT)
        return parse_nvidia_smi(text, source=str(path))
    if getattr(args, "node_labels", None):
        path = Path(args.node_labels)
        text = read_small_text(path, limit=CSV_LIMIT_BYTES, what="--node-labels", hint=LABELS_HINT)
        return gpus_from_node_labels(parse_node_labels(text, source=str(path)), source=str(path))
    if getattr(args, "gpu_product", None):
        return [gpu_from_product(args.gpu_product)]
    return None


@dataclass(frozen=True, kw_only=True)
class GateInput:
    gpus: list[Gpu]
    libraries: list[LibraryArchs]
    archs_from: str
    cuda: ImageCuda | None = None
    unread: SmiFailure | None = None  # this host's nvidia-smi failed: the gate cannot be evaluated


def gate_input(
    args: argparse.Namespace,
    *,
    default_archs: tuple[str, str] | None = None,
    default_cuda: tuple[str, str] | None = None,
    image: LabelsRead | None = None,
) -> GateInput | None:
    """What the gate judges; None when there is nothing to judge.

    The image's archs come from --image-archs, else its labels (`image`, read by the caller's engine), else
    `default_archs` (arch list, where it comes from). Its CUDA from --image-cuda, else the same report or labels,
    else `default_cuda` (version, where it comes from). GPUs named on the command line with no archs to judge them
    by are a usage error; GPUs merely found on this host are not judged then (the image may be a CPU image)."""
    given = gpus_of(args)
    facts: ImageFacts | None = None
    if getattr(args, "image_archs", None):
        facts = image_facts(args.image_archs)
    elif image is not None and image.labels is not None:
        facts = image_facts_from_labels(image.labels, ref=image.ref)
    elif default_archs is not None and default_archs[0]:
        facts = image_facts(default_archs[0], where=default_archs[1])
    if facts is None:
        if given is not None:
            unread = f" ({image.ref}'s labels were not read: {image.error})" if image and image.error else ""
            raise UsageError(
                f"the run host's GPUs were given, but not the image's archs{unread}",
                hint="add --image-archs reports/DISTRO-TARGET/report.json (or an arch list such as '8.0 9.0'), or "
                "give an image built by Forge for GPUs, whose labels carry them",
            )
        return None
    found = given if given is not None else read_local()
    if not found:
        return None
    cuda = facts.cuda
    if getattr(args, "image_cuda", None):
        cuda = ImageCuda(version=_cuda_flag(args.image_cuda), source="--image-cuda", compat=bool(cuda and cuda.compat))
    elif cuda is None and default_cuda is not None:
        cuda = ImageCuda(version=_cuda_flag(default_cuda[0], where=default_cuda[1]), source=default_cuda[1])
    if isinstance(found, SmiFailure):
        return GateInput(gpus=[], libraries=facts.libraries, archs_from=facts.archs_from, cuda=cuda, unread=found)
    return GateInput(gpus=found, libraries=facts.libraries, archs_from=facts.archs_from, cuda=cuda)


def _cuda_flag(text: str, *, where: str = "--image-cuda") -> CudaVersion:
    try:
        return CudaVersion.parse(text)
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}", hint="give the CUDA release as MAJOR.MINOR, e.g. 13.0") from exc


def gate_from_args(
    args: argparse.Namespace,
    *,
    default_archs: tuple[str, str] | None = None,
    image: LabelsRead | None = None,
) -> list[Verdict] | None:
    """smoke and deploy render: raise GpuUnsupported or GpuDriverTooOld (exit 20) for a GPU the image cannot run on,
    and PreflightIncomplete (exit 9) where this host's nvidia-smi failed and no GPU was named instead."""
    gate = gate_input(args, default_archs=default_archs, image=image)
    if gate is not None and gate.unread is not None:
        raise PreflightIncomplete(
            f"GPU gate not evaluated: {gate.unread.describe()}. nvidia-smi said: {gate.unread.output}",
            hint=gate.unread.remedy,
        )
    return None if gate is None else enforce(gate.gpus, gate.libraries, gate.archs_from, gate.cuda)


def preflight_findings(gate: GateInput) -> list[Finding]:
    """preflight: the gate as two findings, `gpu-arch` and `gpu-driver`, each blocking (exit 3) where smoke would
    refuse with exit 20; a driver preflight cannot know is not evaluated, never passed."""
    return [preflight_finding(gate), driver_finding(gate)]


def preflight_finding(gate: GateInput) -> Finding:
    """preflight: the arch gate as one finding, blocking (exit 3) for a GPU the image would carry no kernels for, not
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


def driver_finding(gate: GateInput) -> Finding:
    if gate.unread is not None:
        return unchecked(
            "gpu-driver",
            f"not evaluated: {gate.unread.describe()}",
            "a driver the image's CUDA runtime starts on",
            "this host's nvidia-smi",
            gate.unread.remedy,
        )
    verdicts = judge(gate.gpus, gate.libraries, gate.cuda)
    drivers = ", ".join(dict.fromkeys(f"{v.gpu.name}: driver {v.gpu.driver or 'unknown'}" for v in verdicts))
    cuda = f"CUDA {gate.cuda.version}" if gate.cuda else "CUDA unknown"
    source = f"GPUs from {gate.gpus[0].source}; {cuda} from {gate.cuda.source if gate.cuda else 'nowhere'}; "
    source += "minimums: builders/cuda_driver.py (NVIDIA's CUDA release notes and CUDA Compatibility guide)"
    unknown = [v for v in verdicts if v.driver is None or v.driver.ok is None]
    if unknown:
        return unchecked(
            "gpu-driver",
            f"not evaluated: {unknown[0].driver_note}",
            "a driver the image's CUDA runtime starts on",
            source,
            unknown[0].driver_note,
        )
    checks = [v.driver for v in verdicts if v.driver is not None]
    required = checks[0].required
    refused = [v for v in verdicts if v.driver is not None and v.driver.ok is False]
    if refused:
        message, hint = driver_refusal(refused[0], gate.cuda)
        return blocker("gpu-driver", drivers, required, source, hint, message=message)
    limits = next((c.limits for c in checks if c.limits), None)
    return passed(
        "gpu-driver",
        drivers,
        required,
        source,
        message=f"each run-host driver runs {cuda}: {checks[0].how}" + (f" ({limits})" if limits else ""),
    )


def with_finding(report: PreflightReport, *findings: Finding) -> PreflightReport:
    fields = report.model_dump(exclude={"blocked", "complete", "not_evaluated", "verdict", "findings", "passed"})
    return PreflightReport.from_findings([*report.findings, *report.passed, *findings], **fields)
