"""`forge gpu probe` up to the point that needs a GPU: PyPI's nvcc 13.0 compiles the variants, PyPI's cuobjdump reads
each as the one kind and arch it was built for, and with no GPU the command says so and exits 9 with the JSON of
what it compiled. The prediction is checked on recorded readings; the driver half runs only on a GPU host."""

from __future__ import annotations

import json
import os
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
from builders.gpu_smoke import Log, final_code, probe_step

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


# A stand-in for the NVIDIA driver's libcuda.so.1, with the calls the probe makes: one GPU of capability 9.0 that
# loads every module (FAKE_CUDA_LOAD=all) or none (=none), and "runs" the kernel by writing what it would write.
# It tests the probe's ctypes marshalling and its verdicts on a CPU; whether NVIDIA's driver agrees is the GPU run's.
FAKE_LIBCUDA = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
static uint32_t *buffer;
static const char *names[] = {"CUDA_SUCCESS", "CUDA_ERROR_NO_BINARY_FOR_GPU"};
int cuInit(unsigned f) { return 0; }
int cuGetErrorName(int rc, const char **s) { *s = rc == 209 ? names[1] : names[0]; return 0; }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int i) { *d = i; return 0; }
int cuDeviceGetName(char *s, int n, int d) { strncpy(s, "Fake H200", n); return 0; }
int cuDeviceGetAttribute(int *v, int a, int d) { *v = a == 75 ? 9 : 0; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int d) { *c = (void *)1; return 0; }
int cuDevicePrimaryCtxRelease_v2(int d) { return 0; }
int cuCtxSetCurrent(void *c) { return 0; }
int cuModuleLoadData(void **m, const void *image) {
    const char *mode = getenv("FAKE_CUDA_LOAD");
    if (mode && strcmp(mode, "none") == 0) return 209;
    *m = (void *)2; return 0;
}
int cuModuleUnload(void *m) { return 0; }
int cuModuleGetFunction(void **f, void *m, const char *name) { *f = (void *)3; return strcmp(name, "forge_probe"); }
int cuMemAlloc_v2(uint64_t *p, size_t n) { buffer = malloc(n); *p = (uint64_t)(uintptr_t)buffer; return 0; }
int cuMemsetD8_v2(uint64_t p, unsigned char v, size_t n) { memset((void *)(uintptr_t)p, v, n); return 0; }
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **params, void **extra) {
    uint32_t *out = (uint32_t *)(uintptr_t)(*(uint64_t *)params[0]);
    for (unsigned i = 0; i < bx; i++) out[i] = 0x466F7267u + i;
    return 0;
}
int cuCtxSynchronize(void) { return 0; }
int cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t n) { memcpy(dst, (void *)(uintptr_t)src, n); return 0; }
int cuMemFree_v2(uint64_t p) { free((void *)(uintptr_t)p); return 0; }
"""


def stand_in_libcuda(tmp_path: Path) -> Path:
    """The folder holding the stand-in libcuda.so.1, compiled from FAKE_LIBCUDA."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (tmp_path / "fake.c").write_text(FAKE_LIBCUDA)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib / "libcuda.so.1"), str(tmp_path / "fake.c")], check=True)
    return lib


@pytest.mark.network
@pytest.mark.skipif(platform.machine() != "x86_64", reason="nvcc's and cuobjdump's wheels are pinned for x86_64")
def test_the_driver_half_through_a_stand_in_libcuda(tmp_path: Path) -> None:
    lib = stand_in_libcuda(tmp_path)
    nvcc = nvcc_from_pypi(wheel_cache(ROOT))

    def probe(load: str, archs: str = "8.0 9.0") -> tuple[int, str, dict[str, dict[str, object]]]:
        out = tmp_path / f"out-{load}-{archs}"
        argv = ["--image-archs", archs, "--nvcc", str(nvcc), "--out", str(out), "--work", str(tmp_path / "w")]
        env = {**os.environ, "LD_LIBRARY_PATH": str(lib), "FAKE_CUDA_LOAD": load, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(
            [sys.executable, "-m", "builders.gpu_probe", *argv], env=env, capture_output=True, text=True, cwd=ROOT
        )
        result = json.loads((out / "probe.json").read_text())
        runs = {v["variant"]: v["runs"]["0"] for v in result["variants"] if v["runs"]}
        return proc.returncode, proc.stdout + proc.stderr, runs

    # A driver that loads everything runs sm_80 SASS on a 9.0 GPU, which the gate says it cannot: exit 23, named.
    code, text, runs = probe("all")
    assert code == 23, text
    assert "sm_80 SASS on GPU 0: gate refuses it, driver: ran: every thread wrote its value" in text
    assert {v: (r["predicted"], r["ran"]) for v, r in runs.items()} == {
        "sm_80 SASS": (False, True),
        "compute_80 PTX": (True, True),
        "sm_90 SASS": (True, True),
        "compute_90 PTX": (True, True),
    }
    # A driver that loads nothing refuses what the gate says runs.
    code, text, runs = probe("none")
    assert code == 23 and runs["sm_90 SASS"]["driver"] == "cuModuleLoadData: CUDA_ERROR_NO_BINARY_FOR_GPU (209)"
    assert [v for v, r in runs.items() if r["agree"]] == ["sm_80 SASS"]
    # A variant nvcc 13.0 cannot build (Volta's 7.0) is never run, so never counted as agreeing: exit 9, named,
    # although the driver did what the gate said for every variant it ran.
    code, text, runs = probe("all", "7.0 9.0")
    assert code == 9, text
    assert "2 of 4 variants were not run" in text and "sm_70 SASS: nvcc exited 1" in text
    assert set(runs) == {"sm_90 SASS", "compute_90 PTX"} and all(r["agree"] for r in runs.values())


@pytest.mark.network
@pytest.mark.skipif(platform.machine() != "x86_64", reason="nvcc's and cuobjdump's wheels are pinned for x86_64")
def test_gpu_smoke_runs_the_probe_first_and_keeps_its_word(tmp_path: Path) -> None:
    # The GPU session's one command runs the probe as this step does; the stand-in driver answers for the GPU, and
    # nvcc comes from the Forge cache through PATH, as a GPU host's own would.
    lib = stand_in_libcuda(tmp_path)
    nvcc = nvcc_from_pypi(wheel_cache(ROOT))
    env = {
        **os.environ,
        "PATH": f"{nvcc.parent}:{os.environ['PATH']}",
        "LD_LIBRARY_PATH": str(lib),
        "FAKE_CUDA_LOAD": "all",
        "PYTHONPATH": str(ROOT),
    }
    say = Log(tmp_path / "log.txt")
    record = probe_step(tmp_path / "probe", tmp_path / "work", archs="9.0", say=say, env=env)
    assert record["exit"] == 0 and record["verdict"] == "agree", (tmp_path / "log.txt").read_text()
    assert record["json"] == str(tmp_path / "probe" / "probe.json")
    assert "sm_90 SASS" in (tmp_path / "log.txt").read_text()
    # Where the stand-in runs what the gate refuses, the smoke's pass does not hide it.
    record = probe_step(tmp_path / "p2", tmp_path / "work", archs="8.0", say=say, env=env)
    assert (record["exit"], record["verdict"]) == (23, "disagree")
    assert final_code(0, record, dry_run=False) == 23
