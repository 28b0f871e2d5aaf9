"""The Debian GPU image from PyPI's wheels: its plan and Containerfile, and how its test stage judges what it read
(probe outputs built from cuobjdump's real listings of vLLM 0.33.0's libraries)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gpu_data import ARCH_LIST, VLLM

from builders.engines import make_plan
from builders.engines.vllm.gpu_wheel import judge_archs, judge_libs
from builders.errors import UsageError
from builders.gpu_image import image_libraries
from builders.plan import BuildPlan, PlanOptions
from builders.preflight.gpu_gate import gpu_from_product, judge
from builders.project import Project
from builders.render import render
from builders.target import Target


def plan(project: Project, distro: str = "debian-13", **kw: Any) -> BuildPlan:
    return make_plan(project.distro(distro), project.recipe_for("gpu-wheel"), PlanOptions(max_jobs=1, **kw))


def test_plan_is_a_cuda_image_on_debians_own_base(project: Project) -> None:
    p = plan(project)
    assert p.cuda is not None and p.cuda.mode == "wheel" and p.cuda.devel_ref is None
    assert p.base_ref == "forge/base:debian-13"
    assert p.cuda.wheel is not None
    assert p.cuda.wheel.sha256 == "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"
    assert {"cuda-libs-load", "cuda-archs", "serve-models-gpu"} <= set(p.test_checks)
    assert "torch-cuda" not in p.test_checks  # that check compares with a CUDA base's version; there is none
    assert p.labels["dev.forge.cuda.arch_list"] == "7.5 8.0 8.6 8.9 9.0 10.0 12.0"
    # The driver gate's input: the CUDA of PyPI's torch 2.14.0 wheels, which the test stage checks.
    assert p.labels["dev.forge.cuda.version"] == "13.0"
    assert [c.kind for c in p.context] == ["script", "wheelhouse"]
    target = Target.resolve(project.distro("debian-13"), project.recipe_for("gpu-wheel"))
    assert target.cuda and target.from_wheelhouse and not target.compiles


def test_arch_list_override_reaches_the_check(project: Project) -> None:
    p = plan(project, cuda_arch_list="9.0 10.0")
    assert p.cuda is not None and p.cuda.arch_list == "9.0 10.0"


def test_other_distros_are_refused(project: Project) -> None:
    with pytest.raises(UsageError, match="does not support debian-12"):
        plan(project, "debian-12")


def test_containerfile_checks_the_pinned_wheel_and_carries_no_nvidia_base(project: Project) -> None:
    text = render(plan(project), project.containers_dir)
    assert (
        'echo "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa  '
        '/opt/forge/wheelhouse/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl" | sha256sum -c -'
    ) in text
    assert "nvidia/cuda" not in text and "FROM ${BASE_IMAGE} AS runtime" in text
    assert "VLLM_TARGET_DEVICE=cuda" in text
    assert " g++" not in text  # Triton needs gcc and Python.h, not a C++ compiler


def libs_out(libs: dict[str, str | None]) -> str:
    return "noise\nCUDALIBS " + json.dumps({"torch": "2.14.0+cu130", "cuda": "13.0", "libs": libs})


def test_libs_all_loading_pass() -> None:
    r = judge_libs(0, libs_out({"vllm/_C_stable_libtorch.abi3.so": None, "vllm/spinloop.abi3.so": None}), 1.0)
    assert r.status == "passed" and "2/2 load" in r.detail


def test_missing_driver_is_a_finding_never_a_pass() -> None:
    err = "libcuda.so.1: cannot open shared object file: No such file or directory"
    r = judge_libs(0, libs_out({"vllm/cumem_allocator.abi3.so": err, "vllm/_C_stable_libtorch.abi3.so": None}), 1.0)
    assert r.status == "skipped" and r.detail.startswith("skipped: not passed")
    assert "vllm/cumem_allocator.abi3.so" in r.detail and "NVIDIA Container Toolkit" in r.detail


def test_torch_for_another_cuda_than_the_label_fails_and_the_report_keeps_both() -> None:
    out = libs_out({"vllm/_C_stable_libtorch.abi3.so": None})
    r = judge_libs(0, out, 1.0, "12.8")
    assert r.status == "failed" and "built for CUDA 13.0" in r.detail and "says 12.8" in r.detail
    r = judge_libs(0, out, 1.0, "13.0")
    assert r.status == "passed" and r.data == {"torch": "2.14.0+cu130", "cuda_runtime": "13.0"}


def test_any_other_load_failure_fails() -> None:
    err = "vllm/_C.abi3.so: undefined symbol: _ZN3c104cuda9SetDeviceEi"
    r = judge_libs(0, libs_out({"vllm/_C.abi3.so": err, "vllm/x.so": "libcuda.so.1: cannot open"}), 1.0)
    assert r.status == "failed" and "undefined symbol" in r.detail
    assert judge_libs(1, "Traceback: ImportError: no vllm", 1.0).status == "failed"


def archs_out() -> str:
    """What the image's probe prints for vLLM's libraries, from cuobjdump's captured listings."""
    libs = {}
    for elf in sorted(VLLM.glob("*.elf.txt")):
        stem = elf.name.removesuffix(".elf.txt")
        ptx = VLLM / f"{stem}.ptx.txt"
        entry = {}
        for flag, path in (("--list-elf", elf), ("--list-ptx", ptx)):
            text = path.read_text()
            # cuobjdump exits 255 where it finds no code of the kind asked for, as it did when captured.
            entry[flag] = [0 if text.startswith(("ELF", "PTX")) else 255, text.splitlines()]
        libs[f"vllm/{stem}.abi3.so"] = entry
    return "CUOBJDUMP " + json.dumps({"tool": "/opt/venv/.../cuobjdump", "libs": libs})


