"""builders/kvlab/cuda.py where no GPU is: `--device cuda` refuses with the reason, and its read paths, run
through a NumPy stand-in for the few torch calls they make, agree with the oracle for every layout."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from builders.cli import main
from builders.kvlab import rank
from builders.kvlab.spec import AttnSpec

HAS_TORCH = importlib.util.find_spec("torch") is not None


@pytest.mark.skipif(HAS_TORCH, reason="PyTorch is installed: the refusal cannot be seen")
def test_device_cuda_without_torch_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kvlab", "rank", "--device", "cuda"]) == 2
    assert "--device cuda: PyTorch is not installed" in capsys.readouterr().err


@pytest.mark.skipif(HAS_TORCH, reason="PyTorch is installed: its real kernels are the test")
def test_cuda_read_paths_agree_with_the_oracle(monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        import numpy_as_torch
    finally:
        sys.path.pop(0)
    monkeypatch.setitem(sys.modules, "torch", numpy_as_torch)
    from builders.kvlab.cuda import measure_cuda, unavailable

    assert unavailable() is None
    spec = AttnSpec(num_heads=8, num_kv_heads=2, head_size=64)
    for scenario in rank.scenarios(quick=True):
        if scenario.name in ("len-256", "frag-shuffled", "share-90"):
            for name in ("paged", "spans", "virtual", "hybrid"):
                # measure_cuda raises when an output differs from the oracle by more than fp16 allows.
                m = measure_cuda(name, spec, scenario, steps=2)
                assert m.ms_per_step > 0
