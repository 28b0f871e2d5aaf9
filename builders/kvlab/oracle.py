"""The oracle: dense attention in float64 over the logical KV of a request, with no block, span or pool in sight.

It follows the reference in vLLM's kernel tests (`ref_single_query_cached_kv_attention`): one softmax over all
keys, GQA by repeating each KV head over its group of query heads, ALiBi slopes as `_get_alibi_slopes` gives them,
and fp8 as a per-tensor `k_scale`/`v_scale` applied to e4m3 values.

Independent by construction: this module imports nothing from the lab (a test parses its imports and fails on
one). It derives from the arrays and plain settings it is given what the implementation keeps in AttnSpec and the
KV store: the softmax scale from the head size, the ALiBi slopes from the head count (as exponents, not powers of
a base), the e4m3 round trip from the format's bit fields (nearest grid value, not a log2 and a rounding), and
each query's position from the number of keys (the queries are the last positions), not from a layout's entry.
So a wrong value in the implementation is not read by both sides and missed.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float32]
Wide = npt.NDArray[np.float64]

E4M3_LARGEST = 448.0
"""Exponent field 15 with mantissa 6 (mantissa 7 there is NaN in e4m3fn): 2^8 × 1.75."""


def softmax_scale(head_size: int) -> float:
    """1/sqrt(d): the scale of every attention in vLLM's tests and models without their own."""
    if head_size < 1:
        raise ValueError(f"head size {head_size}: must be at least 1")
    return float(1.0 / np.sqrt(np.float64(head_size)))


def alibi_slopes(num_heads: int) -> Wide:
    """ALiBi's slopes for num_heads: 2^(-8i/p) for i = 1…p, p the largest power of two ≤ num_heads; the remaining
    heads take the odd terms 2^(-8j/2p), j = 1, 3, 5…, of the sequence for 2p (the ALiBi paper's extension)."""
    if num_heads < 1:
        raise ValueError(f"{num_heads} heads: ALiBi needs at least 1")
    p = 1
    while p * 2 <= num_heads:
        p *= 2
    exponents = [-8.0 * i / p for i in range(1, p + 1)]
    exponents += [-8.0 * j / (2 * p) for j in range(1, 2 * (num_heads - p), 2)]
    return np.exp2(np.asarray(exponents, dtype=np.float64))


def e4m3_values() -> Wide:
    """Every finite non-negative e4m3fn value in code order: index = code (sign bit clear), so even index =
    even mantissa. Subnormals m·2^-9 (exponent field 0), then (1 + m/8)·2^(e-7); code 0x7F is NaN, not a value."""
    values = []
    for code in range(0x7F):
        exponent, mantissa = code >> 3, code & 7
        values.append(mantissa * 2.0**-9 if exponent == 0 else (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    return np.asarray(values, dtype=np.float64)


def e4m3_round_trip(x: npt.ArrayLike) -> Wide:
    """x to the nearest e4m3fn value and back: ties to the even code, beyond ±448 saturated (vLLM's cast), NaN
    kept. A nearest-neighbour search in the grid of e4m3_values."""
    x = np.asarray(x, dtype=np.float64)
    grid = e4m3_values()
    magnitude = np.minimum(np.abs(np.nan_to_num(x, nan=0.0)), E4M3_LARGEST)
    upper = np.clip(np.searchsorted(grid, magnitude, side="left"), 1, len(grid) - 1)
    lower = upper - 1
    below, above = magnitude - grid[lower], grid[upper] - magnitude
    take_upper = (above < below) | ((above == below) & (upper % 2 == 0))
    nearest = np.where(take_upper, grid[upper], grid[lower])
    return np.where(np.isnan(x), np.nan, np.copysign(nearest, x))


def half_round_trip(x: npt.ArrayLike, precision: str) -> Wide:
    """x to the nearest fp16 or bf16 value and back, ties to even. fp16 by NumPy's IEEE half; bf16, which NumPy
    lacks, from float32's bits: keep the top 16, rounding on the 16 dropped (NaN kept)."""
    x = np.asarray(x, dtype=np.float64)
    if precision == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float64)
    if precision != "bf16":
        raise ValueError(f"precision {precision!r}: use fp16 or bf16")
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return np.where(np.isnan(x), np.nan, rounded.view(np.float32).astype(np.float64))


def reference_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    alibi: bool = False,
    sliding_window: int | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    precision: str | None = None,
) -> Wide:
    """Dense causal attention of q[n_q, H, D] over k, v[L, KV, D]: keys at positions 0…L-1, the queries at the
    last n_q of them. k and v are the values before any cache: with k_scale and v_scale they go through the e4m3
    round trip the cache would hold. precision ("fp16" or "bf16"): the kernel takes its queries, and a cache
    without fp8 scales holds its K and V, in that format; the oracle rounds them the same way before computing.
    The result is float64; the caller compares it with a layout's fp32."""
    n_q, heads, head_size = q.shape
    length, kv_heads = k.shape[0], k.shape[1]
    if n_q > length:
        raise ValueError(f"{n_q} queries but {length} keys: the queries are the last positions of the keys")
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not split into {kv_heads} KV heads")
    if (k_scale is None) != (v_scale is None):
        raise ValueError("fp8 needs both k_scale and v_scale")
    keys, values = np.asarray(k, np.float64), np.asarray(v, np.float64)
    queries = np.asarray(q, np.float64)
    if precision is not None:
        queries = half_round_trip(queries, precision)
    if k_scale is not None and v_scale is not None:
        keys = e4m3_round_trip(keys / k_scale) * k_scale
        values = e4m3_round_trip(values / v_scale) * v_scale
    elif precision is not None:
        keys, values = half_round_trip(keys, precision), half_round_trip(values, precision)
    keys = np.repeat(keys, heads // kv_heads, axis=1)
    values = np.repeat(values, heads // kv_heads, axis=1)
    q_pos = np.arange(length - n_q, length)[:, None]
    k_pos = np.arange(length)[None, :]
    visible = k_pos <= q_pos
    if sliding_window is not None:
        visible &= q_pos - k_pos < sliding_window
    slopes = alibi_slopes(heads) if alibi else np.zeros(heads)
    scale = softmax_scale(head_size)
    out = np.empty((n_q, heads, head_size), dtype=np.float64)
    for h in range(heads):
        logits = (queries[:, h, :] @ keys[:, h, :].T) * scale + slopes[h] * (k_pos - q_pos)
        logits = np.where(visible, logits, -np.inf)
        weights = np.exp(logits - logits.max(axis=1, keepdims=True))
        out[:, h, :] = (weights / weights.sum(axis=1, keepdims=True)) @ values[:, h, :]
    return out
