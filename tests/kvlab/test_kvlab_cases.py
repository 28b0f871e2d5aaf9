"""Every case run as its own test (each layout case once per layout): the tests `nox -s kvlab-mutation` runs
against each mutant, so mutmut can pick the few that reach a mutated function and stop at the first failure.
Below them, the kernel's contract where no case looks: dtypes, a query that sees no key, an empty merge part."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from builders.kvlab import kernel
from builders.kvlab.cases import Case
from builders.kvlab.check import run_case, runs
from builders.kvlab.spec import AttnSpec

RUNS = runs()

# The kernel silences the overflows and empty sums it expects; a RuntimeWarning anywhere else is a changed
# computation (and the way a mutant that drops an np.errstate shows).
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")


@pytest.mark.parametrize(("case", "layout"), RUNS, ids=[f"{c.name}-{layout or c.target}" for c, layout in RUNS])
def test_case(case: Case, layout: str | None) -> None:
    outcome = run_case(case, layout)
    assert outcome.passed, outcome.detail


def _parts(n_q: int, n_k: int, seed: int) -> tuple[AttnSpec, Any, Any, Any]:
    spec = AttnSpec(num_heads=4, num_kv_heads=2, head_size=16)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_q, 4, 16)).astype(np.float32)
    k = rng.standard_normal((n_k, 2, 16)).astype(np.float32)
    v = rng.standard_normal((n_k, 2, 16)).astype(np.float32)
    return spec, q, k, v


def test_kernel_lse_is_the_log_sum_exp_of_the_scaled_logits() -> None:
    spec, q, k, v = _parts(2, 7, 1)
    out, lse = kernel.attend(q, np.arange(5, 7), k, v, np.arange(7), spec)
    assert out.dtype == lse.dtype == np.float32
    logits = np.einsum("qhd,nhd->qhn", q.astype(np.float64), np.repeat(k, 2, axis=1)) / 4.0
    logits[0, :, 6] = -np.inf  # the first query, at position 5, does not see the key at 6
    expected = np.log(np.exp(logits).sum(axis=2))
    assert np.allclose(lse, expected, atol=1e-5, rtol=1e-6)
    # With ALiBi the LSE includes slope·(k - q) ≤ 0: a bias shifted per query leaves the output alone (softmax
    # is shift-invariant) but not the LSE, which a merge with a part computed elsewhere relies on.
    alibi = AttnSpec(num_heads=4, num_kv_heads=2, head_size=16, alibi=True)
    _, lse = kernel.attend(q, np.arange(5, 7), k, v, np.arange(7), alibi)
    slopes = np.exp2(-8.0 * np.arange(1, 5) / 4)
    biased = logits + slopes[None, :, None] * (np.arange(7)[None, None, :] - np.arange(5, 7)[:, None, None])
    assert np.allclose(lse, np.log(np.exp(biased).sum(axis=2)), atol=1e-5, rtol=1e-6)


def test_kernel_gives_zero_and_minus_inf_to_a_query_that_sees_no_key() -> None:
    spec, q, k, v = _parts(1, 4, 2)
    for keys in (np.arange(10, 14), np.arange(0)):
        n = len(keys)
        out, lse = kernel.attend(q, np.arange(3, 4), k[:n], v[:n], keys, spec)
        assert out.dtype == lse.dtype == np.float32
        assert np.array_equal(out, np.zeros_like(out)) and bool(np.all(lse == -np.inf))


def test_merge_with_an_empty_part_is_the_other_part_and_two_empty_parts_stay_empty() -> None:
    spec, q, k, v = _parts(2, 6, 3)
    full = kernel.attend(q, np.arange(4, 6), k, v, np.arange(6), spec)
    empty = kernel.attend(q, np.arange(4, 6), k[:0], v[:0], np.arange(0), spec)
    for merged in (kernel.merge(full, empty), kernel.merge(empty, full)):
        assert merged[0].dtype == merged[1].dtype == np.float32
        assert np.allclose(merged[0], full[0], atol=1e-7) and np.allclose(merged[1], full[1], atol=1e-6)
    out, lse = kernel.merge(empty, empty)
    assert out.dtype == lse.dtype == np.float32
    assert np.array_equal(out, np.zeros_like(out)) and bool(np.all(lse == -np.inf))


def test_dequantize_multiplies_each_side_by_its_own_scale() -> None:
    spec = AttnSpec(num_heads=2, num_kv_heads=2, head_size=4, k_scale=0.5, v_scale=0.25)
    ones = np.ones((3, 2, 4), np.float32)
    k, v = kernel.dequantize(ones, ones, spec, k_scale_twice=False, v_by_k_scale=False)
    assert k.dtype == v.dtype == np.float32 and bool(np.all(k == 0.5)) and bool(np.all(v == 0.25))
    plain = AttnSpec(num_heads=2, num_kv_heads=2, head_size=4)
    assert kernel.dequantize(ones, ones, plain, k_scale_twice=False, v_by_k_scale=False)[0] is ones
