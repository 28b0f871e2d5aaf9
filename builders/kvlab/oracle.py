"""The oracle: dense attention in fp32 over the logical KV of a request, with no block, span or pool in sight.

It follows the reference in vLLM's kernel tests (`ref_single_query_cached_kv_attention`): scores and softmax in
fp32, GQA by repeating each KV head over its group of query heads (`repeat_interleave`), ALiBi slopes as
`_get_alibi_slopes` computes them, and fp8 as a per-tensor `k_scale`/`v_scale` applied to e4m3 values. It is
written apart from the layouts' kernel (builders/kvlab/kernel.py) on purpose: a bug they shared would pass.
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


def fp8_grid() -> Array:
    """Every finite non-negative e4m3fn value, built from the bit fields rather than by rounding."""
    values = [m * 2.0**-9 for m in range(8)]
    values += [(1 + m / 8) * 2.0 ** (e - 7) for e in range(1, 16) for m in range(8) if (e, m) != (15, 7)]
    return np.asarray(values, dtype=np.float32)


@dataclass(frozen=True, kw_only=True, eq=False)
class AttnSpec:
    """What an attention layer is: head counts and size, and its options. The oracle and every layout read it."""

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


def reference_attention(q: Array, k: Array, v: Array, spec: AttnSpec, *, q_start: int) -> Array:
    """Dense attention of queries q[n_q, H, D] at positions q_start… over k, v[L, KV, D] at positions 0…L-1:
    causal, windowed and ALiBi-biased as `spec` says; fp8 KV as the cache would hold it."""
    if spec.fp8:
        assert spec.k_scale is not None and spec.v_scale is not None
        k = fp8_e4m3(k / spec.k_scale) * np.float32(spec.k_scale)
        v = fp8_e4m3(v / spec.v_scale) * np.float32(spec.v_scale)
    k = np.repeat(k.astype(np.float32), spec.group, axis=1)
    v = np.repeat(v.astype(np.float32), spec.group, axis=1)
    n_q, length = q.shape[0], k.shape[0]
    q_pos = np.arange(q_start, q_start + n_q)[:, None]
    k_pos = np.arange(length)[None, :]
    allowed = k_pos <= q_pos
    if spec.sliding_window is not None:
        allowed &= q_pos - k_pos < spec.sliding_window
    out = np.empty((n_q, spec.num_heads, spec.head_size), dtype=np.float32)
    slopes = spec.slopes
    for h in range(spec.num_heads):
        scores = (q[:, h, :].astype(np.float32) @ k[:, h, :].T) * np.float32(spec.scale)
        if slopes is not None:
            scores = scores + slopes[h] * (k_pos - q_pos).astype(np.float32)
        scores = np.where(allowed, scores, -np.inf).astype(np.float32)
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        out[:, h, :] = weights @ v[:, h, :]
    return out
