"""The GPU gate on typed nvidia-smi outputs (tests/gpu/data/nvidia-smi/README.md says where each comes from) and on
the archs cuobjdump read from vLLM 0.33.0's wheel (captured)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from gpu_data import ARCH_LIST, vllm_libraries

from builders.errors import GpuUnsupported, UsageError
from builders.gpu_archs import Capability
from builders.gpu_image import image_libraries
from builders.preflight.gpu_gate import (
    add_gpu_gate_args,
    enforce,
    gate_from_args,
    gpu_from_product,
    judge,
    parse_nvidia_smi,
)

SMI = Path(__file__).parent / "data" / "nvidia-smi"


def gpus(name: str) -> list[tuple[str, str]]:
    path = SMI / name
    return [(g.name, str(g.capability)) for g in parse_nvidia_smi(path.read_text(), source=str(path))]


def test_nvidia_smi_outputs_parse() -> None:
    assert gpus("t4.csv") == [("Tesla T4", "7.5")]
    assert gpus("a100x4.csv") == [("NVIDIA A100-SXM4-80GB", "8.0")] * 4
    assert gpus("h100.csv") == [("NVIDIA H100 80GB HBM3", "9.0")]
    assert gpus("rtx5090.csv") == [("NVIDIA GeForce RTX 5090", "12.0")]
    # --format=csv,noheader: the same lines without the header
    assert parse_nvidia_smi("NVIDIA L4, 8.9\n", source="x")[0].capability == Capability(8, 9)


def test_a_saved_output_of_a_driver_before_510_says_what_to_do() -> None:
    # What such a driver prints for the query: one line and a blank one, no GPU.
    assert (SMI / "old-driver.csv").read_text() == 'Field "compute_cap" is not a valid field to query.\n\n'
    with pytest.raises(UsageError) as info:
        gpus("old-driver.csv")
    assert info.value.message == (
        f"{SMI / 'old-driver.csv'}: nvidia-smi does not know the compute_cap field: it needs driver 510 or later "
        "for compute_cap, or pass --gpu-product"
    )
    assert info.value.exit_code == 2 and "--gpu-product" in (info.value.hint or "")


def test_a_saved_nvml_failure_is_named_not_parsed() -> None:
    with pytest.raises(UsageError) as info:
        gpus("driver-library-mismatch.txt")
    assert "Driver/library version mismatch (NVML library 535.161)" in info.value.message
    assert "reboot" in (info.value.hint or "")


def test_an_output_that_is_no_name_compute_cap_list_is_refused() -> None:
    with pytest.raises(UsageError, match=r"x.csv:2: '\[N/A\]' is not a compute capability"):
        parse_nvidia_smi("name, compute_cap\nTesla T4, [N/A]\n", source="x.csv")
    with pytest.raises(UsageError, match="is not a `name, compute_cap` line"):
        parse_nvidia_smi((SMI / "no-driver.txt").read_text(), source="no-driver.txt")
    with pytest.raises(UsageError, match="no GPU listed"):
        parse_nvidia_smi("name, compute_cap\n", source="empty.csv")


@pytest.mark.parametrize(
    "fixture", ["t4.csv", "a100x4.csv", "l4.csv", "h100.csv", "h200.csv", "b200x2.csv", "rtx5090.csv"]
)
def test_gpus_inside_the_wheels_archs_pass(fixture: str) -> None:
    path = SMI / fixture
    verdicts = enforce(
        parse_nvidia_smi(path.read_text(), source=fixture), vllm_libraries(), "captured cuobjdump output"
    )
    assert all(v.supported for v in verdicts)


@pytest.mark.parametrize(
    ("fixture", "name", "cap"),
    [("v100.csv", "Tesla V100-SXM2-16GB", "7.0"), ("p100.csv", "Tesla P100-PCIE-16GB", "6.0")],
)
def test_gpus_outside_are_refused_with_gpu_capability_and_archs(fixture: str, name: str, cap: str) -> None:
    path = SMI / fixture
    with pytest.raises(GpuUnsupported) as info:
        enforce(parse_nvidia_smi(path.read_text(), source=fixture), vllm_libraries(), "captured cuobjdump output")
    err = info.value
    assert err.exit_code == 20
    assert f"{name} (compute capability {cap}, from {fixture})" in err.message
    assert (
        "_C_stable_libtorch: SASS sm_75 sm_80 sm_86 sm_89 sm_90 sm_90a sm_100 sm_120; PTX compute_80 compute_89 compute_90"
        in (err.message)
    )


def test_one_bad_gpu_among_good_ones_refuses_the_host() -> None:
    path = SMI / "mixed-h100-v100.csv"
    verdicts = judge(parse_nvidia_smi(path.read_text(), source="m"), vllm_libraries())
    assert [v.supported for v in verdicts] == [True, False]
    assert verdicts[1].runs == {"_C_stable_libtorch": None, "_moe_C_stable_libtorch": None}


def test_ptx_only_coverage_passes_a_newer_major() -> None:
    # A declared list "8.0+PTX" has compute_80 PTX, which the driver JITs for a 9.0 GPU; "8.0" alone does not.
    h100 = parse_nvidia_smi((SMI / "h100.csv").read_text(), source="h100")
    libs, _ = image_libraries("8.0+PTX")
    assert judge(h100, libs)[0].runs == {"arch_list (--image-archs)": "compute_80 PTX (JIT)"}
    libs, _ = image_libraries("8.0 8.6")
    assert not judge(h100, libs)[0].supported


@pytest.mark.parametrize(
    ("label", "cap"),
    [
        ("NVIDIA-H100-80GB-HBM3", "9.0"),
        ("nvidia.com/gpu.product=NVIDIA-H200", "9.0"),
        ("Tesla-T4", "7.5"),
        ("NVIDIA-L4", "8.9"),
        ("NVIDIA-L40S", "8.9"),
        ("NVIDIA-A10G", "8.6"),
        ("NVIDIA-A100-SXM4-80GB", "8.0"),
        ("NVIDIA-B200", "10.0"),
        ("NVIDIA-GeForce-RTX-5090", "12.0"),
        ("Tesla-V100-SXM2-16GB", "7.0"),
    ],
)
def test_node_product_labels(label: str, cap: str) -> None:
    assert str(gpu_from_product(label).capability) == cap


def test_unknown_product_label_says_what_to_pass() -> None:
    with pytest.raises(UsageError, match="--gpu-product NVIDIA-Z9: not a GPU Forge knows") as info:
        gpu_from_product("NVIDIA-Z9")
    assert "--gpu-query" in (info.value.hint or "")


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_gpu_gate_args(p)
    return p.parse_args(argv)


def report_json(tmp_path: Path) -> Path:
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"cuda_archs": {lib.library: lib.to_json() for lib in vllm_libraries()}}))
    return path


def test_args_with_a_build_report(tmp_path: Path) -> None:
    report = str(report_json(tmp_path))
    verdicts = gate_from_args(parse("--gpu-query", str(SMI / "l4.csv"), "--image-archs", report))
    assert verdicts is not None
    assert verdicts[0].runs["_C_stable_libtorch"] == "sm_89 SASS"
    with pytest.raises(GpuUnsupported, match=r"from .*report.json \(read by cuobjdump\)"):
        gate_from_args(parse("--gpu-product", "Tesla-V100-SXM2-16GB", "--image-archs", report))


def test_args_errors_name_the_flag(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not the image's archs"):
        gate_from_args(parse("--gpu-product", "NVIDIA-L4"))
    (tmp_path / "r.json").write_text("{}")
    with pytest.raises(UsageError, match=r"--image-archs .*r.json: no cuda_archs in it"):
        gate_from_args(parse("--gpu-product", "NVIDIA-L4", "--image-archs", str(tmp_path / "r.json")))
    with pytest.raises(UsageError, match=r"--gpu-query .*nope.csv does not exist"):
        gate_from_args(parse("--gpu-query", str(tmp_path / "nope.csv"), "--image-archs", ARCH_LIST))
    # nothing given and no arch list: no gate (a CPU image)
    assert gate_from_args(parse()) is None
