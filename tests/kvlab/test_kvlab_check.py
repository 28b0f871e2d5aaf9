"""`forge kvlab check --mutants --json` for real: every case passes on every layout, every planted bug is caught,
every feature of the study's list has a case; and a failing case turns into exit code 16."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from builders.cli import main
from builders.kvlab import cases
from builders.kvlab.cases import FP32, REQUIRED_FEATURES, Case, Ctx
from builders.kvlab.command import KvlabFailed
from builders.kvlab.lab import Lab
from builders.kvlab.oracle import reference_attention
from builders.kvlab.pool import BlockPool
from builders.kvlab.spec import AttnSpec


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["kvlab", "check", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def test_check_passes_and_catches_every_planted_bug(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _check(capsys, "--mutants")
    summary = report["summary"]
    assert code == 0
    assert summary["cases"] >= 30
    assert summary["passed"] == summary["runs"] >= 4 * 30
    assert summary["uncovered_features"] == []
    assert set(report["coverage"]) == set(REQUIRED_FEATURES)
    assert all(entry["cases"] for entry in report["coverage"].values())
    for case in report["cases"]:
        assert case["features"], case["name"]
        assert case["tolerance"]["why"], case["name"]
        if case["target"] == "layouts":
            assert set(case["results"]) == {"paged", "spans", "virtual", "hybrid"}
    caught = {(m["target"], m["bug"]): m["caught_by"] for m in report["mutants"]}
    assert all(caught.values()), [k for k, v in caught.items() if not v]
    # Every layout has several planted bugs, and the pool has its own.
    for target in ("paged", "spans", "virtual", "hybrid", "pool"):
        assert sum(1 for t, _ in caught if t == target) >= 3, target


def test_a_failing_case_fails_the_check(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def fp8_is_not_fp32(ctx: Ctx) -> None:
        # The cache holds e4m3 values; comparing them to fp32 attention at fp32's tolerance must fail.
        spec = AttnSpec(num_heads=4, num_kv_heads=4, head_size=64, k_scale=0.05, v_scale=0.05)
        lab = ctx.lab(spec, block_size=8)
        request = lab.admit("r", lab.prompt(20))
        entry = lab.entry(request)
        k, v = lab.kv(request.tokens, 0)
        out = ctx.layout(lab).attend([entry], lab.store)[0]
        ctx.close("fp8 vs fp32", out, reference_attention(entry.query, k, v))

    broken = Case("fp8-is-not-fp32", "layouts", ("fp8",), FP32[0], FP32[1], FP32[2], fp8_is_not_fp32)
    monkeypatch.setattr(cases, "CASES", [broken])
    monkeypatch.setattr("builders.kvlab.casebook.CASES", [broken])  # coverage() counts from here
    monkeypatch.setattr("builders.kvlab.command.CASES", [broken])
    monkeypatch.setattr("builders.kvlab.check.CASES", [broken])
    code = main(["kvlab", "check", "--layout", "paged"])
    err = capsys.readouterr().err
    assert code == KvlabFailed.exit_code == 16
    assert "fp8-is-not-fp32 on paged" in err
    assert "no case covers" in err  # with one case, most of the study's list is uncovered


def test_pool_invariants_catch_a_corrupted_pool() -> None:
    pool = BlockPool(8, 4)
    request = pool.add_request("r", [])
    pool.append(request, list(range(9)))
    pool.check_invariants()
    pool.blocks[request.block_ids[0]].ref_cnt += 1
    with pytest.raises(AssertionError, match="ref_cnt != holders"):
        pool.check_invariants()


def test_prefix_hit_reads_the_same_kv_the_first_request_wrote() -> None:
    spec = AttnSpec(num_heads=2, num_kv_heads=1, head_size=64)
    lab = Lab(spec, block_size=4)
    prompt = lab.prompt(13)
    first = lab.admit("a", prompt)
    second = lab.admit("b", prompt[:9] + lab.prompt(3))
    assert second.block_ids[:2] == first.block_ids[:2]
    # The shared blocks hold exactly the KV the token/position function gives, whoever computed them.
    k, _ = lab.kv(second.tokens[:8], 0)
    held = lab.store.k[list(second.block_ids[:2])].reshape(8, 1, 64)
    assert np.array_equal(held, k)
