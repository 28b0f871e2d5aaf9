"""The GPU gate reading this host's nvidia-smi live, through the real CLI: an nvidia-smi on PATH that prints what a
failing one prints (tests/gpu/data/nvidia-smi/README.md says where each output comes from) and exits as it does.

A GPU host whose nvidia-smi fails never gets a GPU gate that is silent: preflight lists the gate as not evaluated
(exit 9) with nvidia-smi's exit status and words, and smoke and deploy render stop with exit 9, writing nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from gpu_data import vllm_libraries

from builders.cli import main
from builders.preflight.gpu_gate import SMI_QUERY, SmiFailure, read_local

SMI = Path(__file__).parent / "data" / "nvidia-smi"
OLD_DRIVER = "needs driver 510 or later for compute_cap, or pass --gpu-product"


def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, query: str, status: int, header: str = "") -> None:
    """An nvidia-smi first on PATH: the query prints `query`'s file and exits `status`; a plain `nvidia-smi`
    prints `header`'s file (its first lines name the tool's and the kernel driver's versions)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    plain = f'cat "{SMI / header}"; exit 0' if header else "exit 9"
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$#" = 0 ]; then {plain}; fi\n'
        f'if [ "$1" = "{SMI_QUERY[0]}" ]; then cat "{SMI / query}"; exit {status}; fi\n'
        'echo "unexpected arguments: $*" >&2; exit 2\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def report(tmp_path: Path) -> str:
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"cuda_archs": {lib.library: lib.to_json() for lib in vllm_libraries()}}))
    return str(path)


def preflight_gate(capsys: pytest.CaptureFixture[str], report: str) -> tuple[int, dict[str, object]]:
    code = main(["preflight", "ubuntu-24.04", "gpu", "--no-probe", "--no-fetch", "--json", "--image-archs", report])
    data = json.loads(capsys.readouterr().out)
    (gate,) = [f for f in data["findings"] if f["gate"] == "gpu-arch"]
    assert "gpu-arch" in data["not_evaluated"] and "gpu-arch" not in [f["gate"] for f in data["passed"]]
    return code, gate


def test_a_live_driver_before_510_leaves_the_gate_not_evaluated_with_the_510_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], report: str
) -> None:
    fake_smi(tmp_path, monkeypatch, query="old-driver.csv", status=2, header="old-driver.header.txt")
    failure = read_local()
    assert isinstance(failure, SmiFailure)
    assert failure.exit_status == 2 and failure.output == 'Field "compute_cap" is not a valid field to query.'
    assert failure.reason == f"nvidia-smi does not know the compute_cap field: it {OLD_DRIVER}"

    code, gate = preflight_gate(capsys, report)
    assert code in (3, 9) and not gate["evaluated"] and not gate["blocking"]  # 3 only where another gate blocks
    assert gate["found"] == (
        "not evaluated: `nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv` exited 2: nvidia-smi does not know "
        f"the compute_cap field: it {OLD_DRIVER}"
    )
    assert gate["message"] == 'nvidia-smi said: Field "compute_cap" is not a valid field to query.'


def test_smoke_and_deploy_render_stop_on_a_live_driver_before_510(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], report: str
) -> None:
    fake_smi(tmp_path, monkeypatch, query="old-driver.csv", status=2, header="old-driver.header.txt")
    assert main(["smoke", "forge/any:latest", "--image-archs", report]) == 9
    err = capsys.readouterr().err
    assert "GPU gate not evaluated" in err and "exited 2" in err and OLD_DRIVER in err
    out = tmp_path / "k8s"
    assert main(["deploy", "render", "--image", "forge/gpu:1", "-o", str(out), "--image-archs", report]) == 9
    assert OLD_DRIVER in capsys.readouterr().err and not out.exists()
    # Naming the GPU instead, as the answer says, evaluates the gate without nvidia-smi.
    assert main(["deploy", "render", "--image", "forge/gpu:1", "-o", str(out), "--image-archs", report,
                 "--gpu-product", "NVIDIA-L4"]) == 0  # fmt: skip


def test_a_tool_older_than_the_kernel_driver_is_named_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], report: str
) -> None:
    fake_smi(tmp_path, monkeypatch, query="old-driver.csv", status=2, header="tool-470-driver-580.header.txt")
    failure = read_local()
    assert isinstance(failure, SmiFailure)
    assert failure.reason == (
        f"the nvidia-smi on PATH ({tmp_path / 'bin' / 'nvidia-smi'}) is version 470.256.02, older than the kernel "
        "driver 580.95.05, and does not know the compute_cap field"
    )
    assert failure.remedy.startswith("use the nvidia-smi that came with driver 580.95.05")
    _, gate = preflight_gate(capsys, report)
    assert "older than the kernel driver 580.95.05" in str(gate["found"])


def test_a_driver_library_mismatch_is_reported_with_its_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], report: str
) -> None:
    fake_smi(tmp_path, monkeypatch, query="driver-library-mismatch.txt", status=18)
    _, gate = preflight_gate(capsys, report)
    assert "exited 18: nvidia-smi cannot reach the kernel driver: Driver/library version mismatch" in str(gate["found"])
    assert "(NVML library 535.161)" in str(gate["found"]) and "reboot" in str(gate["remedy"])


def test_any_other_failure_keeps_its_status_and_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], report: str
) -> None:
    fake_smi(tmp_path, monkeypatch, query="no-driver.txt", status=9)
    code, gate = preflight_gate(capsys, report)
    assert code in (3, 9)
    assert gate["found"] == (
        "not evaluated: `nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv` exited 9: nvidia-smi failed, so "
        "this host's GPUs are unknown"
    )
    assert "couldn't communicate with the NVIDIA driver" in str(gate["message"])
    assert "--gpu-query FILE or --gpu-product LABEL" in str(gate["remedy"])


def test_a_live_nvidia_smi_that_answers_is_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], report: str
) -> None:
    fake_smi(tmp_path, monkeypatch, query="h200.csv", status=0)
    gpus = read_local()
    assert isinstance(gpus, list) and [(g.name, str(g.capability), g.source) for g in gpus] == [
        ("NVIDIA H200", "9.0", "nvidia-smi")
    ]
    code = main(["preflight", "ubuntu-24.04", "gpu", "--no-probe", "--no-fetch", "--json", "--image-archs", report])
    data = json.loads(capsys.readouterr().out)
    assert "gpu-arch" in [f["gate"] for f in data["passed"]] and "gpu-arch" not in data["not_evaluated"]
    assert code in (0, 3, 9)  # the other gates depend on this host
