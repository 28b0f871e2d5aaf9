"""The base-image probe: its script and output format without an engine, then against real Debian bases."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders.bootstrap import ensure_base
from builders.container import Engine
from builders.engines.vllm.probe import ProbeUnavailable, numeric_version, parse_probe_output, probe_base, probe_script
from builders.preflight import PreflightReport, run_preflight
from builders.project import Project

FIXTURE = Path(__file__).parent / "fixtures" / "vllm-0.33.0"

UBUNTU_2204_OUTPUT = """\
FORGE glibc glibc 2.35
Reading package lists...
FORGE pkg gcc 4:11.2.0-1ubuntu1
FORGE dep gcc gcc-11 11.4.0-1ubuntu1~22.04
FORGE pkg g++ 4:11.2.0-1ubuntu1
FORGE dep g++ g++-11 11.4.0-1ubuntu1~22.04
FORGE pkg cmake 3.22.1-1ubuntu1.22.04.2
FORGE pkg python3 3.10.6-1~22.04.1
FORGE pkg libtcmalloc-minimal4 none
FORGE file /usr/include/numa.h yes
FORGE file /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 no
FORGE error files: apt-get download failed
"""


def test_probe_output_follows_metapackages_to_the_real_compiler() -> None:
    result = parse_probe_output("forge/base:ubuntu-22.04", UBUNTU_2204_OUTPUT)
    assert result.version_of(["gcc", "g++"]) == ("11.4.0", "gcc-11 11.4.0-1ubuntu1~22.04")
    assert result.version_of(["cmake"]) == ("3.22.1", "cmake 3.22.1-1ubuntu1.22.04.2")
    assert result.version_of(["absent"]) is None
    assert result.missing(["python3", "libtcmalloc-minimal4"]) == ["libtcmalloc-minimal4"]
    assert result.files == {"/usr/include/numa.h": True, "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4": False}
    assert result.errors == ("files: apt-get download failed",) and not result.archive_trouble
    assert result.glibc == "2.35"
    assert parse_probe_output("x", "FORGE glibc \n").glibc is None  # a base without getconf


@pytest.mark.engine
@pytest.mark.timeout(60, func_only=True)
def test_the_probe_reads_the_bases_own_glibc(project: Project, debian_bases: Engine) -> None:
    d13 = project.distros["debian-13"]
    result = probe_base(debian_bases, d13, device="cpu")
    assert not isinstance(result, ProbeUnavailable), result.reason
    assert result.glibc is not None and result.glibc.startswith(d13.toolchain.glibc)


def test_numeric_versions() -> None:
    assert numeric_version("4:12.2.0-3") == "12.2.0"
    assert numeric_version("14.2.1-1.el9") == "14.2.1"
    assert numeric_version("(none)") is None


def test_probe_scripts_ask_the_family_package_manager(project: Project) -> None:
    deb = probe_script(project.distros["debian-12"], device="cpu")
    assert "apt-cache policy" in deb and "libnuma-dev" in deb and "libtcmalloc-minimal4" in deb
    assert "apt-get install" not in deb  # versions are asked, nothing is unpacked
    ubi = probe_script(project.distros["ubi-9"], device="cpu")
    assert "dnf -q repoquery" in ubi and "gcc-toolset-14-gcc-c++" in ubi and "epel-release" in ubi
    f44 = probe_script(project.distros["fedora-44"], device="cuda")
    assert "gcc14-c++" in f44  # the CUDA host compiler's version is probed too
    assert "getconf GNU_LIBC_VERSION" in f44  # the glibc whose headers nvcc meets


def probed(project: Project, name: str, engine: Engine, scratch: Path) -> PreflightReport:
    """Preflight of `cpu` on a real bootstrapped base, against the vLLM 0.33.0 fixture's gates."""
    distro = project.distros[name]
    return run_preflight(
        project, distro, project.recipe_for("cpu"), engine=engine, source=FIXTURE, max_jobs=None, scratch_dir=scratch
    )


@pytest.fixture(scope="module")
def debian_bases(project: Project, engine: Engine) -> Engine:
    # Debian 14 comes from an archive past its Valid-Until: bootstrapping it here is itself part of what is tested.
    for name in ("debian-12", "debian-13", "debian-14"):
        ensure_base(project.distros[name], engine, allow_pull=False)
    return engine


