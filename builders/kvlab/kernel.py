"""The attention kernel every layout calls on the keys it gathered: fp32, with its log-sum-exp, and the merge.

Unlike the oracle it never repeats KV heads: query heads are grouped over their KV head (a reshape), as a GQA
kernel does. It reads only the keys it is given; a layout that hands it a poisoned slot gets NaN back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from builders.kvlab.spec import Array, AttnSpec


@dataclass(frozen=True, kw_only=True)
class KernelBugs:
    """Planted kernel-side bugs a layout may carry (see builders/kvlab/mutants.py)."""

    tile_heads: bool = False
    """Query head h uses KV head h % kv_heads (a tile) instead of h // group (a repeat)."""
    alibi_by_kv_head: bool = False
    """Each query head takes the ALiBi slope of its KV head."""
    window_slack: int = 0
    """Keys this many positions before the sliding window are allowed too."""
    scale_padded: bool = False
    """The softmax scale from the head size padded to a power of two (1/sqrt(128) for 96), as a kernel with
    power-of-two tiles might take it."""
    slopes_reversed: bool = False
    """Query head h takes the ALiBi slope of head H-1-h."""
    softmax_no_max: bool = False
    """exp(scores) without subtracting the row's maximum: exact at small logits, inf/inf = NaN past ~88."""
    merge_no_max: bool = False
    """The LSE merge weights exp(lse) without subtracting the larger LSE."""


KERNEL_BUGS: dict[str, tuple[str, str]] = {
    "scale-padded-head-size": ("scale_padded", "scales logits by 1/sqrt of the head size padded to a power of two"),
    "slopes-reversed": ("slopes_reversed", "gives query head h the ALiBi slope of head H-1-h"),
    "softmax-without-max": ("softmax_no_max", "takes exp of the scores without subtracting their maximum"),
    "merge-without-max": ("merge_no_max", "weights the LSE merge by exp(lse) without subtracting the larger LSE"),
}
"""Planted kernel bugs, for every layout: name → (KernelBugs field, what it gets wrong)."""


def attend(
    q: Array,
    q_pos: npt.NDArray[np.int64],
    k: Array,
    v: Array,
    k_pos: npt.NDArray[np.int64],
    spec: AttnSpec,
    bugs: KernelBugs = KernelBugs(),
) -> tuple[Array, Array]:
    """Attention of q[n_q, H, D] at q_pos over k, v[n_k, KV, D] at k_pos: (output [n_q, H, D], lse [n_q, H]).

    A query with no key it may see gets output 0 and lse -inf, so that merging it with another part is exact."""
    n_q, kv, group, d = q.shape[0], spec.num_kv_heads, spec.group, spec.head_size
    # Planted-bug code sits in its own `if` blocks, kept out of mutation testing (builders/kvlab/mutation.py):
    # it is the harness's, not the kernel under test.
    grouped = q.reshape(n_q, kv, group, d)
    scale = spec.scale
    if bugs.tile_heads or bugs.scale_padded:  # pragma: no mutate block
        if bugs.tile_heads:
            grouped = q.reshape(n_q, group, kv, d).transpose(0, 2, 1, 3)
        if bugs.scale_padded:
            scale = 1.0 / np.sqrt(1 << (spec.head_size - 1).bit_length())
    scores = np.einsum("qkgd,nkd->kgqn", grouped, k, dtype=np.float32) * np.float32(scale)
    allowed = k_pos[None, :] <= q_pos[:, None]
    if spec.sliding_window is not None:
        window = spec.sliding_window
        if bugs.window_slack:  # pragma: no mutate block
            window += bugs.window_slack
        allowed &= q_pos[:, None] - k_pos[None, :] < window
    slopes = spec.slopes
    if slopes is not None:
        per_head = slopes.reshape(kv, group)
        if bugs.slopes_reversed or bugs.alibi_by_kv_head or bugs.tile_heads:  # pragma: no mutate block
            planted = slopes[::-1].copy() if bugs.slopes_reversed else slopes
            if bugs.alibi_by_kv_head:
                per_head = np.repeat(planted[:kv, None], group, axis=1)
            elif bugs.tile_heads:
                per_head = planted.reshape(group, kv).T
            else:
                per_head = planted.reshape(kv, group)
        distance = (k_pos[None, :] - q_pos[:, None]).astype(np.float32)
        scores = scores + per_head[:, :, None, None] * distance[None, None, :, :]
    scores = np.where(allowed[None, None], scores, np.float32(-np.inf))
    peak = scores.max(axis=3, keepdims=True) if scores.shape[3] else np.full((*scores.shape[:3], 1), -np.inf)
    peak = np.where(np.isfinite(peak), peak, 0).astype(np.float32)
    if bugs.softmax_no_max:  # pragma: no mutate block
        peak = np.zeros_like(peak)
    with np.errstate(over="ignore", invalid="ignore"):
        weights = np.exp(scores - peak)
    total = weights.sum(axis=3, keepdims=True)
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.einsum("kgqn,nkd->kgqd", weights, v, dtype=np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(total > 0, out / total, 0).astype(np.float32)
        lse = (peak + np.log(total))[..., 0].astype(np.float32)
    if bugs.tile_heads:  # pragma: no mutate block
        return out.transpose(2, 1, 0, 3).reshape(n_q, -1, d), lse.transpose(2, 1, 0).reshape(n_q, -1)
    return out.transpose(2, 0, 1, 3).reshape(n_q, -1, d), lse.transpose(2, 0, 1).reshape(n_q, -1)


def merge(
    a: tuple[Array, Array], b: tuple[Array, Array], *, base2: bool = False, bugs: KernelBugs = KernelBugs()
) -> tuple[Array, Array]:
    """Two partial attentions over disjoint keys, as one: weighted by their softmax mass (FlashInfer's merge_state).

    base2: a planted bug, the weights taken as powers of 2 of natural-log LSEs (FlashInfer keeps LSE in log2)."""
    (o1, l1), (o2, l2) = a, b
    peak = np.maximum(l1, l2)
    peak = np.where(np.isfinite(peak), peak, 0)
    power: np.ufunc = np.exp
    if bugs.merge_no_max or base2:  # pragma: no mutate block
        if bugs.merge_no_max:
            peak = np.zeros_like(peak)
        if base2:
            power = np.exp2
    with np.errstate(over="ignore"):
        w1, w2 = power(l1 - peak), power(l2 - peak)
    total = w1 + w2
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = np.where(total[..., None] > 0, (o1 * w1[..., None] + o2 * w2[..., None]) / total[..., None], 0)
        lse = peak + np.log(total)
    return out.astype(np.float32), lse.astype(np.float32)


def dequantize(k: Array, v: Array, spec: AttnSpec, *, k_scale_twice: bool, v_by_k_scale: bool) -> tuple[Array, Array]:
    """The cache's values as the attention uses them: e4m3 × scale under fp8, unchanged otherwise.

    k_scale_twice, v_by_k_scale: planted bugs, passed by every caller (no defaults for mutation to flip)."""
    if spec.k_scale is None or spec.v_scale is None:
        return k, v
    k_scale, v_scale = np.float32(spec.k_scale), np.float32(spec.v_scale)
    if k_scale_twice or v_by_k_scale:  # pragma: no mutate block
        k_scale = k_scale**2 if k_scale_twice else k_scale
        v_scale = np.float32(spec.k_scale) if v_by_k_scale else v_scale
    return (k * k_scale).astype(np.float32), (v * v_scale).astype(np.float32)
