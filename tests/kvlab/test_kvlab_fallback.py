"""`forge kvlab check` without Hypothesis importable: the seeded fallback of pool-invariants-hypothesis must check
the same properties, pass on the pool, and still catch the pool bug it once found (a half-done refused append)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from builders.kvlab import fuzz
from builders.kvlab.pool import BlockPool, PoolError

ROOT = Path(__file__).resolve().parents[2]

# A None entry in sys.modules makes `import hypothesis` raise ModuleNotFoundError, as after a plain install.
NO_HYPOTHESIS = "import sys; sys.modules['hypothesis'] = None\n"


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", NO_HYPOTHESIS + code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )


def test_check_passes_without_hypothesis() -> None:
    done = _python("from builders.cli import main; raise SystemExit(main(['kvlab', 'check', '--json']))")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    fuzz_case = next(c for c in report["cases"] if c["name"] == "pool-invariants-hypothesis")
    assert all(r["passed"] for r in fuzz_case["results"].values()), fuzz_case
    assert report["summary"]["passed"] == report["summary"]["runs"]


def test_fallback_is_the_seeded_path_and_catches_the_half_done_append() -> None:
    code = (
        "from builders.kvlab import fuzz\n"
        "print(fuzz.check_pool_invariants())\n"
        "fuzz.REGRESSIONS = ()\n"
        "try:\n    fuzz.check_pool_invariants('append-not-atomic')\n"
        "except AssertionError as exc:\n    print('caught:', exc)\n"
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "seeded random sequences" in done.stdout
    # Without the pinned regression, the seeded sequences alone find the bug and shrink it.
    assert "caught:" in done.stdout and "shrunk to" in done.stdout


def test_the_regression_sequence_fails_the_half_done_append_on_any_path() -> None:
    ops, cow, window = fuzz.REGRESSIONS[0]
    fuzz.run_ops(ops, cow=cow, window=window, bug=None)
    with pytest.raises(AssertionError, match="refused append changed it"):
        fuzz.run_ops(ops, cow=cow, window=window, bug="append-not-atomic")


def test_shrink_returns_a_shorter_sequence_that_still_fails() -> None:
    ops, cow, window = fuzz.REGRESSIONS[0]
    padded = [("trim", 0, 1), *ops, ("trim", 1, 1)]
    short, error = fuzz.shrink(padded, cow, window, "append-not-atomic")
    assert len(short) < len(padded)
    assert fuzz._fails(short, cow, window, "append-not-atomic") is not None
    assert "changed it" in str(error)
    with pytest.raises(ValueError, match="failing sequence"):
        fuzz.shrink(ops, cow, window, None)


def test_a_refused_append_leaves_the_request_and_the_cache_alone() -> None:
    pool = BlockPool(4, 4)
    request = pool.add_request("r", [])
    pool.append(request, list(range(6)))
    with pytest.raises(PoolError, match="needs 3 for 11 tokens, 1 are free"):
        pool.append(request, list(range(6, 17)))
    assert request.num_tokens == 6 and len(request.block_ids) == 2 and len(pool.cached) == 1
    pool.check_invariants()
