"""The llama.cpp tree inside llama-cpp-python's sdist: where it lives, and the GGML ISA options it offers."""

from __future__ import annotations

from pathlib import Path

from builders.engines.sdist import sdist_member
from builders.errors import ConfigError

# The tree inside the sdist: every path the gates cite is relative to the sdist's top folder.
VENDORED = "vendor/llama.cpp"

# GGML's CPU-backend options (ggml/CMakeLists.txt) and the /proc/cpuinfo flag each one makes the binary require.
GGML_ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "GGML_SSE42": ("sse4_2",),
    "GGML_AVX": ("avx",),
    "GGML_AVX2": ("avx2",),
    "GGML_FMA": ("fma",),
    "GGML_F16C": ("f16c",),
    "GGML_BMI2": ("bmi2",),
    "GGML_AVX_VNNI": ("avx_vnni",),
    "GGML_AVX512": ("avx512f",),
    "GGML_AVX512_VBMI": ("avx512vbmi",),
    "GGML_AVX512_VNNI": ("avx512_vnni",),
    "GGML_AVX512_BF16": ("avx512_bf16",),
    "GGML_AMX_TILE": ("amx_tile",),
    "GGML_AMX_INT8": ("amx_int8",),
    "GGML_AMX_BF16": ("amx_bf16",),
}


def read_member(sdist: Path, relative: str) -> str:
    """A file of the vendored tree, read from the sdist without unpacking it."""
    text = sdist_member(sdist, f"{VENDORED}/{relative}")
    if text is None:
        raise ConfigError(
            f"{sdist.name}: {VENDORED}/{relative} is missing",
            hint="the recipe's source must be an sdist that vendors llama.cpp (llama-cpp-python's)",
        )
    return text
