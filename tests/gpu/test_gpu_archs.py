"""The cuobjdump reader and the CUDA compatibility rules, on cuobjdump's real output for vLLM 0.33.0's wheel."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_data import ARCH_LIST, DATA, VLLM, captured, vllm_libraries

from builders.errors import ConfigError, ForgeError
from builders.gpu_archs import Arch, Capability, core, coverage_gaps, parse_listing


def sms(archs: frozenset[Arch]) -> list[str]:
    return [a.sm() for a in sorted(archs)]


def test_vllm_core_library_archs_as_cuobjdump_lists_them() -> None:
    c = captured(VLLM, "_C_stable_libtorch")
    assert sms(c.sass) == ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_120"]
    assert sms(c.ptx) == ["sm_80", "sm_89", "sm_90"]
    moe = captured(VLLM, "_moe_C_stable_libtorch")
    assert sms(moe.sass) == ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"]
    assert sms(moe.ptx) == ["sm_80"]


def test_attention_libraries_are_per_gpu_family() -> None:
    assert sms(captured(VLLM, "_vllm_fa3_C").sass) == ["sm_90a"]
    assert sms(captured(VLLM, "_vllm_fa2_C").sass) == ["sm_80"]
    assert sms(captured(VLLM, "_flashmla_C").sass) == ["sm_90a", "sm_100"]


def test_libraries_without_device_code_read_empty() -> None:
    for stem in ("spinloop", "fs_io_C", "cumem_allocator", "_C_extension"):
        lib = captured(VLLM, stem)
        assert not lib.has_device_code, stem
    assert [library.library for library in core(vllm_libraries())] == ["_C_stable_libtorch", "_moe_C_stable_libtorch"]


def test_unknown_line_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    text = "ELF file    1: x.1.sm_80.cubin\nFatbin elf code:\n"
    with pytest.raises(ForgeError, match=r"out.txt:2: cuobjdump printed 'Fatbin elf code:'"):
        parse_listing(text, "sass", where="out.txt")
    with pytest.raises(ForgeError, match="a PTX entry in a --list-elf"):
        parse_listing("PTX file    1: x.1.sm_80.ptx\n", "sass", where="out.txt")


@pytest.mark.parametrize(
    ("arch", "gpu", "sass", "ptx"),
    [
        ("sm_80", "8.6", True, True),  # within a major, forward
        ("sm_80", "9.0", False, True),  # SASS never crosses a major; PTX does
        ("sm_86", "8.0", False, False),  # nothing goes backwards
        ("sm_90a", "9.0", True, True),
        ("sm_90a", "10.0", False, False),  # arch-specific: 9.0 alone, PTX too
        ("sm_100f", "10.3", True, True),  # family-specific: 10.x from 10.0
        ("sm_100f", "12.0", False, False),
        ("sm_90", "11.0", False, True),
        ("sm_121", "12.0", False, False),
    ],
)
def test_compatibility_rules(arch: str, gpu: str, sass: bool, ptx: bool) -> None:
    a, cap = Arch.parse(arch), Capability.parse(gpu, where="test")
    assert a.sass_runs_on(cap) is sass
    assert a.ptx_jits_on(cap) is ptx


def test_vllm_wheel_covers_the_recipe_arch_list_11_0_only_through_ptx() -> None:
    libs = vllm_libraries()
    assert coverage_gaps(libs, ARCH_LIST, where="recipes/vllm-gpu.yaml") == []
    c = captured(VLLM, "_C_stable_libtorch")
    assert c.runs_on(Capability(11, 0)) == "compute_90 PTX (JIT)"
    assert c.runs_on(Capability(8, 6)) == "sm_86 SASS"
    assert c.runs_on(Capability(10, 3)) == "sm_100 SASS"


def test_a_gap_names_the_library_and_the_arch() -> None:
    gaps = coverage_gaps(vllm_libraries(), "7.0 8.0 6.1", where="--cuda-arch-list")
    assert [(g.library, str(g.capability)) for g in gaps] == [
        ("_C_stable_libtorch", "7.0"),
        ("_C_stable_libtorch", "6.1"),
        ("_moe_C_stable_libtorch", "7.0"),
        ("_moe_C_stable_libtorch", "6.1"),
    ]
    assert gaps[0].message().startswith("_C_stable_libtorch has no kernels for 7.0: SASS sm_75 sm_80")


def test_bad_arch_list_names_where() -> None:
    with pytest.raises(ConfigError, match="--cuda-arch-list: 'x' is not a compute capability"):
        coverage_gaps(vllm_libraries(), "8.0 x", where="--cuda-arch-list")


def test_nvjpeg_listing() -> None:
    lib = captured(DATA / "nvjpeg-13.3.2.43", "libnvjpeg")
    assert sms(lib.sass) == [f"sm_{n}" for n in (75, 80, 86, 89, 90, 100, 103, 107, 120, 121)]
    assert sms(lib.ptx) == ["sm_121"]
