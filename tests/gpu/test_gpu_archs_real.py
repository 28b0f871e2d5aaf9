"""The arch reader on real bytes: NVIDIA's cuobjdump from PyPI on a real CUDA library from a small PyPI wheel.

No engine and no GPU: two wheels (0.3 MB and 3.8 MB), pinned by sha256, kept in the Forge cache."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from builders.gpu_archs import (
    Arch,
    Capability,
    cuobjdump_from_pypi,
    fetch_wheel,
    parse_listing,
    read_library,
    unpacked_wheel,
    wheel_cache,
)

ROOT = Path(__file__).resolve().parents[2]
NVJPEG = ("nvidia-nvjpeg==13.3.2.43", "27f9c4a25a73f1d1ad35c342c8d657c8ff43e23877f338ef15fb2602ac2e5aa8")
RECORDED = Path(__file__).parent / "data" / "cuobjdump" / "nvjpeg-13.3.2.43"

pytestmark = [
    pytest.mark.network,
    pytest.mark.skipif(platform.machine() != "x86_64", reason="cuobjdump's wheel is pinned for x86_64"),
]


def test_real_cuobjdump_reads_nvjpeg_as_captured() -> None:
    cache = wheel_cache(ROOT)
    tool = cuobjdump_from_pypi(cache)
    (library,) = unpacked_wheel(fetch_wheel(*NVJPEG, cache)).rglob("libnvjpeg.so.*")
    lib = read_library(tool, library)
    assert lib.sass == parse_listing((RECORDED / "libnvjpeg.elf.txt").read_text(), "sass", where="captured")
    assert lib.ptx == parse_listing((RECORDED / "libnvjpeg.ptx.txt").read_text(), "ptx", where="captured")
    assert Arch(12, 1) in lib.ptx
    assert lib.runs_on(Capability(7, 0)) is None
    assert lib.runs_on(Capability(9, 0)) == "sm_90 SASS"


def test_real_cuobjdump_on_a_library_without_device_code() -> None:
    cache = wheel_cache(ROOT)
    tool = cuobjdump_from_pypi(cache)
    # cuobjdump's own binary holds no fatbin: exit 255 with a note, read as no archs, not as an error.
    lib = read_library(tool, tool)
    assert not lib.has_device_code
