"""What an oracle case is and how it runs: the features a case may cover, the tolerances and why, the context a
case runs against (a layout, planted bugs, the comparison against the oracle), and the registry `case` fills.

The cases themselves are in cases.py; importing it registers them in CASES.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from builders.kvlab import kernel
from builders.kvlab.lab import Lab
from builders.kvlab.layouts import LAYOUTS, Layout
from builders.kvlab.pool import Request
from builders.kvlab.spec import Array, AttnSpec

Target = Literal["layouts", "pool", "oracle", "format"]

REQUIRED_FEATURES: dict[str, str] = {
    "odd-lengths": "odd and boundary lengths (1, 17, kB, kB+1)",
    "nan-poison": "NaN-poisoned unused slots",
    "fragmented": "fragmented block tables",
    "contiguous": "contiguous block tables",
    "mha": "multi-head attention",
    "gqa": "grouped-query attention (32/8)",
    "mqa": "multi-query attention (8/1)",
    "head-size": "head sizes 64-256",
    "block-size": "block sizes 1-32",
    "alibi": "ALiBi, power-of-two head count",
    "alibi-non-pow2": "ALiBi, head count not a power of two",
    "sliding-window": "sliding window, edge mid-block",
    "window-free": "out-of-window blocks freed",
    "chunked-prefill": "chunked prefill",
    "prefix-hit": "prefix hit, capped at num_tokens - 1",
    "prefix-reuse": "prefix reuse across requests",
    "cow": "copy-on-write of a shared partial block",
    "partial-final-block": "partial final blocks",
    "fp8": "fp8 e4m3 with per-tensor scales",
    "fp8-saturation": "fp8 saturation at ±448",
    "cascade-merge": "cascade (LSE) merge equals monolithic attention",
    "pool-invariants": "pool invariants after random allocate/free/evict (Hypothesis)",
    "request-id-reuse": "a request id reused across steps after its request finished",
    "evicted-duplicate": "two copies of a block cached, one evicted",
    "hash-boundaries": "token lists whose digits run together hash apart",
    "chain-hole": "a cached chain with an evicted block in the middle",
}

# Layouts and oracle both run in fp32, over the same values, but sum in other orders (a grouped einsum vs one
# matmul per head, span by span with LSE merges vs all keys at once): a few ulps of outputs of magnitude ≤ ~4.
FP32 = (2e-5, 2e-5, "fp32 both sides, other summation orders and LSE merges: a few ulps at |o| ≤ 4")
EXACT = (0.0, 0.0, "the same computation on the same values must give the same bits")
POOL = (0.0, 0.0, "no outputs compared: the pool's state is checked exactly")
FP8 = (
    5e-5,
    5e-5,
    "the oracle quantizes the same values to the same e4m3 codes; left is fp32 reordering at larger |v|",
)


class CaseFailed(Exception):
    pass


@dataclass
class Ctx:
    """What a case runs against: a layout (maybe with a planted bug), a pool bug, and the tolerance."""

    case: Case
    layout_name: str = "paged"
    layout_bug: str | None = None
    pool_bug: str | None = None
    kernel_bug: str | None = None
    comparisons: int = 0
    worst: float = 0.0

    def lab(self, spec: AttnSpec, **options: Any) -> Lab:
        return Lab(spec, pool_bug=self.pool_bug, **options)

    def layout(self, lab: Lab) -> Layout:
        return LAYOUTS[self.layout_name](lab.block_size, lab.spec, bug=self.layout_bug, kernel_bug=self.kernel_bug)

    @property
    def kernel_bugs(self) -> kernel.KernelBugs:
        """The planted kernel bug, for cases that call the kernel without a layout."""
        return kernel.KernelBugs(**({kernel.KERNEL_BUGS[self.kernel_bug][0]: True} if self.kernel_bug else {}))

    def require(self, condition: bool, message: str) -> None:
        if not condition:
            raise CaseFailed(message)

    def close(self, label: str, got: Array, expected: npt.NDArray[np.floating]) -> None:
        atol, rtol = self.case.atol, self.case.rtol
        self.comparisons += 1
        if got.shape != expected.shape:
            raise CaseFailed(f"{label}: shape {got.shape}, expected {expected.shape}")
        bad_got, bad_expected = ~np.isfinite(got), ~np.isfinite(expected)
        if not self.case.params.get("expects_nonfinite"):
            # Either side: a NaN from the oracle is a broken reference, not a value a layout may match.
            if bad_expected.any():
                raise CaseFailed(f"{label}: {int(bad_expected.sum())} non-finite expected values (a broken oracle?)")
            if bad_got.any():
                raise CaseFailed(
                    f"{label}: {int(bad_got.sum())} non-finite outputs (a poisoned slot read, or exp overflowing?)"
                )
        elif not np.array_equal(got[bad_got], expected[bad_expected], equal_nan=True) or not np.array_equal(
            bad_got, bad_expected
        ):
            raise CaseFailed(f"{label}: non-finite values differ from the expected ones")
        finite = ~bad_expected
        error = np.abs(got[finite].astype(np.float64) - expected[finite])
        self.worst = max(self.worst, float(error.max(initial=0.0)))
        if np.any(error > atol + rtol * np.abs(expected[finite])):
            raise CaseFailed(
                f"{label}: max |error| {float(error.max()):.3g} > atol {atol:g} + rtol {rtol:g}·|expected|"
            )

    def verify(
        self, lab: Lab, layout: Layout, requests: Sequence[Request], n_query: int = 1, label: str = ""
    ) -> list[Array]:
        """One batch through the layout, each output against the oracle's."""
        entries = [lab.entry(r, n_query) for r in requests]
        outs = layout.attend(entries, lab.store)
        self.require(len(outs) == len(entries), f"{label}: {len(outs)} outputs for {len(entries)} requests")
        for request, entry, out in zip(requests, entries, outs, strict=True):
            self.close(f"{label or 'batch'} {request.req_id} (len {entry.seq_len})", out, lab.expected(request, entry))
        return outs


@dataclass(frozen=True)
class Case:
    name: str
    target: Target
    features: tuple[str, ...]
    atol: float
    rtol: float
    why: str
    run: Callable[[Ctx], None]
    params: dict[str, Any] = field(default_factory=dict)


CASES: list[Case] = []


def case(
    name: str,
    features: Sequence[str],
    *,
    target: Target = "layouts",
    tolerance: tuple[float, float, str] = FP32,
    **params: Any,
) -> Callable[[Callable[[Ctx], None]], Callable[[Ctx], None]]:
    unknown = [f for f in features if f not in REQUIRED_FEATURES]
    if unknown:
        raise ValueError(f"case {name}: unknown features {unknown}")

    def register(run: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
        CASES.append(Case(name, target, tuple(features), tolerance[0], tolerance[1], tolerance[2], run, params))
        return run

    return register


def coverage() -> dict[str, list[str]]:
    """Each required feature → the cases that cover it."""
    return {f: [c.name for c in CASES if f in c.features] for f in REQUIRED_FEATURES}
