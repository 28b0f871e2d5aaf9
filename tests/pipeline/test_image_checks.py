"""The CPU test stage's import probe, run by a real Python against stand-in `vllm` and `torch` packages that
behave as vLLM 0.32's do, and the CPU sysfs an emulated arm64 container is lent."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from builders.emulation import NEOVERSE_N1_MIDR, SYSFS_CPU, emulated_cpu_sysfs
from builders.engines import make_plan
from builders.engines.vllm.image_tests import IMPORT_PROBE, ImportProbe, check_cpu_kernels, check_import, check_version
from builders.plan import PlanOptions

SBGEMM = "ImportError('/opt/venv/lib/python3.11/site-packages/vllm/_C.abi3.so: undefined symbol: sbgemm_')"


def stand_in_packages(root: Path, *, library_loads: bool) -> Path:
    """`torch` with a dispatcher that lists registered operators, and `vllm` whose CpuPlatform.import_kernels
    registers its `_C::` operators when its library loads and, as vLLM's does, only logs a warning when not."""
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text(
        "__version__ = '2.13.0+cu130'\n"
        "class _C:\n"
        "    ops = ['aten::add']\n"
        "    @staticmethod\n"
        "    def _dispatch_get_all_op_names():\n"
        "        return list(_C.ops)\n"
    )
    (root / "vllm" / "platforms").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("__version__ = '0.32.0'\n")
    (root / "vllm" / "platforms" / "__init__.py").write_text("")
    body = (
        "torch._C.ops += ['_C::rms_norm', '_C::silu_and_mul']"
        if library_loads
        else f"logging.getLogger('vllm').warning('Failed to import from vllm._C: %s', {SBGEMM!r})"
    )
    (root / "vllm" / "platforms" / "cpu.py").write_text(
        textwrap.dedent(
            f"""
            import logging, torch
            logging.basicConfig()
            class CpuPlatform:
                @classmethod
                def import_kernels(cls):
                    {body}
            """
        )
    )
    return root


def run_probe(packages: Path, *, kernels: bool) -> ImportProbe:
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE.format(kernels=kernels)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(packages)},
        check=False,
    )
    return ImportProbe(rc=proc.returncode, output=proc.stdout + proc.stderr, seconds=0.1)


def test_a_vllm_whose_kernel_library_does_not_load_imports_but_fails_the_kernel_check(tmp_path: Path) -> None:
    probe = run_probe(stand_in_packages(tmp_path, library_loads=False), kernels=True)
    imported = check_import(probe)
    # `import vllm` alone passes: that is why the kernels are a check of their own.
    assert imported.ok and imported.detail == "0.32.0 2.13.0+cu130"
    kernels = check_cpu_kernels(probe)
    assert not kernels.ok and kernels.status == "failed"
    assert "undefined symbol: sbgemm_" in kernels.detail and "Failed to import from vllm._C" in kernels.detail


def test_registered_kernels_are_counted(tmp_path: Path) -> None:
    probe = run_probe(stand_in_packages(tmp_path, library_loads=True), kernels=True)
    kernels = check_cpu_kernels(probe)
    assert kernels.ok and kernels.detail == "2 _C:: operators registered"


def test_a_failed_import_fails_every_check_that_reads_it(tmp_path: Path) -> None:
    probe = run_probe(tmp_path, kernels=True)  # no packages at all
    imported = check_import(probe)
    assert not imported.ok and "ModuleNotFoundError" in imported.detail
    assert not check_cpu_kernels(probe).ok


def test_the_probe_loads_no_kernels_unless_the_plan_checks_them(tmp_path: Path) -> None:
    probe = run_probe(stand_in_packages(tmp_path, library_loads=False), kernels=False)
    assert check_import(probe).ok and "KERNELS" not in probe.output and "Failed" not in probe.output


def test_cpu_vllm_images_check_their_kernels_and_gpu_images_do_not() -> None:
    from builders.project import Project

    root = Path(__file__).resolve().parents[2]
    project = Project.load(root)
    for target in ("cpu", "cpu-wheel"):
        plan = make_plan(
            project.distro("debian-14"), project.recipe_for(target), PlanOptions(max_jobs=1, torch_version="2.13.0+cpu")
        )
        assert plan.test_checks[:3] == ("import-vllm", "vllm-version", "cpu-kernels"), target
    gpu = make_plan(project.distro("ubuntu-24.04"), project.recipe_for("gpu"), PlanOptions(max_jobs=1))
    assert "cpu-kernels" not in gpu.test_checks
    assert check_version(check_import(ImportProbe(rc=0, output="VERSIONS 0.32.0 x\n", seconds=0)), plan).ok


def test_an_emulated_arm64_container_is_lent_a_cpu_sysfs_naming_an_arm_core() -> None:
    with emulated_cpu_sysfs("aarch64", "x86_64", cpus=2) as volumes:
        ((host, target),) = volumes.items()
        assert target == SYSFS_CPU
        root = Path(host)
        assert (root / "online").read_text() == "0-1\n"
        for n in (0, 1):
            midr = root / f"cpu{n}" / "regs" / "identification" / "midr_el1"
            assert midr.read_text().strip() == NEOVERSE_N1_MIDR
            assert midr.stat().st_mode & 0o004  # readable by the image's uid 1000
    assert not root.exists()


@pytest.mark.parametrize(("arch", "host"), [("aarch64", "aarch64"), ("x86_64", "x86_64"), ("x86_64", "aarch64")])
def test_a_native_or_x86_container_is_lent_nothing(arch: str, host: str) -> None:
    with emulated_cpu_sysfs(arch, host) as volumes:
        assert volumes == {}


def test_a_failed_check_is_diagnosed_into_the_report_and_its_remedy_is_the_hint() -> None:
    from builders.build import judge_checks
    from builders.engines.checks import CheckResult
    from builders.errors import BuildFailed
    from builders.report import BuildReport

    report = BuildReport(distro="debian-12", target="cpu-wheel", recipe="vllm-cpu-wheel")
    checks = [
        CheckResult(name="import-vllm", ok=True, detail="0.32.0 2.13.0+cu130", seconds=1),
        CheckResult(name="cpu-kernels", ok=False, detail=f"Failed to import from vllm._C: {SBGEMM}", seconds=0),
    ]
    with pytest.raises(BuildFailed) as caught:
        judge_checks(checks, report)
    assert caught.value.message.startswith("test stage failed: cpu-kernels (torch-mismatch: ")
    assert "+cpu" in (caught.value.hint or "")
    assert report.diagnosis is not None and report.diagnosis.category == "torch-mismatch"
    assert "sbgemm_" in (report.diagnosis.line or "")


def test_a_failure_no_rule_knows_keeps_the_checks_own_line_and_says_unknown() -> None:
    from builders.build import judge_checks
    from builders.engines.checks import CheckResult
    from builders.errors import BuildFailed
    from builders.report import BuildReport

    report = BuildReport(distro="debian-12", target="router", recipe="router")
    failed = CheckResult(name="router-relay", ok=False, detail="python", seconds=0)
    with pytest.raises(BuildFailed) as caught:
        judge_checks([failed], report)
    assert caught.value.message == "test stage failed: router-relay" and caught.value.hint == "python"
    assert report.diagnosis is not None and report.diagnosis.category == "unknown"
    judge_checks([CheckResult(name="entrypoint-help", ok=True, detail="usage", seconds=0)], report)  # no raise
