"""The GPU test stage's decisions: GPU detection through a real nvidia-smi process, the probes run by a real
Python, and a check that needs a GPU reporting "skipped: no GPU" as its own status, never as a pass."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from builders.bootstrap import ensure_base
from builders.container import Engine, RunSpec
from builders.container.docker_engine import gpu_device_requests
from builders.engines import make_plan
from builders.engines.checks import CheckResult
from builders.engines.vllm.image_tests import (
    TOOLCHAIN_PROBE,
    TORCH_CUDA_PROBE,
    GpuPresence,
    check_torch_cuda,
    detect_gpus,
    gpu_skip_reason,
    judge_toolchain,
    judge_torch_cuda,
    skipped,
)
from builders.errors import EngineError
from builders.plan import PlanOptions
from builders.project import Project
from builders.report import CheckRecord

H200 = "GPU 0: NVIDIA H200 (UUID: GPU-5a0c0d2e-0000-0000-0000-000000000000)"


def executable(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def test_a_listed_gpu_is_present(tmp_path: Path) -> None:
    smi = executable(tmp_path / "nvidia-smi", f'[ "$1" = "-L" ] && echo "{H200}"')
    found = detect_gpus(str(smi))
    assert found.present and found.detail == H200


def test_no_nvidia_smi_means_no_gpu(tmp_path: Path) -> None:
    found = detect_gpus(str(tmp_path / "nvidia-smi"))
    assert not found.present and "did not run" in found.detail


def test_a_driver_that_does_not_answer_means_no_gpu(tmp_path: Path) -> None:
    smi = executable(
        tmp_path / "nvidia-smi",
        'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."; exit 9',
    )
    found = detect_gpus(str(smi))
    assert not found.present and "exited 9" in found.detail and "NVIDIA driver" in found.detail


def test_an_empty_list_means_no_gpu(tmp_path: Path) -> None:
    smi = executable(tmp_path / "nvidia-smi", "echo 'No devices found.'")
    assert not detect_gpus(str(smi)).present


def test_detection_here_agrees_with_the_path() -> None:
    """Whatever this host is: no nvidia-smi on PATH means no GPU; one on PATH is asked here independently, and
    detection must report exactly the GPUs it lists (or none when it fails or lists none)."""
    found = detect_gpus()
    on_path = [Path(d, "nvidia-smi") for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    smi = next((p for p in on_path if p.exists()), None)
    if smi is None:
        assert not found.present and found.detail == "nvidia-smi not found on the build host"
        return
    proc = subprocess.run([str(smi), "-L"], capture_output=True, text=True, timeout=30, check=False)
    listed = [line.strip() for line in proc.stdout.splitlines() if line.startswith("GPU ")]
    if proc.returncode == 0 and listed:
        assert found.present and found.detail == "; ".join(listed)
    else:
        assert not found.present and str(smi) in found.detail


def test_without_a_gpu_the_check_is_skipped_and_says_so() -> None:
    reason = gpu_skip_reason(GpuPresence(present=False, detail="nvidia-smi not found on the build host"))
    assert reason == "skipped: no GPU (nvidia-smi not found on the build host)"
    result = skipped("serve-models-gpu", reason)
    assert result.status == "skipped" and result.ok and result.skipped
    entry = result.as_report()
    assert entry["status"] == "skipped" and str(entry["detail"]).startswith("skipped: no GPU")
    assert gpu_skip_reason(GpuPresence(present=True, detail=H200)) is None


def status_text(entry: object) -> str:
    """A report.tests entry as the build's log and summary read it."""
    return CheckRecord.model_validate(entry).status_text()


def test_status_lines_tell_skipped_from_passed() -> None:
    lines = [
        status_text(CheckResult(name="a", ok=True, detail="2.14.0+cu130\nmore", seconds=1.0).as_report()),
        status_text(CheckResult(name="b", ok=False, detail="nvcc in the runtime", seconds=1.0).as_report()),
        status_text(skipped("c", "skipped: no GPU (nvidia-smi not found on the build host)").as_report()),
        status_text({"name": "d", "ok": True, "detail": "from an older report", "seconds": 1.0}),
    ]
    assert lines == [
        "ok 2.14.0+cu130",
        "FAILED nvcc in the runtime",
        "skipped: no GPU (nvidia-smi not found on the build host)",
        "ok from an older report",
    ]


def test_the_gpu_request_is_docker_run_gpus_all() -> None:
    # The Engine API body `docker run --gpus all` sends: every GPU, the "gpu" capability.
    (request,) = gpu_device_requests(True)
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]] and not request["DeviceIDs"]
    assert gpu_device_requests(False) == []


def loaded_base(project: Project, engine: Engine) -> str:
    """Debian 12's base, bootstrapped when missing: these tests once skipped when an earlier test had not
    happened to load Debian 13's, so whether they ran depended on the order of the suite."""
    return ensure_base(project.distro("debian-12"), engine).ref


