"""The implementation's view of an attention layer: AttnSpec (with its softmax scale and ALiBi slopes) and the
fp8 e4m3 quantiser the KV store writes with. The kernels, layouts and store read these; the oracle
(builders/kvlab/oracle.py) does not import this module and computes each of them its own way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float32]

FP8_E4M3_MAX = 448.0
"""The largest finite e4m3fn value (1.75 × 2^8): vLLM saturates to it rather than overflow to NaN."""
_FP8_MIN_NORMAL_EXP = -6
_FP8_MANTISSA_BITS = 3


def alibi_slopes(num_heads: int) -> npt.NDArray[np.float32]:
    """ALiBi's slopes: a geometric sequence for the largest power of two ≤ num_heads, and for the remaining
    heads every other slope of the sequence for twice that power (how BLOOM and vLLM extend it)."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = [base**p for p in range(1, closest + 1)]
    if closest != num_heads:
        extra_base = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
        remaining = min(closest, num_heads - closest)
        slopes += [extra_base**p for p in range(1, 1 + 2 * remaining, 2)]
    return np.asarray(slopes, dtype=np.float32)


def fp8_e4m3(x: npt.NDArray[np.floating]) -> Array:
    """Round to the nearest e4m3fn value (ties to even), saturating at ±448; NaN stays NaN.

    Normal values keep 3 mantissa bits; below 2^-6 the spacing is the subnormal one, 2^-9."""
    x = np.asarray(x, dtype=np.float64)
    magnitude = np.minimum(np.abs(x), FP8_E4M3_MAX)
    with np.errstate(divide="ignore", invalid="ignore"):
        exponent = np.floor(np.log2(np.where(magnitude > 0, magnitude, 1.0)))
    exponent = np.maximum(exponent, _FP8_MIN_NORMAL_EXP)
    spacing = np.exp2(exponent - _FP8_MANTISSA_BITS)
    rounded = np.minimum(np.round(magnitude / spacing) * spacing, FP8_E4M3_MAX)
    return np.where(np.isnan(x), np.nan, np.copysign(rounded, x)).astype(np.float32)


@dataclass(frozen=True, kw_only=True, eq=False)
class AttnSpec:
    """What an attention layer is: head counts and size, and its options. The layouts and kernels read it; the
    oracle gets only its plain settings (see Lab.expected) and derives scale and slopes itself."""

    num_heads: int
    num_kv_heads: int
    head_size: int
    alibi: bool = False
    sliding_window: int | None = None
    k_scale: float | None = None
    """Set (with v_scale) for fp8 KV: the cache holds e4m3(k / k_scale)."""
    v_scale: float | None = None

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_heads} query heads do not split into {self.num_kv_heads} KV heads")
        if (self.k_scale is None) != (self.v_scale is None):
            raise ValueError("fp8 needs both k_scale and v_scale")

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_size)

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def fp8(self) -> bool:
        return self.k_scale is not None

    @property
    def slopes(self) -> npt.NDArray[np.float32] | None:
        return alibi_slopes(self.num_heads) if self.alibi else None

    def features(self) -> list[str]:
        kind = "mha" if self.group == 1 else "mqa" if self.num_kv_heads == 1 else "gqa"
        out = [kind]
        if self.alibi:
            out.append("alibi" if self.num_heads & (self.num_heads - 1) == 0 else "alibi-non-pow2")
        if self.sliding_window is not None:
            out.append("sliding-window")
        if self.fp8:
            out.append("fp8")
        return out
