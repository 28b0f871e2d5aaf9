"""The `vllm bench serve` cross-check's verdict: the gates it evaluated, the errors each tool counted, and a
failed run whenever either tool errored (it used to write `passed` and exit 0 whatever the counts were)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def load_crosscheck() -> ModuleType:
    # benchmarks/ is a folder of scripts, not a package: load the file itself.
    spec = importlib.util.spec_from_file_location(
        "crosscheck_bench_serve", ROOT / "benchmarks" / "crosscheck_bench_serve.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def numbers(errors: int) -> dict[str, Any]:
    """One tool's numbers as the cross-check records them."""
    return {m: {"p50": 10.0, "p99": 20.0} for m in ("ttft_ms", "itl_ms", "tpot_ms")} | {"errors": errors}


def test_both_tools_without_errors_pass_both_gates() -> None:
    gates = load_crosscheck().judge({"forge": numbers(0), "vllm_bench_serve": numbers(0)}, 60)
    assert gates["passed"] and gates["failures"] == []
    assert [(g["gate"], g["passed"], g["errors"], g["of"]) for g in gates["evaluated"]] == [
        ("forge: no request failed", True, 0, 60),
        ("vllm_bench_serve: no request failed", True, 0, 60),
    ]


def test_errors_on_either_side_fail_the_run_and_are_counted() -> None:
    judge = load_crosscheck().judge
    gates = judge({"forge": numbers(3), "vllm_bench_serve": numbers(0)}, 60)
    assert not gates["passed"] and gates["failures"] == ["forge: no request failed: 3 of 60 errors"]
    gates = judge({"forge": numbers(0), "vllm_bench_serve": numbers(1)}, 60)
    assert gates["failures"] == ["vllm_bench_serve: no request failed: 1 of 60 errors"]


def test_a_bench_serve_that_exited_non_zero_fails_with_its_status() -> None:
    failed = numbers(60) | {"failed": {"exit_status": 1, "output": "ConnectionRefusedError"}}
    gates = load_crosscheck().judge({"forge": numbers(0), "vllm_bench_serve": failed}, 60)
    assert gates["failures"] == ["vllm_bench_serve: no request failed: 60 of 60 errors (vllm bench serve exited 1)"]


def test_a_tool_that_never_ran_is_a_failure_not_a_pass() -> None:
    gates = load_crosscheck().judge({"forge": numbers(0)}, 60)
    assert gates["failures"] == ["vllm_bench_serve: no request failed: 60 of 60 errors (vllm bench serve did not run)"]
