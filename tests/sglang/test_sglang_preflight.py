"""SGLang's CPU target without an engine: its gates on recorded /proc/cpuinfo texts, read from an sdist and a
sgl-kernel checkout written here with the lines they cite, its plan and Containerfile, and the refusal without
a checkout. No compile: the real build is `nox -s build-debian-13-sglang` (docs/sglang.md)."""

from __future__ import annotations

import io
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from builders.engines import ENGINES, make_plan
from builders.engines.sglang import kernel_source
from builders.errors import SourceUnavailable, UsageError
from builders.gates.findings import Finding
from builders.gates.host import parse_cpu_flags, read_host_facts
from builders.plan import PlanOptions
from builders.preflight.command import split_sources
from builders.preflight.runner import run_preflight
from builders.project import Project
from builders.render import render
from builders.target import Target

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ENGINES.get("sglang")
CPUINFO = ROOT / "tests" / "smoke" / "fixtures"
EPYC_AVX2 = parse_cpu_flags((CPUINFO / "cpuinfo-amd-epyc-avx2.txt").read_text(encoding="utf-8"))
CASCADE_LAKE = parse_cpu_flags((CPUINFO / "cpuinfo-xeon-cascade-lake-avx512.txt").read_text(encoding="utf-8"))
SAPPHIRE_RAPIDS = parse_cpu_flags((CPUINFO / "cpuinfo-xeon-sapphire-rapids-amx.txt").read_text(encoding="utf-8"))

VEC_H = """#pragma once

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AMX_BF16__)
#define CPU_CAPABILITY_AVX512
#endif
"""


def _sdist(tmp_path: Path, *, kernel: str = "0.4.1", torch: str = "2.9.0") -> Path:
    files = {
        "pyproject.toml": f'[project]\ndependencies = [\n  "numpy",\n  "sglang-kernel=={kernel}",\n]\n',
        "pyproject_cpu.toml": f'[project]\ndependencies = [\n  "torch=={torch}",\n]\n',
        "sglang/srt/utils/common.py": "import torch\n\ntry:\n    x = torch._C._cpu._is_amx_tile_supported()\nexcept:\n    pass\n",
        "sglang/srt/layers/moe/moe_runner/deep_gemm.py": "import torch\n\n\n@torch.compile(disable=False)\ndef f():\n    pass\n",
    }
    path = tmp_path / "sglang-0.5.10.post1.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"sglang-0.5.10.post1/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _checkout(
    root: Path, *, version: str = "0.4.1", torch: str = "2.9.0", vec_h: str = VEC_H, moved: bool = False
) -> Path:
    """A checkout's root holding sgl-kernel/ (or, `moved`, the later layout without it)."""
    if moved:
        cmake = root / kernel_source.MOVED_CPU_CMAKE
        cmake.parent.mkdir(parents=True)
        cmake.write_text("project(sgl_kernel)\n")
        return root
    kernel = root / "sgl-kernel"
    for relative, text in {
        kernel_source.CPU_PROJECT: f'[build-system]\nrequires = [\n  "scikit-build-core>=0.10",\n  "torch=={torch}",\n]\n',
        kernel_source.CPU_CMAKE: "project(sgl_kernel)\n\nadd_compile_options(\n    -O3\n    -march=native\n)\n",
        kernel_source.VEC_HEADER: vec_h,
        kernel_source.VERSION_FILE: f'__version__ = "{version}"\n',
    }.items():
        (kernel / relative).parent.mkdir(parents=True, exist_ok=True)
        (kernel / relative).write_text(text)
    return root


def _target(project: Project, recipe: str, distro: str = "debian-13") -> Target:
    return Target.resolve(project.distro(distro), project.recipe_for(recipe))


def _preflight(
    project: Project, flags: frozenset[str], sdist: Path, checkout: Path | None = None, distro: str = "debian-13"
) -> dict[str, Finding]:
    report = run_preflight(
        project,
        project.distro(distro),
        project.recipe_for("sglang"),
        engine=None,
        source=sdist,
        max_jobs=2,
        scratch_dir=ROOT,
        probe=False,
        run_host_flags=flags,
        run_host_source="run CPU",
        host=replace(read_host_facts(), cpu_flags=flags),
        given_sources={"sgl-kernel": checkout} if checkout else None,
    )
    return {f.gate: f for f in (*report.findings, *report.passed)}