@pytest.mark.engine
@pytest.mark.timeout(30, func_only=True)
def test_debian_12_probe_blocks_on_gcc_and_cmake(project: Project, debian_bases: Engine, tmp_path: Path) -> None:
    report = probed(project, "debian-12", debian_bases, tmp_path)
    assert report.mode == "probed" and report.probe_image == "forge/base:debian-12"
    blocking = {f.gate: f for f in report.blocking}
    assert blocking["gcc"].found.startswith("GCC 12.2") and blocking["gcc"].required == "≥ 12.3"
    assert blocking["gcc"].source.startswith("cmake/cpu_extension.cmake:")
    assert "probe of forge/base:debian-12" in blocking["gcc"].message
    assert blocking["cmake"].found.startswith("CMake 3.25") and blocking["cmake"].required == "≥ 3.26"
    assert blocking["cmake"].source == "CMakeLists.txt:1"
    for gate in ("numa-headers", "tcmalloc"):
        f = report.finding(gate)
        assert f is not None and f.passed and "archive" in f.message
    agreement = [f for f in report.passed if f.gate == "declared-vs-probed"]
    assert len(agreement) == 3


@pytest.mark.engine
@pytest.mark.timeout(30, func_only=True)
def test_debian_13_probe_clears_gcc_and_cmake(project: Project, debian_bases: Engine, tmp_path: Path) -> None:
    report = probed(project, "debian-13", debian_bases, tmp_path)
    assert report.mode == "probed"
    assert not {f.gate for f in report.blocking} & {"gcc", "cmake", "python", "numa-headers", "tcmalloc", "package"}
    gcc = [f for f in report.passed if f.gate == "gcc"]
    assert gcc and all(f.found.startswith("GCC 14.") for f in gcc)
    assert any(f.source.startswith("cmake/cpu_extension.cmake:") for f in gcc)


@pytest.mark.engine
def test_a_wrong_package_name_is_a_blocking_finding(project: Project, debian_bases: Engine, tmp_path: Path) -> None:
    d12 = project.distros["debian-12"]
    packages = {**d12.packages, "tcmalloc": ("libtcmalloc-minimal9",)}
    broken = d12.model_copy(update={"packages": packages})
    report = run_preflight(
        project,
        broken,
        project.recipe_for("cpu"),
        engine=debian_bases,
        source=FIXTURE,
        max_jobs=None,
        scratch_dir=tmp_path,
    )
    package = next(f for f in report.blocking if f.gate == "package")
    assert "libtcmalloc-minimal9" in package.found and package.source.endswith("packages.tcmalloc")
    tcmalloc = report.finding("tcmalloc")
    assert tcmalloc is not None and tcmalloc.blocking


@pytest.mark.engine
def test_a_base_that_cannot_be_had_runs_on_declared_facts(project: Project, engine: Engine, tmp_path: Path) -> None:
    f44 = project.distros["fedora-44"]
    if engine.image_exists(f44.base.local_tag):
        pytest.skip("a Fedora 44 base is loaded here")
    outcome = probe_base(engine, f44, device="cpu")
    assert isinstance(outcome, ProbeUnavailable) and f44.base.local_tag in outcome.reason
    report = run_preflight(
        project, f44, project.recipe_for("cpu"), engine=engine, source=FIXTURE, max_jobs=None, scratch_dir=tmp_path
    )
    assert report.mode == "declared"
    probe = report.finding("probe")
    assert probe is not None and not probe.passed and "declared facts only" in probe.found
    assert not {f.gate for f in report.blocking} & {"gcc", "cmake"}


@pytest.mark.engine
@pytest.mark.timeout(60, func_only=True)
def test_debian_14_probe_clears_with_the_fedora_44_toolchain(
    project: Project, debian_bases: Engine, tmp_path: Path
) -> None:
    """Debian 14 stands in for Fedora 44 here: its real archive must show GCC 16, CMake 4 and Python 3.14, as
    distros/debian-14.yaml declares, and clear every source gate."""
    report = probed(project, "debian-14", debian_bases, tmp_path)
    assert report.mode == "probed" and report.probe_image == "forge/base:debian-14"
    assert not {f.gate for f in report.blocking} & {"gcc", "cmake", "python", "numa-headers", "tcmalloc", "package"}
    found = {f.gate: f.found for f in report.passed}
    assert found["gcc"].startswith("GCC 16.") and found["cmake"].startswith("CMake 4.")
    assert found["python"] == "Python 3.14"
    disagreements = [f for f in report.findings if f.gate == "declared-vs-probed" and not f.passed]
    assert not disagreements, [f.message for f in disagreements]
