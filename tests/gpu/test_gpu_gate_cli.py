"""The GPU gate through the real CLI: preflight blocks (exit 3), smoke and deploy render refuse (exit 20) a GPU
outside the image's archs, before anything runs; a GPU inside passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gpu_data import vllm_libraries

from builders.cli import main

SMI = Path(__file__).parent / "data" / "nvidia-smi"


@pytest.fixture
def report(tmp_path: Path) -> str:
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"cuda_archs": {lib.library: lib.to_json() for lib in vllm_libraries()}}))
    return str(path)


def preflight(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object] | None, bool]:
    """Exit code, the gpu-arch finding, and whether it is among the passed ones."""
    code = main(["preflight", "ubuntu-24.04", "gpu", "--no-probe", "--no-fetch", "--json", *args])
    data = json.loads(capsys.readouterr().out)
    passed = [f for f in data["passed"] if f["gate"] == "gpu-arch"]
    gate = next((f for f in (*data["findings"], *passed) if f["gate"] == "gpu-arch"), None)
    return code, gate, bool(passed)


def test_preflight_blocks_a_gpu_outside_the_recipes_arch_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, gate, passed = preflight(capsys, "--gpu-query", str(SMI / "v100.csv"))
    assert code == 3
    assert gate is not None and gate["blocking"] and not passed
    assert gate["found"] == "Tesla V100-SXM2-16GB (7.0)"
    assert "recipes/vllm-gpu.yaml: cuda.arch_list" in str(gate["source"])


def test_preflight_passes_a_gpu_inside_the_wheels_read_archs(capsys: pytest.CaptureFixture[str], report: str) -> None:
    code, gate, passed = preflight(capsys, "--gpu-product", "NVIDIA-H100-80GB-HBM3", "--image-archs", report)
    assert gate is not None and passed and not gate["blocking"], gate
    assert "(read by cuobjdump)" in str(gate["source"])
    # Other gates depend on this host (disk, a cached sdist): the exit code is theirs; this gate passed.
    assert code in (0, 3, 9)


def test_smoke_refuses_before_any_container(capsys: pytest.CaptureFixture[str], report: str) -> None:
    code = main(["smoke", "forge/any:latest", "--gpu-query", str(SMI / "p100.csv"), "--image-archs", report])
    assert code == 20
    err = capsys.readouterr().err
    assert "Tesla P100-PCIE-16GB (compute capability 6.0" in err
    assert "SASS sm_75 sm_80 sm_86 sm_89 sm_90 sm_90a sm_100 sm_120; PTX compute_80 compute_89 compute_90" in err


def test_deploy_render_writes_nothing_for_a_refused_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], report: str
) -> None:
    out = tmp_path / "k8s"
    args = ["deploy", "render", "--image", "forge/gpu:1", "-o", str(out), "--image-archs", report]
    assert main([*args, "--gpu-product", "Tesla-V100-SXM2-16GB"]) == 20
    assert "GPU not supported by the image" in capsys.readouterr().err
    assert not out.exists()
    assert main([*args, "--gpu-product", "NVIDIA-L4"]) == 0
    assert (out / "kustomization.yaml").is_file()
