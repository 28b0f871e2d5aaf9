"""An old-driver host through the real CLI: preflight blocks (exit 3, a `gpu-driver` finding), smoke and deploy render
refuse (exit 20, nothing started, nothing written), each naming the driver and the image's CUDA; the captured H200
passes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gpu_data import vllm_libraries

from builders.cli import main

DATA = Path(__file__).parent / "data"
SMI = DATA / "nvidia-smi"
LABELS = DATA / "node-labels"


@pytest.fixture
def report(tmp_path: Path) -> str:
    """A gpu-wheel build's report as the test stage writes it: the archs cuobjdump read, torch's CUDA."""
    path = tmp_path / "report.json"
    archs = {lib.library: lib.to_json() for lib in vllm_libraries()}
    tests = [
        {"name": "cuda-archs", "status": "passed", "data": {"cuda_archs": archs}},
        {"name": "cuda-libs-load", "status": "skipped", "data": {"torch": "2.14.0+cu130", "cuda_runtime": "13.0"}},
    ]
    path.write_text(json.dumps({"image": "forge/debian-13-gpu-wheel:0.33.0", "tests": tests}))
    return str(path)


def preflight(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    """Exit code and the gpu-driver finding, with `passed` saying whether it is among the passed ones."""
    code = main(["preflight", "debian-13", "gpu-wheel", "--no-probe", "--no-fetch", "--json", *args])
    data = json.loads(capsys.readouterr().out)
    found = [{**f, "passed": f in data["passed"]} for f in (*data["findings"], *data["passed"])]
    found = [f for f in found if f["gate"] == "gpu-driver"]
    assert len(found) == 1, found
    return code, found[0]


def test_preflight_blocks_an_r535_host_naming_both_versions(capsys: pytest.CaptureFixture[str]) -> None:
    code, gate = preflight(capsys, "--gpu-query", str(SMI / "h100-driver-535.csv"))
    assert code == 3 and gate["blocking"]
    assert gate["found"] == "NVIDIA H100 80GB HBM3: driver 535.183.01"
    assert gate["required"].startswith("≥ 580")
    assert "CUDA 13.0 from recipes/vllm-gpu-wheel.yaml: cuda.runtime" in gate["source"]
    assert "580 or later" in gate["remedy"]


def test_preflight_passes_the_captured_h200_and_cannot_judge_a_product_label(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, gate = preflight(capsys, "--gpu-query", str(SMI / "h200-driver-captured.csv"))
    assert gate["passed"] and gate["found"] == "NVIDIA H200: driver 580.159.04"
    code, gate = preflight(capsys, "--gpu-product", "NVIDIA-H200")
    assert not gate["evaluated"] and "does not give the driver's version" in gate["found"]
    assert code in (3, 9)  # never clear: this gate was not evaluated (others depend on this host's disk)


def test_smoke_refuses_an_r570_host_before_anything_starts(capsys: pytest.CaptureFixture[str], report: str) -> None:
    code = main(["smoke", "forge/any:latest", "--gpu-query", str(SMI / "l4-driver-570.csv"), "--image-archs", report])
    assert code == 20
    err = capsys.readouterr().err
    assert "GPU driver too old for the image" in err
    assert "NVIDIA L4" in err and "driver 570.133.20" in err and "CUDA 13.0 runtime" in err
    assert "torch.version.cuda in the image" in err


def test_deploy_render_writes_nothing_for_an_old_driver_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], report: str
) -> None:
    out = tmp_path / "k8s"
    args = ["deploy", "render", "--image", "forge/gpu:1", "-o", str(out), "--image-archs", report]
    assert main([*args, "--node-labels", str(LABELS / "h100-driver-535.json")]) == 20
    assert "driver 535.183.01" in capsys.readouterr().err
    assert not out.exists()
    assert main([*args, "--node-labels", str(LABELS / "h200-driver-580-old-gfd.txt")]) == 0
    assert (out / "kustomization.yaml").is_file()
    # An arch list says nothing of CUDA: --image-cuda does.
    args = ["deploy", "render", "--image", "forge/gpu:1", "-o", str(tmp_path / "k2"), "--image-archs", "8.0 9.0"]
    assert main([*args, "--gpu-query", str(SMI / "a100x2-driver-550.csv"), "--image-cuda", "13.0"]) == 20
    assert "NVIDIA A100-SXM4-80GB (from" in capsys.readouterr().err
    assert main([*args, "--gpu-query", str(SMI / "a100x2-driver-550.csv"), "--image-cuda", "12.4"]) == 0


def test_gpu_sources_are_one_at_a_time(capsys: pytest.CaptureFixture[str], report: str) -> None:
    code = main(
        [
            "smoke",
            "forge/any:latest",
            "--gpu-query",
            str(SMI / "h200-driver-captured.csv"),
            "--node-labels",
            str(LABELS / "h100-driver-535.json"),
            "--image-archs",
            report,
        ]
    )
    assert code == 2 and "--gpu-query and --node-labels both given" in capsys.readouterr().err
