"""run_preflight and `forge preflight` on declared facts, the host's own files, and a real small tmpfs."""

from __future__ import annotations

import io
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from builders.cli import main
from builders.config.models import Distro
from builders.errors import PreflightBlocked, PreflightIncomplete
from builders.gates.host import (
    GIB,
    HostFacts,
    Memory,
    cgroup_memory,
    parse_cpu_flags,
    parse_meminfo,
    read_host_facts,
    read_memory,
)
from builders.preflight import PreflightReport, render_table, run_preflight
from builders.project import Project

FIXTURE = Path(__file__).parent / "fixtures" / "vllm-0.33.0"
JSON_FINDING_KEYS = {"gate", "found", "required", "source", "blocking", "remedy"}


def _declared(
    project: Project, distro: str, target: str, tmp_path: Path, host: HostFacts | None = None
) -> PreflightReport:
    return run_preflight(
        project,
        project.distros[distro],
        project.recipe_for(target),
        engine=None,
        source=FIXTURE,
        max_jobs=None,
        scratch_dir=tmp_path,
        probe=False,
        host=host,
    )


def test_debian_12_declared_is_blocked_and_says_it_did_not_probe(project: Project, tmp_path: Path) -> None:
    report = _declared(project, "debian-12", "cpu", tmp_path)
    assert report.blocked and report.mode == "declared"
    gcc = next(f for f in report.blocking if f.gate == "gcc")
    assert gcc.source.startswith("cmake/cpu_extension.cmake:") and gcc.found == "GCC 12.2"
    cmake = next(f for f in report.blocking if f.gate == "cmake")
    assert cmake.found == "CMake 3.25" and cmake.required == "≥ 3.26"
    probe = report.finding("probe")
    assert probe is not None and not probe.passed and "--no-probe" in probe.found
    assert report.vllm_version == "0.33.0"


def test_debian_13_declared_clears_the_compiler_gates(project: Project, tmp_path: Path) -> None:
    report = _declared(project, "debian-13", "cpu", tmp_path)
    assert {f.gate for f in report.blocking} <= {"disk-layers"}  # no engine: layer storage is only a warning
    assert {f.gate for f in report.passed} >= {"gcc", "cmake", "python", "python-cmake", "ram"}


def test_cmake_from_pip_turns_the_cmake_block_into_a_warning(project: Project, tmp_path: Path) -> None:
    recipe = project.recipe_for("cpu").model_copy(update={"cmake_from_pip": True})
    report = run_preflight(
        project,
        project.distros["debian-12"],
        recipe,
        engine=None,
        source=FIXTURE,
        max_jobs=None,
        scratch_dir=tmp_path,
        probe=False,
    )
    cmake = report.finding("cmake")
    assert cmake is not None and not cmake.blocking and "applied automatically" in cmake.remedy


def test_wheel_target_skips_compile_gates(project: Project, tmp_path: Path) -> None:
    report = run_preflight(
        project,
        project.distros["debian-12"],
        project.recipe_for("cpu-wheel"),
        engine=None,
        source=None,
        max_jobs=None,
        scratch_dir=tmp_path,
        probe=False,
        wheelhouse=[tmp_path / "nowhere"],
    )
    gates = {f.gate for f in (*report.findings, *report.passed)}
    assert "gcc" not in gates and "cmake" not in gates and "numa-headers" not in gates
    torch = report.finding("torch-wheel")
    assert torch is not None and not torch.passed  # an empty or missing wheelhouse is never a pass
    assert report.max_jobs == 1


def test_isa_with_a_run_host_flags_file(project: Project, tmp_path: Path) -> None:
    recipe = project.recipe_for("cpu").model_copy(update={"isa": {"VLLM_CPU_AVX512": "1"}})
    runhost = tmp_path / "runhost-cpuinfo"
    runhost.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 f16c\n")
    report = run_preflight(
        project,
        project.distros["debian-13"],
        recipe,
        engine=None,
        source=FIXTURE,
        max_jobs=None,
        scratch_dir=tmp_path,
        probe=False,
        run_host_flags=parse_cpu_flags(runhost.read_text()),
        run_host_source=str(runhost),
    )
    isa = report.finding("isa")
    assert isa is not None and not isa.passed and not isa.blocking and "avx512f" in isa.found


def test_ram_gate_uses_the_given_host(project: Project, tmp_path: Path) -> None:
    real = read_host_facts()
    small = HostFacts(
        memory=Memory(available=4 * GIB, total=8 * GIB, source="test"),
        cores=8,
        cpu_flags=real.cpu_flags,
        mounts=real.mounts,
    )
    report = _declared(project, "debian-13", "cpu", tmp_path, host=small)
    ram = report.finding("ram")
    assert ram is not None and ram.passed and report.max_jobs == 1
    forced = run_preflight(
        project,
        project.distros["debian-13"],
        project.recipe_for("cpu"),
        engine=None,
        source=FIXTURE,
        max_jobs=4,
        scratch_dir=tmp_path,
        probe=False,
        host=small,
    )
    ram = forced.finding("ram")
    assert ram is not None and ram.blocking and "--max-jobs 1" in ram.remedy


