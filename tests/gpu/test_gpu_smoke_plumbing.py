"""`nox -s gpu-smoke`'s plumbing without a GPU: the bundle keeps what a server build reads and drops the rest, the
profile it writes is one Forge loads, a command whose child keeps the output pipe open does not hold the run, and
with no GPU the run says so and exits 9. The CPU dry run (a llama-server build, minutes) is not a suite test."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from builders.gpu_smoke import (
    GpuSmokeResult,
    Log,
    ProbeRecord,
    class_rows,
    final_code,
    pack_tree,
    results_md,
    run_logged,
    write_profile,
)
from builders.smoke.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]


def test_the_bundle_keeps_the_server_build_and_drops_the_rest(tmp_path: Path) -> None:
    sdist = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    names = [
        "vendor/llama.cpp/CMakeLists.txt",
        "vendor/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu",
        "vendor/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.c",
        "vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp",
        "vendor/llama.cpp/ggml/src/ggml.c",
        "vendor/llama.cpp/tools/server/server.cpp",
        "vendor/llama.cpp/tools/ui/CMakeLists.txt",
        "vendor/llama.cpp/tools/ui/src/app.ts",
        "vendor/llama.cpp/models/ggml-vocab-gpt-2.gguf",
        "vendor/llama.cpp/docs/build.md",
        "vendor/llama.cpp/.github/workflows/build.yml",
        "llama_cpp/llama.py",
    ]
    with tarfile.open(sdist, "w:gz") as tar:
        for name in names:
            info = tarfile.TarInfo(f"llama_cpp_python-0.3.36/{name}")
            info.size = len(name)
            tar.addfile(info, io.BytesIO(name.encode()))
    dest = tmp_path / "tree.tar.gz"
    assert pack_tree(sdist, dest) == 6
    with tarfile.open(dest) as tar:
        kept = sorted(tar.getnames())
    assert kept == [
        "llama.cpp/CMakeLists.txt",
        "llama.cpp/ggml/src/ggml-cpu/ggml-cpu.c",
        "llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu",
        "llama.cpp/ggml/src/ggml.c",
        "llama.cpp/tools/server/server.cpp",
        "llama.cpp/tools/ui/CMakeLists.txt",
    ]


def test_the_profile_puts_both_pools_on_the_gpus(tmp_path: Path) -> None:
    profile, _ = load_profile(str(write_profile(tmp_path, gpus=2)), root=ROOT)
    assert set(profile.pools) == {"interactive", "bulk"}
    for index, pool in enumerate(profile.pools.values()):
        assert pool.extra_args == ("--n-gpu-layers", "999") and not pool.cpus
        assert pool.env == {"CUDA_VISIBLE_DEVICES": str(index)}
    cpu, _ = load_profile(str(write_profile(tmp_path / "cpu", gpus=0)), root=ROOT)
    assert all(not p.extra_args and not p.env for p in cpu.pools.values())


def test_a_child_holding_the_pipe_does_not_hold_the_run(tmp_path: Path) -> None:
    # The shell exits at once; its background child keeps stdout open for 8 s. The run ends with the shell.
    say = Log(tmp_path / "log.txt")
    started = time.monotonic()
    code, lines = run_logged(["sh", "-c", "sleep 8 & echo started"], say, timeout=20)
    assert code == 0 and lines[:1] == ["started"]
    assert time.monotonic() - started < 10
    assert "started" in (tmp_path / "log.txt").read_text()
    code, _ = run_logged(["sleep", "5"], say, timeout=1)
    assert code == 124


def test_without_a_gpu_the_run_says_so_and_exits_9(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "builders.gpu_smoke", "run", "--out", str(out), "--bundle", str(tmp_path / "none")],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 9, proc.stdout + proc.stderr
    assert "cannot evaluate without a GPU" in proc.stdout
    result = json.loads((out / "results.json").read_text())
    assert result["verdict"] == "not evaluated" and result["gpus"] == []
    assert "probe" not in result  # no GPU: the probe, which runs first by default, is not started either
    assert "- GPUs: none" in (out / "results.md").read_text()


def test_the_results_table_comes_from_the_smoke_report() -> None:
    # Trimmed from the smoke report of the dry run of 2026-12-04 (CPU build, 2-core Xeon): traffic.main.classes.
    report = json.loads((ROOT / "tests" / "gpu" / "data" / "gpu-smoke" / "dry-run-report.json").read_text())
    rows = class_rows(report)
    assert set(rows) == {"interactive", "rag", "long_prefill", "agent", "batch", "slow_stream"}
    assert rows["slow_stream"] == {
        "pool": "bulk",
        "requests": 2,
        "errors": 0,
        "ttft_p99_ms": report["traffic"]["main"]["classes"]["slow_stream"]["ttft_ms"]["p99"],
        "itl_p99_ms": report["traffic"]["main"]["classes"]["slow_stream"]["itl_ms"]["p99"],
        "passed": True,
    }
    result: GpuSmokeResult = {
        "when": "t",
        "verdict": "passed",
        "dry_run": True,
        "host": {"machine": "x86_64", "cpus": 2, "python": "3.12"},
        "gpus": [],
        "smoke": {"exit": 0, "tail": [], "classes": rows},
        "gpu_processes": {"4242 llama-server": 812},
    }
    text = results_md(result)
    assert "| slow_stream | bulk | 2 | 0 |" in text and "4242 llama-server: 812 MiB" in text
    # A class the smoke report's model would not read is an error, never a row of blanks.
    broken = json.loads(json.dumps(report))
    del broken["traffic"]["main"]["classes"]["rag"]["ttft_ms"]
    with pytest.raises(ValidationError, match="ttft_ms"):
        class_rows(broken)


@pytest.mark.parametrize(
    ("smoke", "probe", "dry_run", "code"),
    [
        (0, None, False, 0),
        (0, 0, False, 0),
        (0, 23, False, 23),  # the smoke passed, the driver disagreed with the gate
        (0, 9, False, 9),  # a variant not run is never counted as agreeing
        (8, 23, False, 8),  # a failed smoke speaks first; results.json keeps the probe's word
        (0, 9, True, 0),  # a dry run has no GPU for the probe: its 9 is expected there
        (0, 23, True, 23),
    ],
)
def test_the_run_exits_with_the_smokes_code_then_the_probes(
    smoke: int, probe: int | None, dry_run: bool, code: int
) -> None:
    record: ProbeRecord | None = (
        None if probe is None else {"exit": probe, "verdict": None, "seconds": 1.0, "json": None}
    )
    assert final_code(smoke, record, dry_run=dry_run) == code
