"""SGLang's GPU image from PyPI (recipes/sglang-gpu-wheel.yaml) without an engine: its plan, its Containerfile, its
wheel lock against wheelhouses written here, its preflight, and its test stage's judgement of recorded probe output:
the cuobjdump listings of sglang-kernel 0.4.10's and torch 2.14.1's libraries (fixtures/gpu_wheel_archs_probe.txt,
read by cuobjdump 13.5.37 from the wheels on 2026-12-04). The image build is `nox -s build-debian-13-sglang-gpu-wheel`
(docs/sglang-gpu-wheel.md)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from builders.config.models import Recipe
from builders.engines import ENGINES, make_plan
from builders.engines.sglang import gpu_wheel, gpu_wheel_checks
from builders.engines.sglang.serve import SGLangRecipe
from builders.errors import ConfigError, UsageError
from builders.gates.findings import Finding
from builders.gpu_archs import Capability
from builders.gpu_image import image_libraries
from builders.plan import BuildPlan, PlanOptions
from builders.preflight.gpu_gate import Gpu, judge
from builders.preflight.runner import run_preflight
from builders.project import Project
from builders.render import render

ROOT = Path(__file__).resolve().parents[2]
PROBE = (ROOT / "tests" / "sglang" / "fixtures" / "gpu_wheel_archs_probe.txt").read_text(encoding="utf-8")
TARGET = "sglang-gpu-wheel"
ARCH_LIST = "8.0 8.6 8.9 9.0 10.0 12.0"


def _plan(project: Project, recipe: Recipe | None = None, options: PlanOptions | None = None) -> BuildPlan:
    return make_plan(
        project.distro("debian-13"), recipe or project.recipe_for(TARGET), options or PlanOptions(max_jobs=2)
    )


def _recipe(project: Project, **changes: object) -> SGLangRecipe:
    recipe = project.recipe_for(TARGET)
    assert isinstance(recipe, SGLangRecipe)
    return recipe.model_copy(update=changes)


# --- plan and Containerfile ----------------------------------------------------------------------------------


def test_the_plan_is_sglangs_on_the_debian_base_the_vllm_gpu_wheel_image_uses(project: Project) -> None:
    plan = _plan(project)
    vllm = make_plan(project.distro("debian-13"), project.recipe_for("gpu-wheel"), PlanOptions(max_jobs=2))
    assert ENGINES.of(plan.recipe).name == "sglang"
    assert plan.base_ref == vllm.base_ref == "forge/base:debian-13"
    assert plan.image_tag == "forge/debian-13-sglang-gpu-wheel:0.5.23"
    assert plan.test_checks == gpu_wheel.CHECKS
    assert plan.torch is not None and plan.torch.requirement == "torch==2.14.1"
    assert plan.cuda is not None and plan.cuda.arch_list == ARCH_LIST and plan.cuda.devel_ref is None
    assert plan.cuda.wheel is not None and plan.cuda.wheel.filename.startswith("sglang-0.5.23-cp313-")
    assert [item.kind for item in plan.context] == ["script", "wheelhouse"]
    assert plan.labels["dev.forge.engine"] == "sglang"
    lock = gpu_wheel.sglang_recipe(plan.recipe).wheel_lock
    assert plan.labels["dev.forge.wheel_lock"].startswith(f"{len(lock)} wheels")
    assert (
        _plan(project, options=PlanOptions(max_jobs=2, cuda_arch_list="9.0")).labels["dev.forge.cuda.arch_list"]
        == "9.0"
    )


def test_the_plan_is_refused_on_a_distro_the_recipe_does_not_name(project: Project) -> None:
    with pytest.raises(UsageError, match="does not support debian-12"):
        make_plan(project.distro("debian-12"), project.recipe_for(TARGET), PlanOptions(max_jobs=2))


def test_an_empty_lock_or_a_wheel_pinned_twice_differently_stops_the_plan(project: Project) -> None:
    with pytest.raises(ConfigError, match="wheel_lock is empty"):
        _plan(project, _recipe(project, wheel_lock={}))
    recipe = _recipe(project)
    assert recipe.cuda is not None
    name = recipe.cuda.wheels[0].filename
    with pytest.raises(ConfigError, match=f"cuda.wheels pins {re.escape(name)}"):
        _plan(project, _recipe(project, wheel_lock={**recipe.wheel_lock, name: "0" * 64}))


def test_the_containerfile_checks_every_locked_wheel_and_refuses_others_before_installing(project: Project) -> None:
    plan = _plan(project)
    text = render(plan, project.containers_dir)
    lock = gpu_wheel.sglang_recipe(plan.recipe).wheel_lock
    written = re.findall(r"^      '([0-9a-f]{64})  /opt/forge/wheelhouse/(\S+\.whl)' \\$", text, re.M)
    assert dict((name, sha) for sha, name in written) == lock and len(written) == len(lock) == 202
    check = text.index("sha256sum --check --strict")
    assert check < text.index("comm -23") < text.index("install_wheelhouse.py")
    assert "--exclude=outlines" in text
    assert "nvidia/cuda" not in text and "FROM ${BASE_IMAGE} AS runtime" in text
    # The legacy builder has no bind mount; the rest of the file is the same.
    legacy = render(_plan(project, options=PlanOptions(max_jobs=2, buildkit=False)), project.containers_dir)
    assert "--mount=" not in legacy and legacy.count("/opt/forge/wheelhouse/") == text.count("/opt/forge/wheelhouse/")


def test_a_lock_value_that_is_no_sha256_is_refused_naming_its_key(project_copy: Path) -> None:
    recipe = project_copy / "recipes" / f"{TARGET}.yaml"
    text = recipe.read_text(encoding="utf-8")
    line = next(ln for ln in text.splitlines() if ln.startswith("  torch-2.14.1-"))
    recipe.write_text(text.replace(line, line.rsplit(" ", 1)[0] + " '$(reboot)'"), encoding="utf-8")
    with pytest.raises(ConfigError, match="wheel_lock"):
        _ = Project.load(project_copy).recipes


# --- the lock against a wheelhouse ------------------------------------------------------------------------------


def _wheels(folder: Path, *names: str) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    lock = {}
    for name in names:
        (folder / name).write_bytes(name.encode())
        lock[name] = hashlib.sha256(name.encode()).hexdigest()
    return lock


A = "aiohttp-3.14.5-cp313-cp313-manylinux_2_28_x86_64.whl"
B = "sglang-0.5.23-cp313-cp313-manylinux_2_34_x86_64.whl"


def test_lock_drift_names_missing_unlocked_and_changed_wheels(tmp_path: Path) -> None:
    lock = _wheels(tmp_path, A, B)
    assert gpu_wheel.lock_drift(lock, tmp_path).clean
    (tmp_path / B).write_bytes(b"another build")
    (tmp_path / "six-1.17.0-py2.py3-none-any.whl").write_bytes(b"x")
    (tmp_path / A).unlink()
    drift = gpu_wheel.lock_drift(lock, tmp_path)
    assert drift.missing == (A,)
    assert drift.unlocked == ("six-1.17.0-py2.py3-none-any.whl",)
    assert [(name, locked) for name, locked, _ in drift.changed] == [(B, lock[B])]
    assert drift.changed[0][2] == hashlib.sha256(b"another build").hexdigest()
    assert gpu_wheel.lock_drift(lock, tmp_path / "absent").missing == (A, B)


def test_lock_problems_are_two_files_of_a_project_and_a_pin_the_lock_does_not_hold(project: Project) -> None:
    assert gpu_wheel.lock_problems(_recipe(project)) == []
    twice = {**_recipe(project).wheel_lock, "torch-2.13.0-cp313-cp313-manylinux_2_28_x86_64.whl": "a" * 64}
    problems = gpu_wheel.lock_problems(_recipe(project, wheel_lock=twice))
    assert len(problems) == 1 and problems[0].startswith("two files of torch: torch-2.14.1-")
    without = {k: v for k, v in _recipe(project).wheel_lock.items() if not k.startswith("sglang_kernel-")}
    assert gpu_wheel.lock_problems(_recipe(project, wheel_lock=without)) == [
        "wheelhouse.requirements pins sglang-kernel==0.4.10, the lock has none"
    ]


def _preflight(project_copy: Path, wheelhouse: Path, lock: dict[str, str]) -> dict[str, Finding]:
    recipe = project_copy / "recipes" / f"{TARGET}.yaml"
    head = recipe.read_text(encoding="utf-8").split("wheel_lock:", 1)[0]
    body = "".join(f"  {name}: {sha}\n" for name, sha in lock.items())
    tail = "entrypoint: [python3, -m, sglang.launch_server]\nserve_test: false\n"
    tail += "resources: {disk_gb: 1, scratch_gb: 1, ram_per_job_gb: 1}\n"
    recipe.write_text(head.replace("sglang-kernel==0.4.10, torch==2.14.1, nvidia-cuda-cuobjdump==13.5.37", "")
                      .replace("[sglang==0.5.23, ]", "[sglang==0.5.23]")
                      + "wheel_lock:\n" + body + tail, encoding="utf-8")  # fmt: skip
    project = Project.load(project_copy)
    report = run_preflight(
        project,
        project.distro("debian-13"),
        project.recipe_for(TARGET),
        engine=None,
        source=None,
        max_jobs=1,
        scratch_dir=wheelhouse,
        probe=False,
        wheelhouse=[wheelhouse],
    )
    return {f.gate: f for f in (*report.findings, *report.passed)}


def test_preflight_passes_the_locked_wheelhouse_and_blocks_one_that_moved(project_copy: Path, tmp_path: Path) -> None:
    house = tmp_path / "wheels"
    house.mkdir()
    lock = _wheels(tmp_path / "elsewhere", A, B)
    absent = _preflight(project_copy, house, lock)["wheelhouse"]
    assert not absent.evaluated and not absent.blocking and absent.found == f"no wheel in {house}"
    lock = _wheels(house, A, B)
    found = _preflight(project_copy, house, lock)
    assert found["wheel-lock"].passed and found["wheelhouse"].passed
    (house / "aiohttp-3.15.0-cp313-cp313-manylinux_2_28_x86_64.whl").write_bytes(b"newer")
    (house / A).unlink()
    found = _preflight(project_copy, house, lock)
    gate = found["wheelhouse"]
    assert gate.blocking
    assert f"missing: {A}" in gate.found and "not in the lock: aiohttp-3.15.0" in gate.found
    assert "forge fetch debian-13 sglang-gpu-wheel wheelhouse" in gate.remedy


# --- the test stage on recorded output -----------------------------------------------------------------------


def test_the_recorded_archs_cover_the_recipes_list_and_the_report_keeps_the_core_set() -> None:
    archs, recorded = gpu_wheel_checks.judge_archs(0, PROBE, ARCH_LIST, 1.0)
    assert archs.name == "cuda-archs" and archs.ok and not archs.skipped, archs.detail
    assert archs.data is not None
    assert archs.data["cuda_archs"] == {
        "sgl_kernel/sm100/common_ops.abi3.so": {
            "sass": ["sm_80", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_120a"],
            "ptx": [],
        },
        "sgl_kernel/sm90/common_ops.abi3.so": {
            "sass": ["sm_80", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_120a"],
            "ptx": [],
        },
    }
    assert "torch/lib/libtorch_cuda.so: SASS sm_75 sm_80" in archs.detail
    assert recorded.name == "kernel-archs" and recorded.ok and recorded.data is not None
    assert sorted(recorded.data["cuda_archs"]) == [
        "sgl_kernel/flash_ops.abi3.so",
        "sgl_kernel/flashmla_ops.abi3.so",
        "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so",
        "sgl_kernel/sm100/common_ops.abi3.so",
        "sgl_kernel/sm90/common_ops.abi3.so",
        "sgl_kernel/spatial_ops.abi3.so",
        "torch/lib/libtorch_cuda.so",
        "torch/lib/libtorch_cuda_linalg.so",
    ]
    assert recorded.data["cuda_archs"]["sgl_kernel/flash_ops.abi3.so"]["sass"] == ["sm_80", "sm_86", "sm_90a"]


@pytest.mark.parametrize(
    ("arch_list", "gaps"),
    [
        # T4: no sm_7x in common_ops (torch has sm_75).
        ("7.5 9.0", ["sgl_kernel/sm100/common_ops.abi3.so has no kernels for 7.5", "sm90/common_ops.abi3.so has no"]),
        # GB10: sm_120a runs on 12.0 alone and there is no PTX; torch has sm_121a.
        (
            "12.1",
            ["sm100/common_ops.abi3.so has no kernels for 12.1", "sm90/common_ops.abi3.so has no kernels for 12.1"],
        ),
    ],
)
def test_an_arch_the_core_kernels_lack_fails_the_check_naming_library_and_arch(arch_list: str, gaps: list[str]) -> None:
    archs, _ = gpu_wheel_checks.judge_archs(0, PROBE, arch_list, 1.0)
    assert not archs.ok
    assert archs.detail.startswith(f"2 gap(s) against arch_list {arch_list}:")
    for gap in gaps:
        assert gap in archs.detail
    assert "libtorch_cuda" not in archs.detail


def test_the_report_gates_a_gpu_on_sglangs_core_kernels_not_on_its_attention_backends(tmp_path: Path) -> None:
    archs, recorded = gpu_wheel_checks.judge_archs(0, PROBE, ARCH_LIST, 1.0)
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"tests": [recorded.as_report(), archs.as_report()]}), encoding="utf-8")
    libs, origin = image_libraries(str(report))
    assert "read by cuobjdump" in origin
    gpus = [Gpu(name=n, capability=Capability(*c), source="test") for n, c in
            [("B200", (10, 0)), ("H100", (9, 0)), ("L4", (8, 9)), ("T4", (7, 5)), ("GB10", (12, 1))]]  # fmt: skip
    verdicts = {v.gpu.name: v for v in judge(gpus, libs)}
    # flash_ops has no Blackwell kernels, and a B200 still passes: SGLang picks another attention backend there.
    assert [name for name, v in verdicts.items() if v.supported] == ["B200", "H100", "L4"]
    assert verdicts["H100"].runs == {
        "sgl_kernel/sm100/common_ops.abi3.so": "sm_90a SASS",
        "sgl_kernel/sm90/common_ops.abi3.so": "sm_90a SASS",
    }


def test_an_unreadable_probe_or_a_missing_core_library_fails_the_check() -> None:
    (no_tool,) = gpu_wheel_checks.judge_archs(0, 'CUOBJDUMP {"tool": null, "libs": {}}', ARCH_LIST, 1.0)
    assert not no_tool.ok and "no cuobjdump in the image" in no_tool.detail
    (died,) = gpu_wheel_checks.judge_archs(137, "Killed", ARCH_LIST, 1.0)
    assert not died.ok and died.detail == "Killed"
    facts = json.loads(PROBE.split(" ", 1)[1])
    del facts["libs"]["sgl_kernel/sm90/common_ops.abi3.so"]
    archs, recorded = gpu_wheel_checks.judge_archs(0, "CUOBJDUMP " + json.dumps(facts), ARCH_LIST, 1.0)
    assert not archs.ok and "sgl_kernel/sm90/common_ops.*.so" in archs.detail and recorded.ok
    facts["libs"]["sgl_kernel/flash_ops.abi3.so"]["--list-elf"] = [1, ["cuobjdump fatal   : Could not open input file"]]
    (broken,) = gpu_wheel_checks.judge_archs(0, "CUOBJDUMP " + json.dumps(facts), ARCH_LIST, 1.0)
    assert not broken.ok and "cuobjdump --list-elf sgl_kernel/flash_ops.abi3.so exited 1" in broken.detail


def _imported(error: str | None) -> str:
    facts = {"sglang": "0.5.23", "sgl_kernel": "0.4.10", "torch": "2.14.1+cu130", "cuda": "13.0", "error": error}
    return "some warning\nSGLANG " + json.dumps(facts) + "\n"


def test_sgl_kernel_without_the_driver_is_skipped_not_passed_and_any_other_error_fails() -> None:
    sglang, kernel = gpu_wheel_checks.judge_imports(0, _imported(None), 3.0)
    assert sglang.ok and sglang.detail == "0.5.23 2.14.1+cu130 (CUDA 13.0)" and kernel.status == "passed"
    assert ENGINES.get("sglang").versions([sglang]) == {"sglang": "0.5.23", "torch": "2.14.1+cu130"}
    no_driver = "ImportError: libcuda.so.1: cannot open shared object file: No such file or directory"
    _, kernel = gpu_wheel_checks.judge_imports(0, _imported(no_driver), 3.0)
    assert kernel.status == "skipped" and kernel.detail.startswith("skipped: not passed, sgl_kernel 0.4.10 needs")
    _, kernel = gpu_wheel_checks.judge_imports(0, _imported("ImportError: undefined symbol: _ZN3c10"), 3.0)
    assert kernel.status == "failed" and "undefined symbol" in kernel.detail
    sglang, kernel = gpu_wheel_checks.judge_imports(1, "ModuleNotFoundError: No module named 'outlines'", 3.0)
    assert sglang.status == "failed" and "outlines" in sglang.detail and kernel.status == "skipped"