def test_without_a_checkout_the_kernel_gates_cite_the_pinned_commit_and_the_source_gate_is_not_evaluated(
    project: Project, tmp_path: Path
) -> None:
    found = _preflight(project, SAPPHIRE_RAPIDS, _sdist(tmp_path))
    source = found["sgl-kernel-source"]
    assert source.verdict == "skip" and "--source sgl-kernel=PATH" in source.remedy
    assert kernel_source.COMMIT in source.required and source.source.endswith("pyproject.toml:4")
    isa = found["isa-avx512"]
    assert isa.verdict == "pass" and f"@{kernel_source.COMMIT} sgl-kernel/csrc/cpu/vec.h:3" in isa.source
    assert found["torch-pin"].verdict == "pass" and found["torch-pin"].source.endswith("pyproject_cpu.toml:3")


@pytest.mark.parametrize(
    ("flags", "lacking"),
    [(EPYC_AVX2, "avx512f, avx512_bf16, amx_bf16"), (CASCADE_LAKE, "avx512_bf16, amx_bf16")],
    ids=["amd-epyc-avx2", "xeon-cascade-lake-avx512"],
)
def test_a_recorded_cpu_without_avx512_bf16_and_amx_is_blocked_on_both_hosts(
    project: Project, tmp_path: Path, flags: frozenset[str], lacking: str
) -> None:
    isa = _preflight(project, flags, _sdist(tmp_path), _checkout(tmp_path / "src"))["isa-avx512"]
    assert isa.verdict == "block"
    assert isa.found == f"build host /proc/cpuinfo: lacks {lacking}; run CPU: lacks {lacking}"
    assert isa.source.endswith("sgl-kernel/csrc/cpu/vec.h:3 and sgl-kernel/csrc/cpu/CMakeLists.txt:5")


def test_a_checkout_at_the_pinned_kernels_passes_every_kernel_gate_on_sapphire_rapids(
    project: Project, tmp_path: Path
) -> None:
    found = _preflight(project, SAPPHIRE_RAPIDS, _sdist(tmp_path), _checkout(tmp_path / "src"))
    assert {g: found[g].verdict for g in ("isa-avx512", "isa-amx", "sgl-kernel-source", "torch-pin")} == dict.fromkeys(
        ("isa-avx512", "isa-amx", "sgl-kernel-source", "torch-pin"), "pass"
    )
    assert found["sgl-kernel-source"].found.startswith("sgl-kernel 0.4.1 at ")
    assert "sgl-kernel/python/sgl_kernel/version.py:1" in found["sgl-kernel-source"].found


def test_the_isa_the_checkout_states_is_the_one_required(project: Project, tmp_path: Path) -> None:
    wider = VEC_H.replace("defined(__AMX_BF16__)", "defined(__AMX_BF16__) && defined(__AVX512FP16__)")
    isa = _preflight(project, SAPPHIRE_RAPIDS - {"avx512_fp16"}, _sdist(tmp_path), _checkout(tmp_path, vec_h=wider))[
        "isa-avx512"
    ]
    assert isa.verdict == "block" and isa.required == "avx512f, avx512_bf16, amx_bf16, avx512_fp16"


def test_another_kernel_release_or_torch_pin_is_blocked_naming_both_files(project: Project, tmp_path: Path) -> None:
    found = _preflight(project, SAPPHIRE_RAPIDS, _sdist(tmp_path), _checkout(tmp_path / "src", version="0.4.2"))
    source = found["sgl-kernel-source"]
    assert source.verdict == "block" and source.found.startswith("sgl-kernel 0.4.2")
    assert source.required.startswith("sgl-kernel 0.4.1") and kernel_source.COMMIT in source.remedy
    torch = _preflight(project, SAPPHIRE_RAPIDS, _sdist(tmp_path), _checkout(tmp_path / "other", torch="2.8.0"))[
        "torch-pin"
    ]
    assert torch.verdict == "block" and torch.required == "torch==2.8.0 and torch==2.9.0"
    assert "sgl-kernel/pyproject_cpu.toml:4" in torch.source and "set torch.version" in torch.remedy


def test_a_checkout_in_the_later_layout_is_refused_naming_the_commit_to_check_out(
    project: Project, tmp_path: Path
) -> None:
    moved = _checkout(tmp_path / "src", moved=True)
    source = _preflight(project, SAPPHIRE_RAPIDS, _sdist(tmp_path), moved)["sgl-kernel-source"]
    assert source.verdict == "block" and "python/sglang/kernels/aot/csrc/cpu/" in source.found
    with pytest.raises(SourceUnavailable) as err:
        ENGINE.checkouts(_target(project, "sglang"), {"sgl-kernel": moved})
    assert "0.5.11" in err.value.message and kernel_source.COMMIT in (err.value.hint or "")


