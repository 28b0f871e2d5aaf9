"""The Triton kernels, one per layout, against the oracle under Triton's interpreter (no GPU): every kernel case on
every layout, each planted kernel bug caught on every layout by the case named for it, and what each layout's
launches read. `pip install -e '.[kernels]'` brings torch (a CPU build) and triton; without them these skip."""

from __future__ import annotations

import importlib.util

import pytest

# Only looked up, not imported: triton must first be imported with TRITON_INTERPRET=1 (load_kernels sets it).
if importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None:
    pytest.skip("the Triton kernels need torch and triton: pip install -e '.[kernels]'", allow_module_level=True)

from builders.kvlab.kernel_cases import (
    CATCHERS,
    KERNEL_CASES,
    REQUIRED_FEATURES,
    TOLERANCE,
    KernelCase,
    kernel_coverage,
    run_kernel_case,
    run_kernel_mutant,
)
from builders.kvlab.lab import Lab
from builders.kvlab.layouts import Entry
from builders.kvlab.spec import AttnSpec
from builders.kvlab.triton_layouts import (
    KERNEL_BUGS,
    TRITON_LAYOUTS,
    cache_from_store,
    load_kernels,
    make_layout,
)

LAYOUTS = list(TRITON_LAYOUTS)
RUNS = [(case, name) for case in KERNEL_CASES for name in LAYOUTS]


@pytest.mark.parametrize(("case", "layout"), RUNS, ids=[f"{c.name}-{name}" for c, name in RUNS])
def test_kernel_case(case: KernelCase, layout: str) -> None:
    outcome = run_kernel_case(case, layout)
    assert outcome.passed, outcome.detail


BUGS = [(bug, name) for bug in KERNEL_BUGS for name in LAYOUTS]


@pytest.mark.parametrize(("bug", "layout"), BUGS, ids=[f"{bug}-{name}" for bug, name in BUGS])
def test_each_planted_kernel_bug_is_caught_on_every_layout(bug: str, layout: str) -> None:
    case = next(c for c in KERNEL_CASES if c.name == CATCHERS[bug])
    outcome = run_kernel_mutant(bug, layout, cases=[case])
    assert outcome.caught_by == case.name, outcome.detail


def test_every_feature_has_a_case_and_every_dtype_its_tolerance() -> None:
    assert [f for f, names in kernel_coverage().items() if not names] == []
    assert {c.kind for c in KERNEL_CASES} == set(TOLERANCE) <= set(REQUIRED_FEATURES)
    # FlashInfer's own check of its fp16 decode is rtol = atol = 1e-3; the lab holds fp16 and fp8 to it.
    assert TOLERANCE["fp16"][:2] == TOLERANCE["fp8"][:2] == (1e-3, 1e-3)


def _shared_batch() -> tuple[Lab, list[Entry]]:
    lab = Lab(AttnSpec(num_heads=8, num_kv_heads=2, head_size=64), block_size=8, num_blocks=48, fragment="shuffled")
    shared = lab.prompt(32)
    requests = [lab.admit(f"r{i}", shared + lab.prompt(5 + 3 * i)) for i in range(4)]
    return lab, [lab.entry(r) for r in requests]


def test_each_layout_reads_its_own_metadata_and_the_kv_it_should() -> None:
    lab, entries = _shared_batch()
    cache = cache_from_store(lab.store, "fp16", device="cpu")
    plans = {
        name: make_layout(name, lab.spec, capacity=48 * 8, device="cpu", block_n=16, prefix_rows=16).plan(
            entries, cache
        )
        for name in LAYOUTS
    }
    row = 2 * 2 * 64 * 2  # K and V, two KV heads of 64, fp16
    total = sum(e.seq_len for e in entries)
    for name in ("paged", "spans", "virtual"):
        assert plans[name].kv_bytes == total * row
    # The paged kernel reads the table once per key; spans once per run; virtual once per request.
    assert plans["paged"].index_lookups == total
    assert plans["virtual"].index_lookups == 4 and plans["virtual"].copy_bytes == sum(
        -(-e.seq_len // 8) * 8 * row for e in entries
    )
    assert 4 < plans["spans"].index_lookups < total
    # Four requests share 32 tokens: the cascade reads them once (4 queries × 4 heads fit one tile of 16 rows).
    assert plans["hybrid"].kv_bytes == (32 + sum(e.seq_len - 32 for e in entries)) * row
    # The cascade launches its prefix, its suffixes and the merge; the others a kernel and the merge.
    assert [len(p.launches) for p in plans.values()] == [2, 2, 2, 3]
    assert plans["virtual"].metadata_bytes < plans["spans"].metadata_bytes


def test_the_kernels_are_built_once_per_process_in_one_mode() -> None:
    assert load_kernels(interpret=True) is load_kernels(interpret=True)
    with pytest.raises(RuntimeError, match="already built for the interpreter"):
        load_kernels(interpret=False)


def test_an_unknown_bug_or_dtype_is_refused() -> None:
    spec = AttnSpec(num_heads=2, num_kv_heads=1, head_size=16)
    with pytest.raises(ValueError, match="no planted Triton kernel bug 'nope'"):
        make_layout("paged", spec, capacity=16, device="cpu", bug="nope")
    lab = Lab(spec, block_size=4, num_blocks=4)
    with pytest.raises(ValueError, match="KV dtype fp8 for a store without fp8 scales"):
        cache_from_store(lab.store, "fp8", device="cpu")
