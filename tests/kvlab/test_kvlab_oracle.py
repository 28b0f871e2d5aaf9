"""The oracle is independent of what it judges: it imports nothing from the lab, and its scale, ALiBi slopes and
e4m3 round trip are checked against values from outside the lab (vLLM's slopes, ml_dtypes' float8_e4m3fn)."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

from builders.kvlab import oracle
from builders.kvlab.cases import VLLM_ALIBI_SLOPES

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
