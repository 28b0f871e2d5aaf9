"""What a GPU image says of itself: the archs its kernels carry and the CUDA of its runtime, from its labels or
its build report, or an arch list given for it.

Standard library only: `forge gpu probe` reads the same reports on GPU hosts that have no pydantic.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from builders.cuda_driver import CudaVersion
from builders.errors import ForgeError, UsageError
from builders.gpu_archs import LibraryArchs, declared_library
from builders.input_files import read_small_text

REPORT_LIMIT_BYTES = 64 * 2**20

REPORT_HINT = "pass the build's reports/DISTRO-TARGET/report.json, or an arch list such as '8.0 9.0'"

# What Forge's GPU images say of themselves (builders/engines/vllm/plan.py, gpu_wheel.py): the archs their kernels
# were built or checked for, and the CUDA release of the runtime they carry. LABEL_COMPAT names NVIDIA's cuda-compat
# package where an image ships one; no image Forge builds does yet.
LABEL_ARCHS = "dev.forge.cuda.arch_list"
LABEL_CUDA = "dev.forge.cuda.version"
LABEL_COMPAT = "dev.forge.cuda.compat"
LABEL_GPU_MODE = "dev.forge.gpu.mode"


@dataclass(frozen=True, kw_only=True)
class ImageCuda:
    """The CUDA runtime an image carries: what decides the driver it needs."""

    version: CudaVersion
    source: str
    compat: bool = False  # NVIDIA's cuda-compat package is in the image (forward compatibility)


@dataclass(frozen=True, kw_only=True)
class ImageFacts:
    libraries: list[LibraryArchs]
    archs_from: str
    cuda: ImageCuda | None


def image_facts(spec: str, *, where: str = "--image-archs") -> ImageFacts:
    """--image-archs: a build's report.json (the archs cuobjdump read, the CUDA torch was built for) or an arch
    list ("7.5 8.0 9.0+PTX"), which says nothing of CUDA."""
    path = Path(spec)
    if not path.is_file():
        if re.fullmatch(r"[\d.\s;,+PTXaf]+", spec):
            library = declared_library(spec, where=where)
            return ImageFacts(
                libraries=[library], archs_from=f"{where} {spec!r} (declared, not read from binaries)", cuda=None
            )
        raise UsageError(f"--image-archs {spec}: neither a file nor an arch list", hint=REPORT_HINT)
    text = read_small_text(path, limit=REPORT_LIMIT_BYTES, what="--image-archs", hint=REPORT_HINT)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--image-archs {path}: not a readable JSON report ({exc})") from exc
    archs = data.get("cuda_archs") if isinstance(data, dict) else None
    if archs is None and isinstance(data, dict):
        # A build report keeps them in its cuda-archs test entry.
        archs = _test_data(data, "cuda-archs").get("cuda_archs")
    if not isinstance(archs, dict) or not archs:
        raise UsageError(
            f"--image-archs {path}: no cuda_archs in it",
            hint="it is written by the test stage of a GPU image built with cuobjdump (forge build debian-13 gpu-wheel)",
        )
    libs = [LibraryArchs.from_json(lib, v, where=f"{path}: cuda_archs") for lib, v in archs.items()]
    return ImageFacts(libraries=libs, archs_from=f"{path} (read by cuobjdump)", cuda=_report_cuda(data, path))


def image_libraries(spec: str, *, where: str = "--image-archs") -> tuple[list[LibraryArchs], str]:
    facts = image_facts(spec, where=where)
    return facts.libraries, facts.archs_from


def _test_data(report: dict[str, object], name: str) -> dict[str, object]:
    tests = [t for t in report.get("tests") or () if isinstance(t, dict) and t.get("name") == name]  # type: ignore[attr-defined]
    data = tests[0].get("data") if tests else None
    return data if isinstance(data, dict) else {}


def _report_cuda(report: object, path: Path) -> ImageCuda | None:
    """The CUDA the image's torch was built for, as its test stage read it (torch.version.cuda)."""
    if not isinstance(report, dict):
        return None
    value = report.get("cuda_runtime") or _test_data(report, "cuda-libs-load").get("cuda_runtime")
    if not isinstance(value, str):
        return None
    try:
        return ImageCuda(version=CudaVersion.parse(value), source=f"{path} (torch.version.cuda in the image)")
    except ValueError as exc:
        raise UsageError(f"--image-archs {path}: cuda_runtime: {exc}") from exc


def is_gpu_image(labels: Mapping[str, str]) -> bool:
    return LABEL_GPU_MODE in labels or any(key.startswith("dev.forge.cuda.") for key in labels)


def image_facts_from_labels(labels: Mapping[str, str], *, ref: str) -> ImageFacts | None:
    """An image's own word: None for an image without GPU labels (a CPU image); a usage error for a GPU image whose
    labels do not say which archs it carries."""
    if not is_gpu_image(labels):
        return None
    arch_list = labels.get(LABEL_ARCHS, "").strip()
    if not arch_list:
        raise UsageError(
            f"{ref} is a GPU image ({', '.join(k for k in sorted(labels) if k.startswith('dev.forge.'))[:200]}) but "
            f"has no {LABEL_ARCHS} label to say which GPUs its kernels run on",
            hint="pass --image-archs with its build's reports/DISTRO-TARGET/report.json (the archs cuobjdump read), "
            "or the arch list it was built for; images Forge builds for GPUs carry the label",
        )
    where = f"{ref} label {LABEL_ARCHS}"
    library = declared_library(arch_list, where=where)
    cuda = None
    if labels.get(LABEL_CUDA, "").strip():
        try:
            version = CudaVersion.parse(labels[LABEL_CUDA])
        except ValueError as exc:
            raise UsageError(f"{ref} label {LABEL_CUDA}: {exc}", hint="pass --image-cuda MAJOR.MINOR") from exc
        cuda = ImageCuda(
            version=version, source=f"{ref} label {LABEL_CUDA}", compat=bool(labels.get(LABEL_COMPAT, "").strip())
        )
    return ImageFacts(libraries=[library], archs_from=f"{where} {arch_list!r} (checked by its test stage)", cuda=cuda)


@dataclass(frozen=True, kw_only=True)
class LabelsRead:
    """An image's labels as the local container engine gave them; labels None with `error` saying why not."""

    ref: str
    labels: dict[str, str] | None
    error: str | None = None


def read_image_labels(ref: str, labels_of: Callable[[str], Mapping[str, str]]) -> LabelsRead:
    """`labels_of` is the container engine's (Engine.image_info(ref).labels); an engine that is not there or an
    image it does not hold is said, not raised: the caller decides whether that matters."""
    try:
        return LabelsRead(ref=ref, labels=dict(labels_of(ref)))
    except ForgeError as exc:
        return LabelsRead(ref=ref, labels=None, error=exc.message)