def test_archs_cover_the_recipe_list_and_land_in_the_report(tmp_path: Path) -> None:
    r = judge_archs(0, archs_out(), ARCH_LIST, 30.0)
    assert r.status == "passed", r.detail
    assert (
        "_C_stable_libtorch: SASS sm_75 sm_80 sm_86 sm_89 sm_90 sm_90a sm_100 sm_120; PTX compute_80 compute_89 compute_90"
        in r.detail
    )
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"tests": [r.as_report()]}))
    libs, archs_from = image_libraries(str(report))
    assert "vllm/_vllm_fa3_C.abi3.so" in {lib.library for lib in libs} and "read by cuobjdump" in archs_from
    verdicts = judge([gpu_from_product("NVIDIA-H100-80GB-HBM3"), gpu_from_product("Tesla-V100-SXM2-16GB")], libs)
    assert [v.supported for v in verdicts] == [True, False]


def test_a_gap_fails_naming_library_and_arch() -> None:
    r = judge_archs(0, archs_out(), "7.0 9.0", 30.0)
    assert r.status == "failed"
    assert "vllm/_C_stable_libtorch.abi3.so has no kernels for 7.0" in r.detail
    assert r.data is not None and "vllm/_C_stable_libtorch.abi3.so" in r.data["cuda_archs"]


def test_no_cuobjdump_or_an_unknown_failure_fails() -> None:
    assert judge_archs(0, 'CUOBJDUMP {"tool": null, "libs": {}}', ARCH_LIST, 1.0).status == "failed"
    bad = {
        "tool": "t",
        "libs": {"vllm/x.so": {"--list-elf": [1, ["cuobjdump fatal: bad file"]], "--list-ptx": [0, []]}},
    }
    r = judge_archs(0, "CUOBJDUMP " + json.dumps(bad), ARCH_LIST, 1.0)
    assert r.status == "failed" and "exited 1" in r.detail


IMAGE_PROBE = Path(__file__).parent / "data" / "image" / "debian-13-gpu-wheel-archs-probe.txt"


def test_the_built_images_torch_has_no_kernels_for_11_0() -> None:
    """The real image: PyPI's torch 2.14.0+cu130 carries no sm_110 SASS and no PTX, so vLLM's source arch list
    (with 11.0) is a gap there, and the gpu-wheel recipe's list (without it) is covered."""
    out = IMAGE_PROBE.read_text()
    r = judge_archs(0, out, ARCH_LIST, 60.0)
    assert r.status == "failed"
    assert r.detail.splitlines()[1] == (
        "torch/lib/libtorch_cuda.so has no kernels for 11.0: SASS sm_75 sm_80 sm_86 sm_89 sm_90 sm_90a sm_100 "
        "sm_100a sm_103 sm_120 sm_120a sm_121a, PTX none"
    )
    assert len(r.detail.splitlines()) == 2  # vLLM's own _C and _moe_C reach 11.0 through PTX
    recipe_list = "7.5 8.0 8.6 8.9 9.0 10.0 12.0"
    assert judge_archs(0, out, recipe_list, 60.0).status == "passed"


def test_preflight_without_a_fetched_wheelhouse_says_to_fetch_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from builders.cli import main

    monkeypatch.setenv("FORGE_CACHE", str(tmp_path / "cache"))
    main(["preflight", "debian-13", "gpu-wheel", "--no-probe", "--no-fetch", "--json"])
    data = json.loads(capsys.readouterr().out)
    (torch,) = [f for f in data["findings"] if f["gate"] == "torch-wheel"]
    assert not torch["evaluated"]
    assert torch["found"] == f"wheelhouse not fetched: {tmp_path}/cache/wheelhouses/debian-13-gpu-wheel does not exist"
    assert torch["remedy"] == "run `forge fetch debian-13 gpu-wheel wheelhouse`, or pass --wheelhouse DIR"
    assert "(no folder)" not in json.dumps(data) and "unreachable" not in torch["found"]
