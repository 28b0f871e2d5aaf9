"""Which NVIDIA driver an image's CUDA runtime needs, and whether a host's driver is one.

Standard library only: `forge gpu probe` imports it on GPU hosts that have no pydantic.

The facts are NVIDIA's, kept here as data:
- CUDA Toolkit Release Notes, section "CUDA Driver", Table 3 "CUDA Toolkit and Corresponding Driver Versions"
  (https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html, and the per-release pages under
  https://docs.nvidia.com/cuda/archive/): the Linux x86_64 driver each toolkit release shipped with. A runtime of
  that release has its whole feature set on that driver or a newer one.
- CUDA Compatibility, "Minor Version Compatibility", Table 1
  (https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html): from CUDA 11 on, a runtime
  of any minor release of a major runs on the major's minimum driver (13.x: >= 580, 12.x: >= 525, 11.x: >= 450),
  "with limited feature-set". The release notes give the exact minimums of 12.x (525.60.13) and 11.x (450.80.02).
- CUDA Compatibility, "Forward Compatibility"
  (https://docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html): a runtime newer than the
  driver's major runs on it only through the cuda-compat-<major>-<minor> package in the image, and only on NVIDIA
  data-centre GPUs (and select NGC-ready RTX SKUs and Jetson boards, which Forge does not name).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class DriverVersion:
    """An NVIDIA Linux driver version: 580.159.04 (branch 580, minor 159, revision 04)."""

    major: int
    minor: int = 0
    rev: int = 0

    @classmethod
    def parse(cls, text: str) -> DriverVersion:
        m = re.fullmatch(r"\s*(\d{2,4})(?:\.(\d{1,4}))?(?:\.(\d{1,4}))?\s*", text)
        if not m:
            raise ValueError(f"{text!r} is not an NVIDIA driver version such as 580.159.04")
        return cls(int(m[1]), int(m[2] or 0), int(m[3] or 0))

    def __str__(self) -> str:
        # Revisions are two digits in NVIDIA's own spelling (580.159.04); a version given as 580 stays 580.
        if not (self.minor or self.rev):
            return str(self.major)
        return f"{self.major}.{self.minor:02d}" + (f".{self.rev:02d}" if self.rev else "")


@dataclass(frozen=True, order=True)
class CudaVersion:
    """A CUDA release as major.minor: 13.0."""

    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> CudaVersion:
        """13.0, 13.0.2 (the update is dropped), cu130 / torch's 2.14.0+cu130 local label, or NVML's 13000."""
        text = text.strip()
        m = re.fullmatch(r"(\d{1,2})\.(\d{1,2})(?:\.\d+)?", text)
        if m:
            return cls(int(m[1]), int(m[2]))
        m = re.fullmatch(r"(?:.*\+)?cu(\d{1,2})(\d)", text)
        if m:
            return cls(int(m[1]), int(m[2]))
        m = re.fullmatch(r"(\d{1,2})0(\d)0", text)
        if m:
            return cls(int(m[1]), int(m[2]))
        raise ValueError(f"{text!r} is not a CUDA version such as 13.0, cu130 or 13000")

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


def _table(rows: str) -> dict[CudaVersion, DriverVersion]:
    out = {}
    for row in rows.split(";"):
        cuda, driver = row.split()
        out[CudaVersion.parse(cuda)] = DriverVersion.parse(driver)
    return out


# Table 3, Linux x86_64, the GA release of each minor (its updates ship newer drivers, so GA's is the least a
# release of that minor needs). The driver an image's CUDA needs for its whole feature set.
SHIPPED_WITH: dict[CudaVersion, DriverVersion] = _table(
    "11.0 450.51.05; 11.1 455.23; 11.2 460.27.03; 11.3 465.19.01; 11.4 470.42.01; 11.5 495.29.05; 11.6 510.39.01;"
    "11.7 515.43.04; 11.8 520.61.05; 12.0 525.60.13; 12.1 530.30.02; 12.2 535.54.03; 12.3 545.23.06;"
    "12.4 550.54.14; 12.5 555.42.02; 12.6 560.28.03; 12.8 570.26; 12.9 575.51.03; 13.0 580.65.06;"
    "13.1 590.44.01"
)

# Minor Version Compatibility, Table 1 (the release notes' Table 2 gives 12.x's and 11.x's exact versions).
MINOR_COMPAT_MINIMUM: dict[int, DriverVersion] = {
    11: DriverVersion(450, 80, 2),
    12: DriverVersion(525, 60, 13),
    13: DriverVersion(580),
}
# Forward compatibility lifts a driver of an older major that CUDA 11 or later already runs on.
FORWARD_BASE_MINIMUM = MINOR_COMPAT_MINIMUM[11]

# A data-centre part, by the names nvidia-smi and GPU Feature Discovery give them (NVIDIA H200, Tesla-T4,
# NVIDIA-A100-SXM4-80GB): the only GPUs forward compatibility is supported on. GeForce, Quadro and the RTX
# workstation cards are not.
_DATACENTRE = re.compile(
    r"\b(?:Tesla|GB[23]00|GH200|B[123]00|H[12]00|H800|H20|A100|A800|A30|A40|A10G?|A16|A2|L40S?|L4|L20|T4|V100|P100"
    r"|P40|P4)\b",
    re.IGNORECASE,
)
_NOT_DATACENTRE = re.compile(r"GeForce|Quadro|TITAN|RTX", re.IGNORECASE)


def is_datacentre(gpu_name: str) -> bool:
    return bool(_DATACENTRE.search(gpu_name)) and not _NOT_DATACENTRE.search(gpu_name)


def highest_cuda(driver: DriverVersion) -> CudaVersion | None:
    """The newest CUDA release whose whole feature set this driver has (nvidia-smi's "CUDA Version")."""
    shipped = [cuda for cuda, needs in SHIPPED_WITH.items() if driver >= needs]
    return max(shipped) if shipped else None


@dataclass(frozen=True, kw_only=True)
class DriverCheck:
    """Whether a runtime of CUDA `cuda` starts on `driver`: ok None where Forge has no fact to judge by."""

    driver: DriverVersion
    cuda: CudaVersion
    ok: bool | None
    required: str  # "≥ 580 (CUDA 13.x, minor-version compatibility)"
    how: str  # how it runs, or why not
    limits: str | None = None  # what minor-version or forward compatibility leaves out


def check_driver(driver: DriverVersion, cuda: CudaVersion, *, compat_package: bool, datacentre: bool) -> DriverCheck:
    shipped = SHIPPED_WITH.get(cuda)
    minimum = MINOR_COMPAT_MINIMUM.get(cuda.major)
    if minimum is not None:
        required = f"≥ {minimum} (CUDA {cuda.major}.x through minor-version compatibility)"
    elif shipped is not None:
        required = f"≥ {shipped} (CUDA {cuda}; before CUDA 11 a runtime needs its own release's driver)"
    else:
        return DriverCheck(
            driver=driver,
            cuda=cuda,
            ok=None,
            required=f"a driver for CUDA {cuda}",
            how=f"Forge's table of NVIDIA's release notes has no CUDA {cuda.major}.x: update builders/cuda_driver.py",
        )
    if shipped is not None and driver >= shipped:
        return DriverCheck(
            driver=driver, cuda=cuda, ok=True, required=required, how=f"the driver CUDA {cuda} shipped with or newer"
        )
    if minimum is not None and driver >= minimum:
        return DriverCheck(
            driver=driver,
            cuda=cuda,
            ok=True,
            required=required,
            how=f"minor-version compatibility within CUDA {cuda.major}.x",
            limits=f"driver {driver} is older than CUDA {cuda}'s own ({shipped or 'not in the table'}): PTX from a "
            "newer toolkit than the driver does not JIT, and features newer than the driver are missing",
        )
    if compat_package and minimum is not None:
        if not datacentre:
            how = "the image ships NVIDIA's compat package, but forward compatibility runs on data-centre GPUs only"
        elif driver < FORWARD_BASE_MINIMUM:
            how = f"driver {driver} is older than any driver forward compatibility starts from (CUDA 11's)"
        else:
            return DriverCheck(
                driver=driver,
                cuda=cuda,
                ok=True,
                required=required,
                how="forward compatibility: the image's cuda-compat package on a data-centre GPU",
                limits="NVIDIA supports it on its maintained driver branches only, and some features need the "
                "kernel driver's own support",
            )
        return DriverCheck(driver=driver, cuda=cuda, ok=False, required=required, how=how)
    return DriverCheck(
        driver=driver,
        cuda=cuda,
        ok=False,
        required=required,
        how=f"driver {driver} is older than CUDA {cuda} accepts: the runtime stops at start-up "
        '("The NVIDIA driver on your system is too old")',
    )


def ptx_jits(driver_cuda: CudaVersion, ptx_from: CudaVersion) -> bool:
    """Whether a driver whose newest CUDA is `driver_cuda` can JIT PTX that toolkit `ptx_from` wrote: each release
    writes its own PTX ISA version, and a driver refuses a newer one (CUDA_ERROR_UNSUPPORTED_PTX_VERSION), which is
    what minor-version compatibility leaves out."""
    return ptx_from <= driver_cuda
