"""The Triton kernels against the oracle: named cases, each run on every layout's kernel, and the planted kernel
bugs each case set must catch.

The lab builds the pool, its block tables and a KV store whose every unwritten slot is NaN (builders/kvlab/lab.py);
the case copies the store into a device cache of its dtype (fp16, bf16 or fp8 e4m3 with scales), runs a Triton
layout on the lab's batch and compares each output with the NumPy oracle, which rounds the queries (and a non-fp8
cache's K and V) to the same format on its own and computes in float64. On a machine without CUDA the kernels
run under Triton's interpreter, at these small sizes; on a GPU the same cases run compiled.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from builders.kvlab.casebook import CaseFailed
from builders.kvlab.check import Outcome
from builders.kvlab.lab import Lab
from builders.kvlab.oracle import reference_attention
from builders.kvlab.pool import Request
from builders.kvlab.spec import AttnSpec
from builders.kvlab.triton_layouts import KERNEL_BUGS, TRITON_LAYOUTS, TritonLayout, cache_from_store, make_layout

TOLERANCE: dict[str, tuple[float, float, str]] = {
    "fp16": (
        1e-3,
        1e-3,
        "exact fp16 inputs on both sides; the kernel rounds its softmax weights to fp16 for P·V (2^-12 relative "
        "each), so |error| <= 2^-12·max|v| ~ 1e-3 here: FlashInfer's rtol = atol = 1e-3",
    ),
    "bf16": (
        1e-2,
        1e-2,
        "exact bf16 inputs on both sides; weights rounded to bf16 for P·V (2^-9 relative each): 8× fp16's",
    ),
    "fp8": (
        1e-3,
        1e-3,
        "the oracle rounds K and V to the same e4m3 codes and the queries to fp16; e4m3 codes are exact in fp16 and "
        "the scales are applied after the dot products, so fp16's bound holds",
    ),
}

REQUIRED_FEATURES: dict[str, str] = {
    "odd-lengths": "odd and boundary lengths (1, 17, kB, kB+1)",
    "partial-final-block": "partial final blocks",
    "block-size-1": "block size 1",
    "block-size-8": "block size 8",
    "block-size-16": "block size 16",
    "non-contiguous": "non-contiguous cache and query strides",
    "fp16": "fp16 KV",
    "bf16": "bf16 KV",
    "fp8": "fp8 e4m3 KV with per-tensor scales",
    "gqa": "grouped-query attention",
    "mqa": "multi-query attention",
    "shared-prefix-0": "no shared prefix",
    "shared-prefix-partial": "a shared prefix of about half the context",
    "shared-prefix-100": "requests whose whole context is the shared prefix",
    "causal-multi-query": "several queries per request, causal among themselves",
    "sliding-window": "sliding window, freed blocks outside it",
    "alibi": "ALiBi, a head count that is not a power of two",
    "split-k": "a request's keys split over several programs, merged by LSE",
    "logits-200": "logits of ±200 (a softmax or merge without its maximum overflows)",
    "head-size": "head sizes 64, 96 and 128",
    "request-id-reuse": "a finished request's id and block reused in a later step",
}


@dataclass
class KernelCtx:
    case: KernelCase
    layout_name: str
    bug: str | None = None
    device: str = "cpu"
    comparisons: int = 0
    worst: float = 0.0
    _layouts: dict[int, TritonLayout] = field(default_factory=dict)

    def lab(self, spec: AttnSpec, **options: Any) -> Lab:
        return Lab(spec, **options)

    def check(
        self,
        lab: Lab,
        requests: Sequence[Request],
        *,
        n_query: int = 1,
        label: str = "",
        strided: bool = False,
    ) -> None:
        """One batch through this case's layout, each output against the oracle's."""
        params = self.case.params
        layout = self._layouts.get(id(lab))
        if layout is None:
            layout = make_layout(
                self.layout_name,
                lab.spec,
                capacity=len(lab.pool.blocks) * lab.block_size,
                device=self.device,
                bug=self.bug,
                splits=params.get("splits"),
                block_n=params.get("block_n", 16),
                prefix_rows=params.get("prefix_rows", 16),
            )
            self._layouts[id(lab)] = layout
        entries = [lab.entry(r, n_query) for r in requests]
        cache = cache_from_store(lab.store, self.case.kind, device=self.device, strided=strided)
        outs = layout.attend(entries, cache, strided_queries=strided)
        precision = "bf16" if self.case.kind == "bf16" else "fp16"
        atol, rtol, _ = TOLERANCE[self.case.kind]
        for request, entry, out in zip(requests, entries, outs, strict=True):
            k, v = lab.kv(request.tokens, 0)
            spec = lab.spec
            expected = reference_attention(
                entry.query,
                k,
                v,
                alibi=spec.alibi,
                sliding_window=spec.sliding_window,
                k_scale=spec.k_scale,
                v_scale=spec.v_scale,
                precision=precision,
            )
            where = f"{label or 'batch'} {request.req_id} (len {entry.seq_len})"
            self.comparisons += 1
            if out.shape != expected.shape:
                raise CaseFailed(f"{where}: shape {out.shape}, expected {expected.shape}")
            if not np.isfinite(expected).all():
                raise CaseFailed(f"{where}: non-finite expected values (a broken oracle?)")
            if not np.isfinite(out).all():
                raise CaseFailed(f"{where}: {int((~np.isfinite(out)).sum())} non-finite outputs")
            error = np.abs(out.astype(np.float64) - expected)
            self.worst = max(self.worst, float(error.max()))
            if np.any(error > atol + rtol * np.abs(expected)):
                raise CaseFailed(
                    f"{where}: max |error| {float(error.max()):.3g} > atol {atol:g} + rtol {rtol:g}·|expected|"
                )


@dataclass(frozen=True)
class KernelCase:
    name: str
    features: tuple[str, ...]
    kind: str
    run: Callable[[KernelCtx], None]
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def tolerance(self) -> tuple[float, float, str]:
        return TOLERANCE[self.kind]


KERNEL_CASES: list[KernelCase] = []


def kernel_case(
    name: str, features: Sequence[str], *, kind: str = "fp16", **params: Any
) -> Callable[[Callable[[KernelCtx], None]], Callable[[KernelCtx], None]]:
    unknown = [f for f in (*features, kind) if f not in REQUIRED_FEATURES]
    if unknown:
        raise ValueError(f"kernel case {name}: unknown features {unknown}")

    def register(run: Callable[[KernelCtx], None]) -> Callable[[KernelCtx], None]:
        KERNEL_CASES.append(KernelCase(name, (*features, kind), kind, run, params))
        return run

    return register


def _spec(heads: int, kv_heads: int, head_size: int, **options: Any) -> AttnSpec:
    return AttnSpec(num_heads=heads, num_kv_heads=kv_heads, head_size=head_size, **options)


@kernel_case(
    "odd-lengths-gqa-16-4", ["odd-lengths", "partial-final-block", "block-size-16", "gqa", "head-size"], block_n=32
)
def _odd_lengths(ctx: KernelCtx) -> None:
    lab = ctx.lab(_spec(16, 4, 128), block_size=16, num_blocks=24)
    requests = [lab.admit(f"r{n}", lab.prompt(n)) for n in (1, 17, 48, 49)]
    ctx.check(lab, requests)


@kernel_case("block-size-1-mqa-96", ["block-size-1", "mqa", "head-size", "odd-lengths"])
def _block_1(ctx: KernelCtx) -> None:
    lab = ctx.lab(_spec(4, 1, 96), block_size=1, num_blocks=48, fragment="shuffled")
    ctx.check(lab, [lab.admit("a", lab.prompt(7)), lab.admit("b", lab.prompt(23))])


@kernel_case(
    "block-size-8-bf16-gapped", ["block-size-8", "gqa", "partial-final-block", "split-k"], kind="bf16", splits=2
)
def _block_8_bf16(ctx: KernelCtx) -> None:
    lab = ctx.lab(_spec(8, 2, 64), block_size=8, num_blocks=40, fragment="gapped")
    ctx.check(lab, [lab.admit(f"r{n}", lab.prompt(n)) for n in (13, 30, 41)])


@kernel_case("non-contiguous-strides", ["non-contiguous", "block-size-16", "gqa", "split-k"], splits=2)
def _strided(ctx: KernelCtx) -> None:
    lab = ctx.lab(_spec(8, 2, 64), block_size=16, num_blocks=24, fragment="shuffled")
    ctx.check(lab, [lab.admit("a", lab.prompt(20)), lab.admit("b", lab.prompt(45))], strided=True)


@kernel_case("fp8-e4m3-scales", ["fp8", "block-size-16", "gqa", "partial-final-block"], kind="fp8")
def _fp8(ctx: KernelCtx) -> None:
    lab = ctx.lab(_spec(8, 2, 64, k_scale=0.02, v_scale=0.035), block_size=16, num_blocks=24)
    ctx.check(lab, [lab.admit("a", lab.prompt(45)), lab.admit("b", lab.prompt(16))])


def _shared(ctx: KernelCtx, share: float) -> None:
    """Four requests of 40-48 tokens whose first `share` of the context is one prompt (a prefix hit); at 100 %
    they are forks of one request, each with no token of its own beyond the shared blocks."""
    lab = ctx.lab(_spec(8, 2, 64), block_size=8, num_blocks=40)
    if share >= 1:
        parent = lab.admit("p", lab.prompt(40))
        requests = [parent, *(lab.pool.fork(parent, f"f{i}") for i in range(3))]
    else:
        shared = lab.prompt(int(40 * share) // 8 * 8)
        requests = [lab.admit(f"r{i}", shared + lab.prompt(40 + 3 * i - len(shared))) for i in range(4)]
    ctx.check(lab, requests)


@kernel_case("shared-prefix-0", ["shared-prefix-0", "block-size-8", "gqa"])
def _shared_0(ctx: KernelCtx) -> None:
    _shared(ctx, 0.0)


@kernel_case("shared-prefix-50", ["shared-prefix-partial", "block-size-8", "gqa", "split-k"], splits=2)
def _shared_50(ctx: KernelCtx) -> None:
    _shared(ctx, 0.5)


@kernel_case("shared-prefix-100", ["shared-prefix-100", "block-size-8", "gqa"])
def _shared_100(ctx: KernelCtx) -> None:
    _shared(ctx, 1.0)


@kernel_case(
    "alibi-window-three-queries",
    ["alibi", "sliding-window", "causal-multi-query", "block-size-8", "gqa", "partial-final-block"],
)
def _alibi_window(ctx: KernelCtx) -> None:
    # 12 query heads over 4 KV heads: a group of 3, not a power of two; the window edge falls mid-block.
    lab = ctx.lab(_spec(12, 4, 64, alibi=True, sliding_window=20), block_size=8, num_blocks=32)
    requests = [lab.admit("a", lab.prompt(37)), lab.admit("b", lab.prompt(26))]
    for step in range(2):
        for request in requests:
            lab.compute(request, lab.prompt(3))
        ctx.check(lab, requests, n_query=3, label=f"step {step}")
    if not any(0 in r.block_ids for r in requests):
        raise CaseFailed("no block left the window: the case does not test freed blocks")


@kernel_case("logits-200-split-k", ["logits-200", "split-k", "shared-prefix-partial", "gqa", "block-size-8"], splits=4)
def _logits_200(ctx: KernelCtx) -> None:
    lab = ctx.lab(_spec(8, 2, 64), block_size=8, num_blocks=40, fragment="shuffled", logits=200.0)
    shared = lab.prompt(24)
    requests = [lab.admit("a", shared + lab.prompt(13)), lab.admit("b", shared + lab.prompt(6))]
    ctx.check(lab, requests)


@kernel_case("request-id-reused", ["request-id-reuse", "block-size-8", "partial-final-block", "gqa"])
def _request_id_reused(ctx: KernelCtx) -> None:
    # The virtual layout keeps a range per request id: a new x that gets the old x's first block back, with
    # other tokens in it, must not be served the old copy.
    lab = ctx.lab(_spec(8, 2, 64), block_size=8, num_blocks=4)
    first = lab.admit("x", lab.prompt(12))
    ctx.check(lab, [first], label="first x")
    old = first.block_ids
    lab.pool.free(first)
    other = lab.admit("d", lab.prompt(9))
    again = lab.admit("x", lab.prompt(8))
    if again.block_ids[0] != old[0]:
        raise CaseFailed(f"x's first block {old[0]} was not handed back ({again.block_ids})")
    ctx.check(lab, [again, other], label="x again")


def kernel_coverage() -> dict[str, list[str]]:
    return {f: [c.name for c in KERNEL_CASES if f in c.features] for f in REQUIRED_FEATURES}


def run_kernel_case(case: KernelCase, layout: str, *, bug: str | None = None, device: str = "cpu") -> Outcome:
    ctx = KernelCtx(case, layout, bug=bug, device=device)
    start = time.perf_counter()
    try:
        case.run(ctx)
        passed, detail = True, f"{ctx.comparisons} comparisons, max |error| {ctx.worst:.2g}"
    except CaseFailed as exc:
        passed, detail = False, str(exc)
    except Exception as exc:  # a planted bug may crash a kernel: a catch, and it says where
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        passed, detail = False, f"{type(exc).__name__}: {str(exc)[:200]} ({frame.name}, line {frame.lineno})"
    return Outcome(case.name, layout, passed, detail, time.perf_counter() - start, ctx.comparisons, ctx.worst)


def run_kernel_cases(device: str = "cpu", layouts: Sequence[str] = tuple(TRITON_LAYOUTS)) -> list[Outcome]:
    return [run_kernel_case(case, name, device=device) for case in KERNEL_CASES for name in layouts]


@dataclass(frozen=True)
class KernelMutantOutcome:
    bug: str
    layout: str
    caught_by: str | None
    detail: str


def run_kernel_mutant(
    bug: str, layout: str, *, device: str = "cpu", cases: Sequence[KernelCase] | None = None
) -> KernelMutantOutcome:
    """The cases in order until one fails with the bug planted in this layout's kernels."""
    for case in cases if cases is not None else KERNEL_CASES:
        outcome = run_kernel_case(case, layout, bug=bug, device=device)
        if not outcome.passed:
            return KernelMutantOutcome(bug, layout, case.name, outcome.detail)
    return KernelMutantOutcome(bug, layout, None, "every case passed")


CATCHERS: dict[str, str] = {
    "kv-head-index": "shared-prefix-0",
    "block-stride-assumed": "non-contiguous-strides",
    "missed-partial-block": "shared-prefix-0",
    "merge-without-max": "logits-200-split-k",
}
"""The case expected to catch each planted kernel bug first on every layout (CI runs only this one per bug)."""

assert set(CATCHERS) == set(KERNEL_BUGS)
