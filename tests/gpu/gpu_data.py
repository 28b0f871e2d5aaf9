"""cuobjdump's captured output for vLLM 0.33.0's CUDA wheel, read as the tests of the arch reader and gate need it."""

from __future__ import annotations

from pathlib import Path

from builders.gpu_archs import LibraryArchs, parse_listing

DATA = Path(__file__).parent / "data" / "cuobjdump"
VLLM = DATA / "vllm-0.33.0"
# vLLM 0.33.0's recipe arch_list (recipes/vllm-gpu.yaml), the list the wheel's libraries are judged by.
ARCH_LIST = "7.5 8.0 8.6 8.9 9.0 10.0 11.0 12.0"


def captured(directory: Path, stem: str) -> LibraryArchs:
    elf = directory / f"{stem}.elf.txt"
    ptx = directory / f"{stem}.ptx.txt"
    return LibraryArchs(
        library=stem,
        sass=parse_listing(elf.read_text(), "sass", where=str(elf)),
        ptx=parse_listing(ptx.read_text(), "ptx", where=str(ptx)),
    )


def vllm_libraries() -> list[LibraryArchs]:
    return [captured(VLLM, p.name.removesuffix(".elf.txt")) for p in sorted(VLLM.glob("*.elf.txt"))]
