"""The driver gate: NVIDIA's driver minimums as data, the driver read from nvidia-smi and GFD node labels, and old
drivers refused against the CUDA 13.0 of the gpu-wheel image (torch 2.14.0+cu130) with both versions named."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_data import vllm_libraries

from builders.cuda_driver import (
    MINOR_COMPAT_MINIMUM,
    SHIPPED_WITH,
    CudaVersion,
    DriverVersion,
    check_driver,
    highest_cuda,
    is_datacentre,
    ptx_jits,
)
from builders.errors import GpuDriverTooOld, UsageError
from builders.gpu_archs import Capability
from builders.gpu_image import LABEL_ARCHS, LABEL_CUDA, ImageCuda, image_facts_from_labels
from builders.preflight.gpu_gate import (
    enforce,
    gpus_from_node_labels,
    parse_node_labels,
    parse_nvidia_smi,
)

DATA = Path(__file__).parent / "data"
SMI = DATA / "nvidia-smi"
LABELS = DATA / "node-labels"
CUDA13 = ImageCuda(version=CudaVersion(13, 0), source="test")


def smi(name: str) -> list:  # type: ignore[type-arg]
    path = SMI / name
    return parse_nvidia_smi(path.read_text(), source=name)


def test_versions_parse_as_nvidia_writes_them() -> None:
    assert DriverVersion.parse("580.159.04") == DriverVersion(580, 159, 4)
    assert str(DriverVersion.parse("580.159.04")) == "580.159.04"
    assert str(DriverVersion.parse("570.26")) == "570.26"
    assert DriverVersion.parse("525.60.13") > DriverVersion.parse("525.60.2")
    assert CudaVersion.parse("2.14.0+cu130") == CudaVersion(13, 0)
    assert CudaVersion.parse("cu128") == CudaVersion(12, 8)
    assert CudaVersion.parse("13000") == CudaVersion(13, 0)  # NVML's nvmlSystemGetCudaDriverVersion
    assert CudaVersion.parse("12.9.1") == CudaVersion(12, 9)
    for bad in ("580.x", "driver", ""):
        with pytest.raises(ValueError):
            DriverVersion.parse(bad)
    with pytest.raises(ValueError):
        CudaVersion.parse("thirteen")


def test_the_release_table_only_ever_asks_more_of_a_driver() -> None:
    # A later CUDA release never ships with an older driver; a slip in typing the table breaks this.
    releases = sorted(SHIPPED_WITH)
    drivers = [SHIPPED_WITH[c] for c in releases]
    assert drivers == sorted(drivers), list(zip(releases, drivers, strict=True))
    # Each major's minor-version minimum is at most what its first release shipped with; CUDA 11.0 is NVIDIA's
    # own exception ("CUDA 11.0 was released with an earlier driver version").
    for major, minimum in MINOR_COMPAT_MINIMUM.items():
        first = min(c for c in SHIPPED_WITH if c.major == major)
        assert (minimum <= SHIPPED_WITH[first]) is (major != 11), major
    assert SHIPPED_WITH[CudaVersion(13, 0)] == DriverVersion(580, 65, 6)


@pytest.mark.parametrize(
    ("driver", "cuda", "ok", "how"),
    [
        ("580.159.04", "13.0", True, "shipped with"),  # the captured H200
        ("580.65.06", "13.1", True, "minor-version compatibility"),
        ("575.51.03", "13.0", False, "too old"),  # CUDA 12.9's driver
        ("570.133.20", "12.9", True, "minor-version compatibility"),
        ("525.60.13", "12.8", True, "minor-version compatibility"),
        ("525.60.12", "12.0", False, "too old"),
        ("450.80.02", "11.8", True, "minor-version compatibility"),
        ("450.51.05", "11.0", True, "shipped with"),
        ("450.51.05", "11.1", False, "too old"),
    ],
)
def test_driver_against_cuda(driver: str, cuda: str, ok: bool, how: str) -> None:
    check = check_driver(DriverVersion.parse(driver), CudaVersion.parse(cuda), compat_package=False, datacentre=True)
    assert check.ok is ok and how in check.how, check
    if ok and "minor" in how:
        assert check.limits and "PTX" in check.limits


def test_forward_compatibility_needs_the_compat_package_and_a_datacentre_gpu() -> None:
    driver, cuda = DriverVersion(535, 183, 1), CudaVersion(13, 0)
    assert check_driver(driver, cuda, compat_package=False, datacentre=True).ok is False
    forward = check_driver(driver, cuda, compat_package=True, datacentre=True)
    assert forward.ok is True and "forward compatibility" in forward.how
    geforce = check_driver(driver, cuda, compat_package=True, datacentre=False)
    assert geforce.ok is False and "data-centre GPUs only" in geforce.how
    # A CUDA major Forge's table does not hold is not judged either way.
    assert check_driver(driver, CudaVersion(14, 0), compat_package=False, datacentre=True).ok is None


def test_datacentre_parts_and_the_newest_cuda_of_a_driver() -> None:
    for name in (
        "NVIDIA H200",
        "NVIDIA H100 80GB HBM3",
        "Tesla T4",
        "NVIDIA-A100-SXM4-80GB",
        "NVIDIA L4",
        "NVIDIA B200",
    ):
        assert is_datacentre(name), name
    for name in ("NVIDIA GeForce RTX 5090", "NVIDIA RTX A6000", "Quadro RTX 8000", "NVIDIA RTX 6000 Ada Generation"):
        assert not is_datacentre(name), name
    assert highest_cuda(DriverVersion(580, 159, 4)) == CudaVersion(13, 0)
    assert highest_cuda(DriverVersion(535, 183, 1)) == CudaVersion(12, 2)
    assert highest_cuda(DriverVersion(418, 0)) is None
    assert ptx_jits(CudaVersion(13, 0), CudaVersion(13, 0)) and not ptx_jits(CudaVersion(13, 0), CudaVersion(13, 5))


def test_the_captured_h200_line_and_the_typed_old_drivers_parse() -> None:
    (h200,) = smi("h200-driver-captured.csv")
    assert (h200.name, h200.capability, h200.driver, h200.memory_mib) == (
        "NVIDIA H200",
        Capability(9, 0),
        DriverVersion(580, 159, 4),
        143771,
    )
    assert [g.driver for g in smi("a100x2-driver-550.csv")] == [DriverVersion(550, 127, 5)] * 2
    assert smi("l4-driver-570.csv")[0].memory_mib == 23034
    # The two-field files of before still parse, with no driver.
    assert smi("h100.csv")[0].driver is None
    with pytest.raises(UsageError, match=r"bad.csv:2: '5x0' is not an NVIDIA driver version"):
        parse_nvidia_smi("name, compute_cap, driver_version\nNVIDIA L4, 8.9, 5x0\nx", source="bad.csv")


def test_the_captured_h200_runs_the_gpu_wheel_image() -> None:
    verdicts = enforce(smi("h200-driver-captured.csv"), vllm_libraries(), "recorded", CUDA13)
    assert verdicts[0].driver is not None and verdicts[0].driver.ok is True
    assert "driver 580.159.04 runs the image's CUDA 13.0" in verdicts[0].lines()[1]


@pytest.mark.parametrize(
    ("fixture", "name", "driver", "runs"),
    [
        ("h100-driver-535.csv", "NVIDIA H100 80GB HBM3", "535.183.01", "12.2"),
        ("a100x2-driver-550.csv", "NVIDIA A100-SXM4-80GB", "550.127.05", "12.4"),
        ("l4-driver-570.csv", "NVIDIA L4", "570.133.20", "12.8"),
    ],
)
def test_old_drivers_are_refused_with_both_versions(fixture: str, name: str, driver: str, runs: str) -> None:
    with pytest.raises(GpuDriverTooOld) as info:
        enforce(smi(fixture), vllm_libraries(), "recorded", CUDA13)
    err = info.value
    assert err.exit_code == 20
    assert f"{name} (from {fixture}) has driver {driver}" in err.message
    assert "CUDA 13.0 runtime" in err.message and "≥ 580" in err.message
    assert err.hint is not None and "to 580 or later" in err.hint and f"CUDA {runs} or older" in err.hint


def test_a_driver_not_known_is_said_not_passed() -> None:
    verdicts = enforce(smi("h100.csv"), vllm_libraries(), "recorded", CUDA13)
    assert verdicts[0].driver is None and "does not give the driver's version" in verdicts[0].driver_note
    verdicts = enforce(smi("h200-driver-captured.csv"), vllm_libraries(), "recorded", None)
    assert verdicts[0].driver is None and "CUDA is not known" in verdicts[0].lines()[1]


def test_gfd_node_labels_in_both_spellings() -> None:
    path = LABELS / "h100-driver-535.json"
    gpus = gpus_from_node_labels(parse_node_labels(path.read_text(), source=path.name), source=path.name)
    assert len(gpus) == 8
    assert (gpus[0].name, gpus[0].capability, gpus[0].driver, gpus[0].cuda) == (
        "NVIDIA-H100-80GB-HBM3",
        Capability(9, 0),
        DriverVersion(535, 183, 1),
        CudaVersion(12, 2),
    )
    with pytest.raises(GpuDriverTooOld, match=r"driver 535\.183\.01"):
        enforce(gpus, vllm_libraries(), "recorded", CUDA13)
    path = LABELS / "h200-driver-580-old-gfd.txt"
    (old,) = gpus_from_node_labels(parse_node_labels(path.read_text(), source=path.name), source=path.name)
    assert old.driver == DriverVersion(580, 159, 4) and old.cuda == CudaVersion(13, 0)
    # kubectl --show-labels' one line of pairs
    pairs = "nvidia.com/gpu.compute.major=8,nvidia.com/gpu.compute.minor=9,nvidia.com/cuda.driver.major=570"
    (l4,) = gpus_from_node_labels(parse_node_labels(pairs, source="x"), source="x")
    assert l4.capability == Capability(8, 9) and l4.driver == DriverVersion(570)
    with pytest.raises(UsageError, match="not a GPU node"):
        gpus_from_node_labels({"kubernetes.io/hostname": "cpu-1"}, source="cpu.json")
    with pytest.raises(UsageError, match=r"nvidia.com/gpu.compute.major='nine' is not a whole number"):
        gpus_from_node_labels({"nvidia.com/gpu.compute.major": "nine", "nvidia.com/gpu.compute.minor": "0"}, source="x")


def test_an_images_labels_say_what_it_is() -> None:
    gpu = image_facts_from_labels({LABEL_ARCHS: "8.0 9.0", LABEL_CUDA: "13.0"}, ref="forge/g:1")
    assert gpu is not None and gpu.cuda is not None and gpu.cuda.version == CudaVersion(13, 0)
    assert "forge/g:1 label dev.forge.cuda.arch_list" in gpu.archs_from
    assert image_facts_from_labels({"dev.forge.target": "cpu-wheel"}, ref="forge/c:1") is None
    with pytest.raises(UsageError, match=r"is a GPU image .* but has no dev\.forge\.cuda\.arch_list label") as info:
        image_facts_from_labels({"dev.forge.gpu.mode": "wheel", LABEL_CUDA: "13.0"}, ref="forge/w:1")
    assert "--image-archs" in (info.value.hint or "")
    with pytest.raises(UsageError, match=r"dev\.forge\.cuda\.version: 'x' is not a CUDA version"):
        image_facts_from_labels({LABEL_ARCHS: "9.0", LABEL_CUDA: "x"}, ref="forge/g:1")