def test_the_build_refuses_without_a_checkout_naming_the_commit_and_the_source_flag(project: Project) -> None:
    with pytest.raises(SourceUnavailable) as err:
        ENGINE.checkouts(_target(project, "sglang"), {})
    assert f"{kernel_source.REPOSITORY}@{kernel_source.COMMIT}" in err.value.message
    assert "sgl-kernel 0.4.1, which sglang 0.5.10.post1 requires" in err.value.message
    assert "--source sgl-kernel=PATH" in (err.value.hint or "")
    assert SourceUnavailable.exit_code == 4
    assert ENGINE.checkouts(_target(project, "sglang-gpu", "ubuntu-24.04"), {}) == []


def test_a_checkout_root_or_its_kernel_folder_both_resolve_to_the_kernel_folder(
    project: Project, tmp_path: Path
) -> None:
    root = _checkout(tmp_path)
    for given in (root, root / "sgl-kernel"):
        (resolved,) = ENGINE.checkouts(_target(project, "sglang"), {"sgl-kernel": given})
        assert resolved.path == root / "sgl-kernel" and resolved.name == "sgl-kernel"


def test_preflight_takes_named_checkouts_as_build_does(tmp_path: Path) -> None:
    assert split_sources([str(tmp_path), f"sgl-kernel={tmp_path}"]) == (tmp_path, {"sgl-kernel": tmp_path})
    assert split_sources([f"vllm={tmp_path}"]) == (tmp_path, {})
    with pytest.raises(UsageError, match="one is the engine's source"):
        split_sources([str(tmp_path), str(tmp_path)])


def test_torch_from_pypi_is_the_cuda_build_linked_through_the_stub(project: Project) -> None:
    distro, recipe = project.distro("debian-14"), project.recipe_for("sglang")
    pypi = make_plan(distro, recipe, PlanOptions(max_jobs=2, torch_index="pypi"))
    text = render(pypi, ROOT / "containers")
    assert pypi.torch is not None and pypi.torch.requirement == "torch==2.9.0" and pypi.torch.cuda_build_on_cpu
    assert "torch_cudart_stub.cmake" in pypi.compile_env["CMAKE_ARGS"]
    assert "COPY scripts/torch_cudart_stub.cmake" in text and "--index-url" not in text
    assert pypi.compile_env["CMAKE_BUILD_PARALLEL_LEVEL"] == "2"
    cpu = make_plan(distro, recipe, PlanOptions(max_jobs=2))
    cpu_text = render(cpu, ROOT / "containers")
    assert "torch==2.9.0+cpu" in cpu_text and "--index-url https://download.pytorch.org/whl/cpu" in cpu_text
    assert "CMAKE_ARGS" not in cpu.compile_env and "torch_cudart_stub" not in cpu_text
    assert cpu.test_checks == ("kernel-ops", "no-compilers", "serve-tiny")
    runtime = cpu_text.split(" AS runtime", 1)[1]
    assert "SGLANG_USE_CPU_ENGINE=1" in runtime and "USER 1000" in runtime and "g++" not in runtime
    assert (
        cpu.labels["dev.forge.sgl-kernel"] == f"0.4.1 ({kernel_source.REPOSITORY}@{kernel_source.COMMIT}, sgl-kernel/)"
    )
    with pytest.raises(UsageError, match=r"torch index 'wheelhouse' for recipes/sglang\.yaml") as err:
        make_plan(distro, recipe, PlanOptions(max_jobs=2, torch_index="wheelhouse"))
    assert err.value.hint == "pass --torch-index pytorch-cpu or --torch-index pypi"


def test_a_python_the_pinned_torchs_compile_refuses_is_blocked_naming_the_import_that_calls_it(
    project: Project, tmp_path: Path
) -> None:
    sdist = _sdist(tmp_path)
    gate = _preflight(project, SAPPHIRE_RAPIDS, sdist, distro="debian-14")["python-torch-compile"]
    assert gate.verdict == "block" and gate.found == "Python 3.14 (distros/debian-14.yaml: toolchain.python)"
    assert gate.required == "Python < 3.14 (torch 2.9's torch.compile)"
    assert gate.source.endswith("sglang/srt/layers/moe/moe_runner/deep_gemm.py:4") and "debian-13" in gate.remedy
    assert _preflight(project, SAPPHIRE_RAPIDS, sdist)["python-torch-compile"].verdict == "pass"
