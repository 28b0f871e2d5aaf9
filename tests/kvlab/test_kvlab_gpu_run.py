"""The GPU run where no GPU is: `--device cuda` refuses with the reason, the peak table finds each product, the
bars and the ranking come from the rows as measured, and the one prepared script (`nox -s kvlab-gpu`) runs end to
end under Triton's interpreter with none of the packages the GPU hosts lack."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from builders.cli import main
from builders.kvlab import gpu_bench

ROOT = Path(__file__).resolve().parents[2]
HAS_KERNELS = all(importlib.util.find_spec(m) is not None for m in ("torch", "triton"))


def test_device_cuda_says_why_it_cannot_run_here(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kvlab", "rank", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    expected = "sees no CUDA device" if importlib.util.find_spec("torch") else "PyTorch is not installed"
    assert "--device cuda: " in err and expected in err


def test_kvlab_kernels_says_what_it_lacks(capsys: pytest.CaptureFixture[str]) -> None:
    # Without torch and triton the interpreter cannot run; with them (a CPU build), CUDA is what is missing.
    argv = ["kvlab", "kernels", "--device", "cuda"] if HAS_KERNELS else ["kvlab", "kernels"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        ("--device cuda: PyTorch" in err and "sees no CUDA device" in err)
        if HAS_KERNELS
        else ("the Triton kernels need torch and triton" in err or "the Triton kernels need triton" in err)
    )


@pytest.mark.parametrize(
    ("name", "tbps"),
    [
        ("NVIDIA H200", 4.8),
        ("NVIDIA GH200 480GB", 4.0),
        ("NVIDIA H100 80GB HBM3", 3.35),
        ("NVIDIA H100 PCIe", 2.0),
        ("NVIDIA H100 NVL", 3.9),
        ("NVIDIA A100-SXM4-80GB", 2.039),
        ("NVIDIA A100 80GB PCIe", 1.935),
        ("NVIDIA A100-SXM4-40GB", 1.555),
        ("NVIDIA L40S", 0.864),
        ("NVIDIA L4", 0.3),
        ("Tesla T4", 0.32),
    ],
)
def test_the_peak_is_the_most_specific_row_for_the_product(name: str, tbps: float) -> None:
    found = gpu_bench.peak_for(name)
    assert found is not None and found[0] == tbps


def test_a_product_the_table_lacks_has_no_peak() -> None:
    assert gpu_bench.peak_for("NVIDIA Jetson Orin") is None


def _row(ms: float, moved: float, peak: float) -> gpu_bench.Row:
    return {"ms": ms, "gbps": moved / ms / 1e6, "share_of_peak": moved / ms / 1e6 / (peak * 1000)}


def test_the_bars_and_the_rank_follow_the_measured_rows() -> None:
    peak = 4.8
    gib2 = 2 * 2**30
    scenarios: dict[str, gpu_bench.Layouts] = {
        "b64-8k": {
            "layouts": {
                n: _row(ms, gib2, peak) for n, ms in (("paged", 0.9), ("spans", 0.8), ("virtual", 0.7), ("hybrid", 1.0))
            }
        },
        "b64-8k-90": {
            "layouts": {
                n: _row(ms, gib2, peak)
                for n, ms in (("paged", 0.9), ("spans", 0.8), ("virtual", 0.7), ("hybrid", 0.25))
            }
        },
    }
    v = gpu_bench.verdicts(scenarios, peak)
    best = v["best_layout_at_headline"]
    # virtual moves 2 GiB in 0.7 ms: 3.07 TB/s, 64 % of 4.8.
    share = best["share_of_peak"]
    assert (
        best["layout"] == "virtual" and best["met"] and share is not None and abs(share - gib2 / 0.7e-3 / 4.8e12) < 1e-9
    )
    assert v["cascade_vs_paged_at_90"]["speedup"] == pytest.approx(3.6) and v["cascade_vs_paged_at_90"]["met"]
    rows = gpu_bench.ranking(scenarios)
    # Geometric means: hybrid sqrt(1.0 × 0.25) = 0.5 ms, virtual 0.7, spans 0.8, paged 0.9.
    assert [r["layout"] for r in rows] == ["hybrid", "virtual", "spans", "paged"]
    assert [r["place"] for r in rows] == [1, 2, 3, 4]
    # A layout that failed its oracle check anywhere has no place.
    scenarios["b64-8k"]["layouts"]["virtual"] = {"failed": "differs from the oracle"}
    rows = gpu_bench.ranking(scenarios)
    assert rows[-1]["layout"] == "virtual" and rows[-1]["place"] is None
    assert [r["place"] for r in rows] == [1, 2, 3, None]


def test_the_cuda_report_names_the_gpu_and_its_driver_beside_the_cpu() -> None:
    # Issue 54: the KV lab's CUDA report once named the CPU and not the GPU it timed.
    device: gpu_bench.DeviceInfo = {
        "torch": "2.9.1+cu130",
        "torch_cuda": "13.0",
        "triton": "3.5.1",
        "numpy": "2.3.5",
        "python": "3.12.3",
        "cpu": "x86_64",
        "cpu_cores": 16,
        "gpu": "NVIDIA H200",
        "driver": "580.159.04",
        "peak_tbps": 4.8,
        "peak_source": "datasheet",
    }
    report: gpu_bench.BenchReport = {
        "device": device,
        "spec": {},
        "page": 16,
        "scenarios": {},
        "skipped": [],
        "ranking": [],
        "verdicts": {},
    }
    first = gpu_bench.render(report).splitlines()[0]
    assert first.startswith("Device: NVIDIA H200; driver 580.159.04; torch 2.9.1+cu130 (CUDA 13.0)"), first
    assert "dry run" not in gpu_bench.render(report)


# What the GPU hosts lack, made unimportable as there (a None in sys.modules makes the import fail).
GPU_HOST = "import sys\nfor m in ('pydantic', 'httptools', 'docker', 'gguf', 'nox'):\n    sys.modules[m] = None\n"


@pytest.mark.skipif(not HAS_KERNELS, reason="the dry run needs torch and triton: pip install -e '.[kernels]'")
def test_the_prepared_gpu_script_runs_end_to_end_under_the_interpreter(tmp_path: Path) -> None:
    code = GPU_HOST + (
        "import runpy\nsys.argv = ['gpu_check', '--dry-run', '--quick', '--out', sys.argv[1]]\n"
        "runpy.run_module('builders.kvlab.gpu_check', run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "results.json").read_text())
    assert report["mode"].startswith("dry run") and report["device"]["gpu"] is None
    for name, scenario in report["scenarios"].items():
        assert set(scenario["layouts"]) == {"paged", "spans", "virtual", "hybrid"}, name
        for row in scenario["layouts"].values():
            assert row["oracle_max_error"] < 2e-3 and row["ms"] > 0
        assert scenario["anchors"]["sdpa"]["oracle_max_error"] < 2e-3
        assert "only on a GPU" in scenario["anchors"]["flashinfer"]["skipped"]
    assert report["cases"]["runs"] and all(r["passed"] for r in report["cases"]["runs"])
    assert report["mutants"]["runs"] and all(m["caught_by"] for m in report["mutants"]["runs"])
    assert "no figure here is a speed" in (tmp_path / "results.md").read_text()
    assert "results:" in (tmp_path / "log.txt").read_text()