@pytest.mark.engine
def test_a_gpu_request_runs_or_is_refused_with_the_remedy(project: Project, engine: Engine) -> None:
    """Where the engine has the NVIDIA runtime the container runs; elsewhere starting it fails, says how to fix
    that, and leaves no container behind."""
    image = loaded_base(project, engine)
    before = set(engine.containers_with_label("forge.owner"))
    try:
        rc, _ = engine.run_once(RunSpec(image=image, command=["true"], gpus=True), timeout=60)
    except EngineError as exc:
        assert "with the host GPUs" in exc.message and exc.hint is not None and "NVIDIA Container Toolkit" in exc.hint
    else:
        assert rc == 0
    assert set(engine.containers_with_label("forge.owner")) == before


@pytest.mark.engine
def test_a_gpu_the_engine_cannot_hand_over_fails_the_check(project: Project, engine: Engine) -> None:
    ubuntu = project.distro("ubuntu-24.04")
    plan = make_plan(ubuntu, project.recipe_for("gpu"), PlanOptions(max_jobs=1, gpu_mode="wheel"))
    image = loaded_base(project, engine)  # any image: the engine refuses before it runs
    try:
        engine.run_once(RunSpec(image=image, command=["true"], gpus=True), timeout=60)
    except EngineError:
        result = check_torch_cuda(engine, image, plan, gpus=True)
        assert not result.ok and "NVIDIA Container Toolkit" in result.detail
    else:
        pytest.skip("this engine hands GPUs to containers")


def test_statuses_are_distinct() -> None:
    passed = CheckResult(name="x", ok=True, detail="", seconds=0.0)
    failed = CheckResult(name="x", ok=False, detail="", seconds=0.0)
    assert (passed.status, failed.status, skipped("x", "skipped: no GPU").status) == ("passed", "failed", "skipped")


def fake_torch(root: Path, *, version: str, cuda: str | None, available: bool) -> Path:
    """A stand-in for torch's import surface the probe reads, so the probe itself runs in a real Python."""
    pkg = root / "torch"
    (pkg / "cuda").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\nfrom torch import version, cuda\n")
    (pkg / "version.py").write_text(f"cuda = {cuda!r}\n")
    (pkg / "cuda" / "__init__.py").write_text(
        f"def is_available():\n    return {available}\n"
        f"def device_count():\n    return {1 if available else 0}\n"
        "def get_device_name(i):\n    return 'NVIDIA H200'\n"
    )
    return root


def run_probe(code: str, env: dict[str, str]) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("version", "cuda", "available", "need_gpu", "ok", "words"),
    [
        ("2.14.0+cu130", "13.0", False, False, True, "for CUDA 13.0"),
        ("2.14.0+cu130", "13.0", True, True, True, "sees 1 GPU(s): NVIDIA H200"),
        ("2.14.0+cu128", "12.8", False, False, False, "wrong index"),
        ("2.14.0+cpu", None, False, False, False, "built without CUDA"),
        ("2.14.0+cu130", "13.0", False, True, False, "torch sees none"),
    ],
)
def test_torch_probe_and_judgement(
    tmp_path: Path, version: str, cuda: str | None, available: bool, need_gpu: bool, ok: bool, words: str
) -> None:
    root = fake_torch(tmp_path, version=version, cuda=cuda, available=available)
    rc, out = run_probe(TORCH_CUDA_PROBE, {**os.environ, "PYTHONPATH": str(root)})
    verdict, detail = judge_torch_cuda(rc, out, "13.0", need_gpu=need_gpu)
    assert (verdict, words in detail) == (ok, True), detail


def test_torch_probe_fails_where_torch_does_not_import(tmp_path: Path) -> None:
    # A torch that cannot be imported, first on the path: the dev install has a real one (the KV lab's kernels),
    # and the probe must fail the same way an image without torch does, whatever this host has.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text('raise ImportError("No module named torch")\n', encoding="utf-8")
    rc, out = run_probe(
        TORCH_CUDA_PROBE, {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path), "PYTHONNOUSERSITE": "1"}
    )
    assert rc != 0, out
    ok, detail = judge_torch_cuda(rc, out, "13.0", need_gpu=False)
    assert not ok and "torch" in detail


def test_toolchain_probe_passes_with_only_a_c_compiler(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "gcc", "exit 0")
    rc, out = run_probe(TOOLCHAIN_PROBE, {"PATH": str(bin_dir)})
    ok, detail = judge_toolchain(rc, out)
    assert rc == 0
    if Path(sysconfig.get_paths()["include"], "Python.h").exists():
        assert ok, detail
    else:
        assert not ok and "Python.h" in detail


def test_toolchain_probe_names_the_build_tools_it_finds(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("gcc", "g++", "nvcc"):
        executable(bin_dir / tool, "exit 0")
    rc, out = run_probe(TOOLCHAIN_PROBE, {"PATH": str(bin_dir)})
    ok, detail = judge_toolchain(rc, out)
    assert not ok and "nvcc" in detail and "g++" in detail and "cmake" not in detail


def test_toolchain_without_a_c_compiler_fails_for_triton(tmp_path: Path) -> None:
    rc, out = run_probe(TOOLCHAIN_PROBE, {"PATH": str(tmp_path)})
    ok, detail = judge_toolchain(rc, out)
    assert not ok and "Triton" in detail
