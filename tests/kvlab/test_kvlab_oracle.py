"""The oracle is independent of what it judges: it imports nothing from the lab, and its scale, ALiBi slopes and
e4m3 round trip are checked against values from outside the lab (vLLM's slopes, ml_dtypes' float8_e4m3fn)."""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from builders.kvlab import oracle, spec, store
from builders.kvlab.cases import CASES, VLLM_ALIBI_SLOPES, CaseFailed, Ctx
from builders.kvlab.check import Outcome, run_case
from builders.kvlab.mutants import mutants, run_mutant

ORACLE = Path(oracle.__file__)
ALLOWED_TOP = {"__future__", "math", "numpy"}


def imported_modules(source: str) -> list[str]:
    """Every module an import statement names, relative imports marked with their dots."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append("." * node.level + (node.module or ""))
    return names


def forbidden_imports(source: str) -> list[str]:
    """Imports outside the standard numerics the oracle may use: the lab's own modules above all."""
    return [name for name in imported_modules(source) if name.split(".")[0] not in ALLOWED_TOP]


def test_the_oracle_imports_nothing_from_the_lab() -> None:
    assert forbidden_imports(ORACLE.read_text()) == []


@pytest.mark.parametrize(
    "line",
    [
        "from builders.kvlab.spec import AttnSpec",
        "from builders.kvlab import kernel",
        "import builders.kvlab.pool",
        "from .layouts import Entry",
        "def f():\n    from builders.kvlab.store import KVStore",
    ],
)
def test_the_import_check_fails_on_a_lab_import(line: str) -> None:
    assert forbidden_imports(ORACLE.read_text() + "\n" + line + "\n") != []


def test_softmax_scale_is_one_over_root_head_size() -> None:
    assert oracle.softmax_scale(64) == 0.125
    assert oracle.softmax_scale(128) == pytest.approx(1 / math.sqrt(128), rel=1e-15)
    with pytest.raises(ValueError, match="head size 0"):
        oracle.softmax_scale(0)


@pytest.mark.parametrize("heads", sorted(VLLM_ALIBI_SLOPES))
def test_alibi_slopes_are_vllms(heads: int) -> None:
    pinned = np.asarray(VLLM_ALIBI_SLOPES[heads], dtype=np.float32)
    assert np.array_equal(oracle.alibi_slopes(heads).astype(np.float32), pinned)


def test_alibi_slopes_order_matters() -> None:
    # Head 0 has the steepest slope: a reversed order is not the same list.
    slopes = oracle.alibi_slopes(8)
    assert slopes[0] == 0.5 and slopes[-1] == 2.0**-8 and bool(np.all(np.diff(slopes) < 0))


def test_e4m3_round_trip_matches_ml_dtypes() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(5)
    grid = oracle.e4m3_values()
    x = np.concatenate(
        [
            grid,
            -grid,
            (grid[:-1] + grid[1:]) / 2,
            rng.standard_normal(20000) * 50,
            rng.uniform(-447, 447, 20000),
            rng.uniform(-(2.0**-6), 2.0**-6, 5000),
        ]
    ).astype(np.float32)
    theirs = x.astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    assert np.array_equal(oracle.e4m3_round_trip(x), theirs)
    assert len(grid) == 127 and np.array_equal(
        grid, np.arange(127, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    )


def test_e4m3_round_trip_saturates_and_keeps_nan() -> None:
    # ml_dtypes' cast gives NaN beyond the range; vLLM clamps to ±448 before the cast, as the oracle does.
    out = oracle.e4m3_round_trip(np.asarray([448.0, 464.0, 1e9, -1e9, np.nan]))
    assert out[:4].tolist() == [448.0, 448.0, 448.0, -448.0] and math.isnan(out[4])


def test_oracle_positions_come_from_the_keys() -> None:
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 2, 8)).astype(np.float32)
    k = rng.standard_normal((5, 1, 8)).astype(np.float32)
    v = rng.standard_normal((5, 1, 8)).astype(np.float32)
    out = oracle.reference_attention(q, k, v)
    # The last query sees every key, the one before it all but the last.
    whole = oracle.reference_attention(q[1:], k, v)
    shorter = oracle.reference_attention(q[:1], k[:4], v[:4])
    assert np.allclose(out[1], whole[0], atol=1e-12) and np.allclose(out[0], shorter[0], atol=1e-12)
    with pytest.raises(ValueError, match="3 queries but 2 keys"):
        oracle.reference_attention(rng.standard_normal((3, 2, 8)).astype(np.float32), k[:2], v[:2])