def test_report_json_and_table(project: Project, tmp_path: Path) -> None:
    report = _declared(project, "debian-12", "cpu", tmp_path)
    data = report.to_json()
    assert {"distro", "target", "blocked", "findings"} <= set(data)
    assert data["distro"] == "debian-12" and data["target"] == "cpu" and data["blocked"] is True
    for item in data["findings"]:
        assert set(item) >= JSON_FINDING_KEYS
    json.dumps(data)
    out = io.StringIO()  # not a terminal: plain aligned text, one line per gate, never folded at 80 columns
    render_table(report, out)
    lines = out.getvalue().splitlines()
    assert "BLOCKED" in lines[0] and lines[1].split() == ["gate", "found", "required", "source", "verdict", "remedy"]
    gcc = next(line for line in lines if line.startswith("gcc ") and "block" in line)
    assert "cmake/cpu_extension.cmake:" in gcc and "GCC 12.2" in gcc and "≥ 12.3" in gcc
    assert len(lines) == 3 + len(report.findings) + len(report.passed)


@pytest.mark.usefixtures("ample_disk")
def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "preflight",
            "debian-12",
            "cpu",
            "--source",
            str(FIXTURE),
            "--no-probe",
            "--json",
            "--scratch-dir",
            str(tmp_path),
        ]
    )
    assert rc == PreflightBlocked.exit_code == 3
    data = json.loads(capsys.readouterr().out)
    assert data["blocked"] and any(f["gate"] == "gcc" and f["blocking"] for f in data["findings"])
    rc = main(
        [
            "preflight",
            "debian-13",
            "cpu",
            "--source",
            str(FIXTURE),
            "--no-probe",
            "--scratch-dir",
            str(tmp_path),
            "--problems-only",
        ]
    )
    out = capsys.readouterr()
    # Without a probe nobody looked for numa.h or libtcmalloc in the archive: incomplete, not clear.
    assert rc == PreflightIncomplete.exit_code == 9, out.out
    assert "INCOMPLETE" in out.out and "not evaluated" in out.out and "clear" not in out.out
    assert "preflight incomplete: not evaluated: " in out.err and "--allow-incomplete" in out.err
    rc = main(
        [
            "preflight",
            "debian-13",
            "cpu",
            "--source",
            str(FIXTURE),
            "--no-probe",
            "--json",
            "--scratch-dir",
            str(tmp_path),
            "--allow-incomplete",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert rc == 0 and data["verdict"] == "incomplete" and not data["complete"]
    assert {"numa-headers", "tcmalloc"} <= set(data["not_evaluated"])
    assert not {f["gate"] for f in data["passed"]} & set(data["not_evaluated"])


def test_cli_bad_run_host_flags_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "flags"
    empty.write_text("\n")
    rc = main(["preflight", "debian-13", "cpu", "--source", str(FIXTURE), "--no-probe", "--run-host-flags", str(empty)])
    assert rc == 2 and "no CPU flags" in capsys.readouterr().err


def test_host_parsers(tmp_path: Path) -> None:
    info = parse_meminfo("MemTotal:       24683652 kB\nMemAvailable:   21843408 kB\nHugePages_Total:       0\n")
    assert info["MemAvailable"] == 21843408 * 1024 and info["HugePages_Total"] == 0
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 16777216 kB\nMemAvailable: 8388608 kB\n")
    cg = tmp_path / "cgroup"
    cg.mkdir()
    (cg / "memory.max").write_text("4294967296\n")
    (cg / "memory.current").write_text("1073741824\n")
    assert cgroup_memory(cg) == (4 * GIB, GIB, str(cg / "memory.max"))
    mem = read_memory(meminfo, cg)
    assert mem.available == 3 * GIB and mem.total == 4 * GIB and "cgroup" in mem.source
    (cg / "memory.max").write_text("max\n")
    mem = read_memory(meminfo, cg)
    assert mem.available == 8 * GIB and "MemAvailable" in mem.source


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "small"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_small_tmpfs_scratch_dir_blocks(project: Project, small_tmpfs: Path) -> None:
    report = run_preflight(
        project,
        project.distros["debian-13"],
        project.recipe_for("cpu"),
        engine=None,
        source=FIXTURE,
        max_jobs=None,
        scratch_dir=small_tmpfs / "forge",
        probe=False,
    )
    blocking = {f.gate: f for f in report.blocking}
    assert "disk-scratch" in blocking and "MiB" not in blocking["disk-scratch"].found
    assert blocking["disk-scratch"].found.startswith("0.1 GiB free at " + str(small_tmpfs))
    assert "scratch-tmpfs" in blocking and "tmpfs" in blocking["scratch-tmpfs"].found
    assert "--scratch-dir" in blocking["scratch-tmpfs"].remedy


def test_without_source_the_cached_sdist_is_read(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tarfile

    cache = tmp_path / "cache"
    (cache / "sources").mkdir(parents=True)
    with tarfile.open(cache / "sources" / "vllm-0.33.0.tar.gz", "w:gz") as tar:
        tar.add(FIXTURE, arcname="vllm-0.33.0")
    monkeypatch.setenv("FORGE_CACHE", str(cache))
    report = run_preflight(
        project,
        project.distros["debian-12"],
        project.recipe_for("cpu"),
        engine=None,
        source=None,
        max_jobs=None,
        scratch_dir=tmp_path,
        probe=False,
    )
    assert report.source == str(cache / "sources" / "vllm-0.33.0.tar.gz")
    assert any(f.gate == "gcc" for f in report.blocking)
    monkeypatch.setenv("FORGE_CACHE", str(tmp_path / "empty"))
    bare = run_preflight(
        project,
        project.distros["debian-12"],
        project.recipe_for("cpu"),
        engine=None,
        source=None,
        max_jobs=None,
        scratch_dir=tmp_path,
        probe=False,
    )
    # Not cached and not asked to fetch: every source gate is listed as not evaluated, none as passed.
    gcc = bare.finding("gcc")
    assert gcc is not None and not gcc.evaluated and "forge fetch" in gcc.remedy
    assert bare.verdict == "incomplete" and not bare.complete
    assert {"gcc", "cmake", "python", "python-cmake", "fetched-source"} <= set(bare.not_evaluated)


def test_wheelhouse_torch_must_match_the_distro_python(project: Project, tmp_path: Path) -> None:
    house = tmp_path / "wheels"
    house.mkdir()
    (house / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    recipe = project.recipe_for("cpu-wheel")
    d12 = run_preflight(
        project,
        project.distros["debian-12"],
        recipe,
        engine=None,
        source=None,
        max_jobs=None,
        scratch_dir=tmp_path,
        probe=False,
        wheelhouse=[house],
    )
    torch = d12.finding("torch-wheel")
    assert torch is not None and torch.passed
    d13 = run_preflight(
        project,
        project.distros["debian-13"],
        recipe,
        engine=None,
        source=None,
        max_jobs=None,
        scratch_dir=tmp_path,
        probe=False,
        wheelhouse=[house],
    )
    torch = d13.finding("torch-wheel")
    assert torch is not None and torch.blocking and "cp311" in torch.found


def test_cuda_target_gates(project: Project, tmp_path: Path) -> None:
    recipe = project.recipe_for("gpu")

    def blocking(distro: Distro) -> set[str]:
        report = run_preflight(
            project,
            distro,
            recipe,
            engine=None,
            source=FIXTURE,
            max_jobs=None,
            scratch_dir=tmp_path,
            probe=False,
            gpu_mode="source",
        )
        return {f.gate for f in report.blocking}

    f44 = project.distros["fedora-44"]
    assert f44.cuda is not None
    assert not blocking(f44) & {"gcc", "nvcc-host-gcc", "cuda-glibc-rsqrt"}
    no_host = f44.model_copy(update={"cuda": f44.cuda.model_copy(update={"host_compiler": None})})
    assert "nvcc-host-gcc" in blocking(no_host)
    assert "cuda" in blocking(project.distros["ubuntu-22.04"])  # no CUDA section in its distro file
    # A host compiler older than vLLM's CUDA gate: the remedy names the key that compiler is declared under.
    assert f44.cuda.host_compiler is not None
    old_host = f44.cuda.host_compiler.model_copy(update={"gcc": "12.4"})
    old = f44.model_copy(update={"cuda": f44.cuda.model_copy(update={"host_compiler": old_host})})
    report = run_preflight(
        project,
        old,
        recipe,
        engine=None,
        source=FIXTURE,
        max_jobs=None,
        scratch_dir=tmp_path,
        probe=False,
        gpu_mode="source",
    )
    (gcc,) = [f for f in report.blocking if f.gate == "gcc"]
    assert gcc.found == "GCC 12.4" and gcc.required == "≥ 13"
    assert gcc.remedy.endswith("install GCC 13 or later and declare it as cuda.host_compiler in distros/fedora-44.yaml")


def test_the_build_interpreter_is_python_executable(project: Project, tmp_path: Path) -> None:
    ubi9 = project.distros["ubi-9"]
    assert ubi9.toolchain.python == "3.9" and ubi9.python_executable == "python3.12"
    report = run_preflight(
        project,
        ubi9,
        project.recipe_for("cpu"),
        engine=None,
        source=FIXTURE,
        max_jobs=None,
        scratch_dir=tmp_path,
        probe=False,
    )
    python = report.finding("python")
    assert python is not None and python.passed and python.found == "Python 3.12"
    assert "python_executable" in python.message
