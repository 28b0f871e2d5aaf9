"""--gpu-mode and --cuda-arch-list through the real CLI: into the plan, into preflight, refused where they do not
apply; and `forge preflight fedora-44 gpu` blocked by nvcc's host-GCC gate only when the compat compiler is gone."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from builders.cli import main
from builders.engines.vllm.preflight import COMPILE_GATES

SOURCE = Path(__file__).parents[1] / "preflight" / "fixtures" / "vllm-0.33.0"
# Gates whose verdict depends on this host's disk and memory, not on the distro files.
HOST_GATES = {"disk-layers", "disk-scratch", "scratch-tmpfs", "ram"}


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["plan", *args]) == 0
    data = json.loads(capsys.readouterr().out)
    assert isinstance(data, dict)
    return data


def test_gpu_mode_reaches_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    wheel = plan_json(capsys, "ubi-9", "gpu", "--gpu-mode", "wheel")
    source = plan_json(capsys, "ubi-9", "gpu", "--gpu-mode", "source")
    assert wheel["cuda"]["mode"] == "wheel" and "BASE_IMAGE" not in wheel["build_args"]
    assert source["cuda"]["mode"] == "source" and "BASE_IMAGE" in source["build_args"]


def test_cuda_arch_list_reaches_the_compile(capsys: pytest.CaptureFixture[str]) -> None:
    data = plan_json(capsys, "ubuntu-24.04", "gpu", "--gpu-mode", "source", "--cuda-arch-list", "9.0;10.0a 12.0+PTX")
    assert data["compile_env"]["TORCH_CUDA_ARCH_LIST"] == "9.0 10.0a 12.0+PTX"
    assert data["cuda"]["arch_list"] == "9.0 10.0a 12.0+PTX"


def test_a_bad_arch_list_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["plan", "ubi-9", "gpu", "--cuda-arch-list", "sm_90"])
    assert exc.value.code == 2 and "not a compute capability: sm_90" in capsys.readouterr().err


def test_gpu_options_for_a_cpu_target_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "debian-13", "cpu", "--gpu-mode", "wheel"]) == 2
    assert "--gpu-mode given for target cpu, which is not a GPU target" in capsys.readouterr().err


def preflight_json(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    rc = main([*args, "--source", str(SOURCE), "--no-probe", "--json", "--scratch-dir", str(tmp_path)])
    data = json.loads(capsys.readouterr().out)
    assert isinstance(data, dict)
    return rc, data


def gates(data: dict[str, Any], *, blocking: bool = False) -> set[str]:
    items = [*data["findings"], *([] if blocking else data["passed"])]
    return {f["gate"] for f in items if f["blocking"] or not blocking}


def test_preflight_in_wheel_mode_skips_the_compile_gates(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _, data = preflight_json(capsys, tmp_path, "preflight", "ubi-9", "gpu", "--gpu-mode", "wheel")
    assert not gates(data) & set(COMPILE_GATES) and {"gpu-mode", "torch-wheel", "python"} <= gates(data)
    _, data = preflight_json(capsys, tmp_path, "preflight", "ubi-9", "gpu", "--gpu-mode", "source")
    assert {"gcc", "nvcc-host-gcc", "cmake"} <= gates(data)


def test_fedora_44_is_blocked_by_nvcc_only_without_its_compat_compiler(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, project_copy: Path
) -> None:
    rc, data = preflight_json(capsys, tmp_path, "preflight", "fedora-44", "gpu", "--gpu-mode", "source")
    assert not gates(data, blocking=True) - HOST_GATES, data["findings"]
    f44 = project_copy / "distros" / "fedora-44.yaml"
    text = f44.read_text()
    without, removed = re.subn(r"\n  host_compiler:\n(    .*\n)+", "\n", text)
    assert removed == 1
    f44.write_text(without)
    rc, data = preflight_json(
        capsys, tmp_path, "--root", str(project_copy), "preflight", "fedora-44", "gpu", "--gpu-mode", "source"
    )
    assert rc == 3 and gates(data, blocking=True) - HOST_GATES == {"nvcc-host-gcc"}
    (nvcc,) = [f for f in data["findings"] if f["gate"] == "nvcc-host-gcc"]
    assert nvcc["found"].startswith("GCC 16") and nvcc["required"] == "GCC ≤ 15.x (CUDA 13.0)"