@pytest.mark.parametrize(
    ("target", "bug", "caught_by"),
    [
        ("kernel", "scale-padded-head-size", "head-size-96 on paged"),
        ("kernel", "slopes-reversed", "alibi-pow2-gqa on paged"),
        ("kernel", "softmax-without-max", "logits-200 on paged"),
        ("kernel", "merge-without-max", "logits-200 on hybrid"),
        ("pool", "parentless-hash", "prefix-hash-at-shifted-positions"),
    ],
)
def test_the_audits_bugs_are_each_caught_by_a_named_case(target: str, bug: str, caught_by: str) -> None:
    # Against its named case alone: other cases may now catch it first (the fuzz's prefix-hit property catches
    # parentless-hash too), and the named one must still.
    mutant = next(m for m in mutants() if (m.target, m.bug) == (target, bug))
    case = next(c for c in CASES if c.name == caught_by.split(" on ")[0])
    assert run_mutant(mutant, [case]).caught_by == caught_by


def _outcome(name: str, layout: str | None) -> Outcome:
    return run_case(next(c for c in CASES if c.name == name), layout)


def test_a_wrong_value_in_the_shared_spec_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the audit planted: a wrong scale or slope order in AttnSpec, the quantiser the store writes with.
    # The oracle reads none of them, so each now shows as a failing case.
    assert _outcome("head-size-96", "paged").passed
    monkeypatch.setattr(spec.AttnSpec, "scale", property(lambda s: 1 / math.sqrt(s.head_size + 1)))
    assert not _outcome("head-size-96", "paged").passed
    monkeypatch.undo()
    monkeypatch.setattr(spec.AttnSpec, "slopes", property(lambda s: spec.alibi_slopes(s.num_heads)[::-1].copy()))
    assert not _outcome("alibi-non-pow2-gqa", "paged").passed
    monkeypatch.undo()
    monkeypatch.setattr(store, "fp8_e4m3", lambda x: np.clip(np.asarray(x, np.float32), -448, 448))
    assert not _outcome("fp8-e4m3-per-tensor-scales", "paged").passed


def test_a_nan_expected_value_fails_the_comparison() -> None:
    ctx = Ctx(next(c for c in CASES if c.name == "len-1"))
    got = np.ones((1, 2, 4), np.float32)
    expected = got.astype(np.float64)
    ctx.close("finite", got, expected)
    expected[0, 1, 2] = np.nan
    with pytest.raises(CaseFailed, match="1 non-finite expected values"):
        ctx.close("nan expected", got, expected)
    got[0, 0, 0] = np.inf
    with pytest.raises(CaseFailed, match="1 non-finite outputs"):
        ctx.close("inf got", got, np.ones((1, 2, 4)))


def test_a_case_that_expects_nonfinite_values_compares_them() -> None:
    base = next(c for c in CASES if c.name == "len-1")
    ctx = Ctx(dataclasses.replace(base, params={"expects_nonfinite": True}))
    got = np.asarray([1.0, np.nan, np.inf], np.float32)
    ctx.close("same non-finite places", got, got.astype(np.float64))
    with pytest.raises(CaseFailed, match="non-finite values differ"):
        ctx.close("nan where inf was expected", got, np.asarray([1.0, np.nan, np.nan]))


def test_the_oracles_half_rounding_is_ieee_fp16_and_bf16() -> None:
    # bf16 is derived from float32's bits in the oracle; ml_dtypes casts it its own way. Ties included: the
    # midpoints between neighbouring bf16 values must go to the even one.
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(5)
    values = np.concatenate([rng.standard_normal(20000) * 10.0 ** rng.integers(-6, 6, 20000), [0.0, -0.0, 1e38]])
    grid = np.arange(1, 0x7F7F, 37, dtype=np.uint32) << 16  # every finite exponent, none of inf and NaN
    below = grid.view(np.float32).astype(np.float64)
    mids = (below + np.nextafter(below.astype(ml_dtypes.bfloat16), np.inf).astype(np.float64)) / 2
    for sample in (values.astype(np.float32), mids.astype(np.float32)):
        expected = sample.astype(ml_dtypes.bfloat16).astype(np.float64)
        assert np.array_equal(oracle.half_round_trip(sample, "bf16"), expected, equal_nan=True)
        with np.errstate(over="ignore"):
            fp16 = sample.astype(np.float16).astype(np.float64)
        assert np.array_equal(oracle.half_round_trip(sample, "fp16"), fp16, equal_nan=True)
    assert np.isnan(oracle.half_round_trip(np.array([np.nan]), "bf16")).all()
    with pytest.raises(ValueError, match="use fp16 or bf16"):
        oracle.half_round_trip(values, "fp8")
