"""`forge gpu probe` up to the point that needs a GPU: PyPI's nvcc 13.0 compiles the variants, PyPI's cuobjdump reads
each as the one kind and arch it was built for, and with no GPU the command says so and exits 9 with the JSON of
what it compiled. The prediction is checked on recorded readings; the driver half runs only on a GPU host."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from builders.cli import main
from builders.cuda_driver import CudaVersion
from builders.errors import UsageError
from builders.gpu_archs import Arch, Capability, LibraryArchs, nvcc_from_pypi, wheel_cache
from builders.gpu_probe import Built, Variant, parse_archs, predict

ROOT = Path(__file__).resolve().parents[2]


def test_arch_lists_keep_their_suffixes() -> None:
    assert parse_archs("7.5 9.0a;10.0f,12.0+PTX 9.0a", where="x") == [
        Arch(7, 5),
        Arch(9, 0, "a"),
        Arch(10, 0, "f"),
        Arch(12, 0),
    ]
    with pytest.raises(UsageError, match="'sm_90' is not an arch"):
        parse_archs("sm_90", where="x")
    assert Variant(arch=Arch(9, 0, "a"), kind="sass").gencode() == "arch=compute_90a,code=sm_90a"
    assert Variant(arch=Arch(10, 0), kind="ptx").gencode() == "arch=compute_100,code=compute_100"
    assert Variant(arch=Arch(10, 0), kind="ptx").name == "compute_100 PTX"


def built(kind: str, arch: Arch) -> Built:
    variant = Variant(arch=arch, kind=kind)  # type: ignore[arg-type]
    read = LibraryArchs(library=variant.name, **{kind: frozenset({arch})})
    return Built(variant=variant, read=read)


@pytest.mark.parametrize(
    ("kind", "arch", "gpu", "driver", "runs"),
    [
        ("sass", Arch(8, 0), Capability(8, 6), "13.0", True),  # within the major
        ("sass", Arch(8, 0), Capability(9, 0), "13.0", False),  # never across majors
        ("sass", Arch(9, 0, "a"), Capability(9, 0), "13.0", True),
        ("sass", Arch(10, 0, "a"), Capability(10, 3), "13.0", False),  # a: that capability alone
        ("ptx", Arch(8, 0), Capability(9, 0), "13.0", True),  # JIT forwards
        ("ptx", Arch(10, 0), Capability(9, 0), "13.0", False),  # never backwards
        ("ptx", Arch(9, 0), Capability(9, 0), "12.8", False),  # nvcc 13.0's PTX on a 12.8 driver
    ],
)
def test_the_gates_word_on_a_variant(kind: str, arch: Arch, gpu: Capability, driver: str, runs: bool) -> None:
    predicted, why = predict(built(kind, arch), gpu, CudaVersion.parse(driver), CudaVersion(13, 0))
    assert predicted is runs, why


@pytest.mark.network
@pytest.mark.skipif(platform.machine() != "x86_64", reason="nvcc's and cuobjdump's wheels are pinned for x86_64")
def test_pypi_nvcc_compiles_cuobjdump_reads_and_no_gpu_is_exit_9(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nvcc = nvcc_from_pypi(wheel_cache(ROOT))
    out = tmp_path / "probe"
    argv = ["gpu", "probe", "--image-archs", "8.0 9.0a 10.0f", "--nvcc", str(nvcc), "--out", str(out)]
    code = main([*argv, "--work", str(tmp_path / "work")])
    err = capsys.readouterr().err
    assert code == 9, err
    assert "cannot evaluate without a GPU" in err and "libcuda.so.1" in err
    assert [p.name for p in out.iterdir()] == ["probe.json"]
    assert len(list((tmp_path / "work").glob("*.fatbin"))) == 6
    result = json.loads((out / "probe.json").read_text())
    assert result["verdict"] == "not evaluated" and result["nvcc"]["release"] == "13.0"
    read = {v["variant"]: (v["error"], v["read"]) for v in result["variants"]}
    assert read == {
        "sm_80 SASS": (None, {"sass": ["sm_80"], "ptx": []}),
        "compute_80 PTX": (None, {"sass": [], "ptx": ["compute_80"]}),
        "sm_90a SASS": (None, {"sass": ["sm_90a"], "ptx": []}),
        "compute_90a PTX": (None, {"sass": [], "ptx": ["compute_90a"]}),
        # cuobjdump lists family SASS under its plain arch's name; the same rules hold for it within the family.
        "sm_100f SASS": (None, {"sass": ["sm_100"], "ptx": []}),
        "compute_100f PTX": (None, {"sass": [], "ptx": ["compute_100f"]}),
    }


def test_the_module_runs_without_forges_cli(tmp_path: Path) -> None:
    # The GPU hosts within reach have no pydantic: the probe must not import it (nor the CLI that does).
    code = (
        "import sys, builders.gpu_probe, builders.gpu_image, builders.cuda_driver;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'docker', 'httptools', 'gguf')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert proc.stdout.strip() == "[]"
