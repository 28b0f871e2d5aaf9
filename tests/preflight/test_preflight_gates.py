"""Every gate as a pure function: real distro files, real vLLM files, facts written into tmp_path."""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path

import pytest

from builders.config.models import Distro, FetchedSource
from builders.engines.vllm import gates
from builders.engines.vllm.source_facts import SourceFacts, read_source_facts
from builders.engines.vllm.torch_index import IndexListing, matching_wheels, parse_listing
from builders.gates import common
from builders.gates.host import GIB, Memory, derive_max_jobs, mount_for, parse_mounts
from builders.project import Project

FIXTURE = Path(__file__).parent / "fixtures" / "vllm-0.33.0"


@pytest.fixture(scope="module")
def facts() -> SourceFacts:
    return read_source_facts(FIXTURE)


def _alternatives(project: Project) -> list[tuple[str, str]]:
    from builders.engines.vllm.preflight import alternatives as order
    from builders.target import Target

    return order(project.distros, Target.resolve(project.distros["debian-12"], project.recipe_for("cpu")))


def test_debian_12_gcc_blocks_citing_the_x86_gate(project: Project, facts: SourceFacts) -> None:
    d12 = project.distros["debian-12"]
    found = gates.gcc_gates(
        facts,
        gcc=d12.gcc,
        gcc_origin="distros/debian-12.yaml: toolchain.gcc",
        device="cpu",
        arch=d12.arch,
        distro_name=d12.name,
        alternatives=_alternatives(project),
    )
    blocking = [f for f in found if f.blocking]
    assert len(blocking) == 1
    (gate,) = blocking
    assert gate.gate == "gcc" and gate.found == "GCC 12.2" and gate.required == "≥ 12.3"
    x86 = next(g for g in facts.compiler_gates if g.file == "cmake/cpu_extension.cmake")
    assert gate.source == f"cmake/cpu_extension.cmake:{x86.line}"
    # The family's stable default first, then its testing release; then a newer compiler of its own.
    assert gate.remedy.startswith("use debian-13 (GCC 14.2) or debian-14 (GCC 16.2)"), gate.remedy
    assert "newer compiler" in gate.remedy
    assert [f.source for f in found if f.passed] == ["CMakeLists.txt:25"]


def test_distros_that_clear_the_cpu_gates(project: Project, facts: SourceFacts) -> None:
    verdicts = {}
    for name in ("debian-13", "fedora-44", "ubi-9", "ubuntu-22.04"):
        d = project.distros[name]
        found = gates.gcc_gates(facts, gcc=d.gcc, gcc_origin="yaml", device="cpu", arch=d.arch, distro_name=name)
        verdicts[name] = any(f.blocking for f in found)
    # UBI 9's system GCC is 11.5, but gcc-toolset-14 (compiler_enable) is what the build uses.
    assert verdicts == {"debian-13": False, "fedora-44": False, "ubi-9": False, "ubuntu-22.04": True}


def test_cmake_gate_blocks_unless_the_recipe_pulls_cmake_from_pip(facts: SourceFacts) -> None:
    block = gates.cmake_gate(facts, cmake="3.25", cmake_origin="yaml", cmake_from_pip=False, recipe_name="vllm-cpu")
    assert block is not None and block.blocking
    assert block.source == "CMakeLists.txt:1" and block.required == "≥ 3.26"
    assert 'pip install "cmake>=3.26.1"' in block.remedy and "cmake_from_pip: true" in block.remedy
    auto = gates.cmake_gate(facts, cmake="3.25", cmake_origin="yaml", cmake_from_pip=True, recipe_name="vllm-cpu")
    assert auto is not None and not auto.blocking and not auto.passed
    assert "applied automatically" in auto.remedy
    ok = gates.cmake_gate(facts, cmake="3.31.6", cmake_origin="probe", cmake_from_pip=False, recipe_name="vllm-cpu")
    assert ok is not None and ok.passed


def test_python_gates(project: Project, facts: SourceFacts) -> None:
    old = gates.python_gates(facts, python="3.10", python_origin="yaml", distro_name="ubuntu-22.04")
    assert {f.gate for f in old if f.blocking} == {"python", "python-cmake"}
    assert next(f for f in old if f.gate == "python").source.startswith("pyproject.toml:")
    new = gates.python_gates(facts, python="3.13", python_origin="yaml", distro_name="debian-13")
    assert all(f.passed for f in new) and len(new) == 2
    too_new = gates.python_gates(facts, python="3.15", python_origin="yaml", distro_name="x")
    assert all(f.blocking for f in too_new)


def _without_host_compiler(distro: Distro) -> Distro:
    assert distro.cuda is not None
    return distro.model_copy(update={"cuda": distro.cuda.model_copy(update={"host_compiler": None})})


def test_fedora_44_gcc_16_without_a_host_compiler_blocks_nvcc(project: Project) -> None:
    f44 = _without_host_compiler(project.distros["fedora-44"])
    assert f44.cuda is not None
    finding = gates.nvcc_host_gcc_gate(
        cuda_version=f44.cuda.version,
        host_gcc=f44.gcc,
        host_gcc_origin="distros/fedora-44.yaml: toolchain.gcc",
        max_major=gates.max_gcc_for_cuda(f44.cuda.version),
        max_source="table",
        family=f44.family,
        distro_name=f44.name,
    )
    assert finding.blocking and finding.gate == "nvcc-host-gcc" and finding.required == "GCC ≤ 15.x (CUDA 13.0)"
    # nvcc 13.0 takes up to GCC 15: the remedy names that compat compiler; the gcc14 fedora-44.yaml declares
    # (an older one) is of the same form.
    assert "gcc15 gcc15-c++" in finding.remedy and "CUDAHOSTCXX=/usr/bin/g++-15" in finding.remedy


def test_fedora_44_with_its_gcc14_host_compiler_passes(project: Project, facts: SourceFacts) -> None:
    f44 = project.distros["fedora-44"]
    assert f44.cuda is not None and f44.cuda.host_compiler is not None
    host_gcc = f44.cuda.host_compiler.gcc
    nvcc = gates.nvcc_host_gcc_gate(
        cuda_version=f44.cuda.version,
        host_gcc=host_gcc,
        host_gcc_origin="yaml",
        max_major=gates.max_gcc_for_cuda(f44.cuda.version),
        max_source="table",
        family=f44.family,
        distro_name=f44.name,
    )
    assert nvcc.passed
    vllm = gates.gcc_gates(facts, gcc=host_gcc, gcc_origin="yaml", device="cuda", arch="x86_64", distro_name=f44.name)
    assert vllm and all(f.passed for f in vllm)


def test_vllm_cuda_gate_needs_gcc_13(facts: SourceFacts) -> None:
    found = gates.gcc_gates(
        facts,
        gcc="12.4",
        gcc_origin="yaml",
        device="cuda",
        arch="x86_64",
        distro_name="x",
        alternatives=[("fedora-44", "14.3"), ("ubuntu-22.04", "11.4"), ("x", "12.4")],
        compiler_key="cuda.host_compiler",
    )
    (block,) = [f for f in found if f.blocking]
    assert block.required == "≥ 13" and block.source.startswith("CMakeLists.txt:")
    # The distro that passes is offered, the one that does not and the distro itself are not; the key named is the
    # one a CUDA build's compiler is declared under.
    assert block.remedy == (
        "use fedora-44 (GCC 14.3), or a newer compiler: install GCC 13 or later and declare it as "
        "cuda.host_compiler in distros/x.yaml"
    )


# The shape of nvcc 13.0's crt/host_config.h around its GCC check: an earlier __GNUC__ comparison that is not
# the limit, then the guard whose #error names it.
HOST_CONFIG_13_0 = """\
#if defined(__GNUC__)
#if __GNUC__ > 3 || (__GNUC__ == 3 && __GNUC_MINOR__ >= 3)
#define __CUDA_GNUC_ATTRIBUTES 1
#endif
#if __GNUC__ > 15

#error -- unsupported GNU version! gcc versions later than 15 are not supported! The nvcc flag \
'-allow-unsupported-compiler' can be used to override this version check.

#endif /* __GNUC__ > 15 */
#endif /* __GNUC__ */
"""


def test_nvcc_limit_from_host_config_and_table(tmp_path: Path) -> None:
    header = tmp_path / "host_config.h"
    header.write_text(HOST_CONFIG_13_0)
    assert gates.max_gcc_from_host_config(header.read_text()) == 15
    assert gates.max_gcc_from_host_config("#if __GNUC__ > 12\n#endif\n") == 12  # no #error: the first guard
    assert gates.max_gcc_from_host_config("nothing here") is None
    assert gates.max_gcc_for_cuda("12.4") == 13
    assert gates.max_gcc_for_cuda("12.9") == 14
    assert gates.max_gcc_for_cuda("13.0") == 15  # nvcc 13.0's host_config.h: `#if __GNUC__ > 15`
    assert gates.max_gcc_for_cuda("13.2") == 15
    assert gates.max_gcc_for_cuda("10.2") is None
    unknown = gates.nvcc_host_gcc_gate(
        cuda_version="10.2",
        host_gcc="9",
        host_gcc_origin="y",
        max_major=None,
        max_source="table",
        family="debian",
        distro_name="x",
    )
    assert not unknown.passed and not unknown.blocking


def _pep691(tmp_path: Path, names: list[str]) -> IndexListing:
    page = tmp_path / "torch.json"
    page.write_text(
        json.dumps(
            {
                "meta": {"api-version": "1.1"},
                "name": "torch",
                "files": [{"filename": n, "url": n, "hashes": {}} for n in names],
            }
        )
    )
    files = parse_listing(page.read_text(), "application/vnd.pypi.simple.v1+json")
    return IndexListing(url="https://pypi.org/simple/torch/", reachable=True, files=tuple(files))


def test_torch_wheel_gate_against_a_pep691_page(tmp_path: Path) -> None:
    listing = _pep691(
        tmp_path,
        [
            "torch-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl",
            "torch-2.14.0-cp312-cp312-manylinux_2_28_x86_64.whl",
            "torch-2.14.0-cp313-cp313-manylinux_2_28_aarch64.whl",
            "torch-2.13.0-cp313-cp313-manylinux_2_28_x86_64.whl",
        ],
    )
    gate = partial(
        gates.torch_wheel_gate,
        pin_source="requirements/build/cpu.txt:7",
        arch="x86_64",
        index_name="pypi",
        listing=listing,
        recipe_name="vllm-cpu",
    )
    ok = gate(version="2.14.0", python="3.11", glibc="2.36")
    assert ok.passed and "cp311" in ok.found
    wrong_python = gate(version="2.14.0", python="3.13")
    assert wrong_python.blocking and "cp311" in wrong_python.found and "cp312" in wrong_python.found
    local_label = gate(version="2.14.0+cpu", python="3.11")
    assert local_label.blocking and "no torch 2.14.0+cpu" in local_label.found
    old_glibc = gate(version="2.14.0", python="3.11", glibc="2.17")
    assert old_glibc.blocking


def test_unreachable_index_warns_and_never_passes() -> None:
    listing = IndexListing(
        url="https://download.pytorch.org/whl/cpu/torch/", reachable=False, error="cannot resolve download.pytorch.org"
    )
    finding = gates.torch_wheel_gate(
        version="2.14.0+cpu",
        pin_source="requirements/build/cpu.txt:7",
        python="3.13",
        arch="x86_64",
        index_name="pytorch-cpu",
        listing=listing,
        recipe_name="vllm-cpu",
    )
    assert not finding.passed and not finding.blocking
    assert "unreachable" in finding.found and "not checked" in finding.remedy


def test_wheel_matching_follows_pip() -> None:
    files = [
        "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
        "torch-2.13.0-cp311-cp311-win_amd64.whl",
        "other-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl",
    ]
    # ==2.13.0 admits the +cpu local version, as pip does.
    assert matching_wheels(files, project="torch", version="2.13.0", python="3.11", arch="x86_64") == [files[0]]
    assert matching_wheels(files, project="torch", version="2.13.0+cu130", python="3.11", arch="x86_64") == []
    html = '<a href="https://x/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl#sha256=ab">t</a>'
    assert parse_listing(html, "text/html") == ["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"]


def test_file_gates_in_each_mode() -> None:
    gate = partial(
        gates.file_gate,
        gate="numa-headers",
        path="/usr/include/numa.h",
        packages=["libnuma-dev"],
        origin="forge/base:debian-12",
        yaml_key="packages.numa_headers",
        distro_name="debian-12",
    )
    assert gate(present=True).passed
    missing = gate(present=False)
    assert missing.blocking and missing.source == "distros/debian-12.yaml: packages.numa_headers"
    # Not probed: nobody looked for the file, so the gate is not evaluated (never passed).
    declared = gate(present=None)
    assert not declared.passed and not declared.evaluated and declared.verdict == "skip"
    assert "not probed" in declared.found and "forge bootstrap debian-12" in declared.remedy


def test_disk_gate() -> None:
    low = common.disk_gate(
        gate="disk-scratch", where="/x", free=GIB, need_gb=4, need_source="recipes/r.yaml: x", remedy="more"
    )
    assert low.blocking and low.found.startswith("1.0 GiB")
    assert common.disk_gate(gate="disk-scratch", where="/x", free=5 * GIB, need_gb=4, need_source="s", remedy="").passed


MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
tmpfs /tmp tmpfs rw,nosuid,nodev,size=12341234k,nr_inodes=1048576 0 0
tmpfs /var/tmp/small\\040dir tmpfs rw,size=65536k 0 0
/dev/vdb /var/lib/docker xfs rw 0 0
"""


def test_tmpfs_scratch_is_found_and_judged(tmp_path: Path) -> None:
    mounts = parse_mounts(MOUNTS)
    assert mounts[2].mountpoint == "/var/tmp/small dir" and mounts[2].size_bytes == 64 * 1024**2
    on_tmp = mount_for(Path("/tmp/forge/build"), mounts)
    assert on_tmp is not None and on_tmp.mountpoint == "/tmp"
    big = common.tmpfs_gate(
        scratch_dir=Path("/tmp/forge"), mount=on_tmp, need_gb=4, mem_total=24 * GIB, need_source="s"
    )
    assert not big.passed and not big.blocking and "RAM" in big.found
    small = common.tmpfs_gate(
        scratch_dir=Path("/var/tmp/small dir"), mount=mounts[2], need_gb=4, mem_total=24 * GIB, need_source="s"
    )
    assert small.blocking and "/var/tmp/forge" in small.remedy
    disk = common.tmpfs_gate(
        scratch_dir=Path("/var/lib/docker"), mount=mounts[3], need_gb=4, mem_total=GIB, need_source="s"
    )
    assert disk.passed and "xfs" in disk.found


def test_ram_gate_and_derived_jobs() -> None:
    mem = Memory(available=10 * GIB, total=16 * GIB, source="host /proc/meminfo MemAvailable")
    assert derive_max_jobs(10 * GIB, 16, 3.0) == 3
    assert derive_max_jobs(10 * GIB, 2, 3.0) == 2
    assert derive_max_jobs(GIB, 8, 3.0) == 1
    ok = common.ram_gate(memory=mem, max_jobs=3, jobs_origin="derived", per_job_gb=3, per_job_source="r", cores=16)
    assert ok.passed
    too_many = common.ram_gate(
        memory=mem, max_jobs=8, jobs_origin="--max-jobs", per_job_gb=3, per_job_source="r", cores=16
    )
    assert too_many.blocking and "--max-jobs 3" in too_many.remedy
    tmpfs_eats = common.ram_gate(
        memory=mem,
        max_jobs=3,
        jobs_origin="derived",
        per_job_gb=3,
        per_job_source="r",
        cores=16,
        reserved=4 * GIB,
        reserved_why="the tmpfs scratch dir",
    )
    assert tmpfs_eats.blocking and "--max-jobs 2" in tmpfs_eats.remedy


AVX512_HOST = frozenset(
    {"fpu", "sse2", "avx", "avx2", "f16c", "avx512f", "avx512vl", "avx512bw", "avx512dq", "avx512_bf16"}
)
AVX2_HOST = frozenset({"fpu", "sse2", "avx", "avx2", "f16c"})


def test_isa_gate_warns_when_the_run_host_lacks_instructions() -> None:
    isa_gate = partial(gates.isa_gate, arch="x86_64", recipe_name="vllm-cpu", serve_test=True)
    fat = isa_gate(
        isa={"VLLM_CPU_AVX512": "1", "VLLM_CPU_AVX512BF16": "true"},
        build_flags=AVX512_HOST,
        run_flags=AVX2_HOST,
        run_source="runhost.txt",
    )
    assert not fat.passed and not fat.blocking and "avx512f" in fat.found and "avx512_bf16" in fat.found
    portable = isa_gate(
        isa={"VLLM_CPU_X86": "1", "VLLM_CPU_AVX512": "0"},
        build_flags=AVX512_HOST,
        run_flags=AVX2_HOST,
        run_source="runhost.txt",
    )
    assert portable.passed and portable.required == "avx2 f16c"
    build_lacks = isa_gate(
        isa={"VLLM_CPU_AVX512": "1"}, build_flags=AVX2_HOST, run_flags=AVX512_HOST, run_source="runhost.txt"
    )
    assert not build_lacks.passed and "build host" in build_lacks.found
    unknown = isa_gate(isa={"VLLM_CPU_AVX10": "1"}, build_flags=AVX512_HOST, run_flags=AVX512_HOST, run_source="x")
    assert not unknown.passed and "VLLM_CPU_AVX10" in unknown.remedy


def test_fetched_source_gate(facts: SourceFacts, tmp_path: Path) -> None:
    deps = facts.fetched_for("cpu", "x86_64")
    staged = FetchedSource(name="onednn", cmake_var="FETCHCONTENT_SOURCE_DIR_ONEDNN", pinned_in="cmake/x")
    here = {"onednn": "debian-source: onednn 3.13"}
    (ok,) = gates.fetched_source_gates(deps, [staged], "vllm-cpu", staged=here)
    assert ok.passed and "debian-source: onednn 3.13" in ok.found
    # Declared in the recipe but with no local copy yet: not a pass, and the remedy is the command that stages it.
    (absent,) = gates.fetched_source_gates(
        deps, [staged], "vllm-cpu", staged={}, fetch_command="forge fetch debian-12 cpu"
    )
    assert not absent.passed and not absent.blocking and "forge fetch debian-12 cpu onednn" in absent.remedy
    (missing,) = gates.fetched_source_gates(deps, [], "vllm-cpu", staged=here)
    assert not missing.passed and not missing.blocking and "fetched_sources" in missing.remedy
    # A release that stops reading the override from the environment would silently ignore the staged copy.
    root = tmp_path / "vllm-9"
    shutil.copytree(FIXTURE, root)
    ext = root / "cmake" / "cpu_extension.cmake"
    ext.write_text(ext.read_text().replace('"$ENV{FETCHCONTENT_SOURCE_DIR_ONEDNN}"', '""'))
    later = read_source_facts(root).fetched_for("cpu", "x86_64")
    (ignored,) = gates.fetched_source_gates(later, [staged], "vllm-cpu", staged=here)
    assert not ignored.passed and "CMAKE_ARGS" in ignored.remedy


def test_declared_vs_probed() -> None:
    out = gates.declared_vs_probed(
        distro_name="ubuntu-22.04",
        declared={"toolchain.gcc": "11.4", "toolchain.cmake": "3.22", "toolchain.python": "3.10"},
        probed={"toolchain.gcc": ("11.2.0", "gcc 4:11.2.0-1"), "toolchain.cmake": ("3.22.1", "cmake 3.22.1-1")},
    )
    by_key = {f.source.split(": ")[1]: f for f in out}
    assert set(by_key) == {"toolchain.gcc", "toolchain.cmake"}
    assert by_key["toolchain.cmake"].passed
    gcc = by_key["toolchain.gcc"]
    assert not gcc.passed and not gcc.blocking and "11.2" in gcc.remedy


@pytest.mark.parametrize(
    ("cuda", "glibc", "fix", "verdict"),
    [
        ("13.0", "2.43", False, "block"),  # Fedora 44 without the fix: every .cu stops at the rsqrt clash
        ("13.0", "2.42", False, "block"),  # the first glibc declaring rsqrt/rsqrtf
        ("13.0", "2.43", True, "pass"),  # the build patches math_functions.h first
        ("13.0", "2.41", False, "pass"),  # Debian 13: no rsqrt in its headers
        ("12.8", "2.43", False, "block"),  # older toolkits declare them the same way
        ("13.1", "2.43", False, "pass"),
        ("13.0", "unknown", False, "skip"),  # versions not understood: not evaluated, never passed
    ],
)
def test_glibc_rsqrt_gate(cuda: str, glibc: str, fix: bool, verdict: str) -> None:
    finding = gates.glibc_rsqrt_gate(
        cuda_version=cuda, glibc=glibc, glibc_origin="yaml", fix_declared=fix, distro_name="fedora-44"
    )
    assert finding.gate == "cuda-glibc-rsqrt" and finding.verdict == verdict
    # The citation names both headers, and the message the error nvcc would print.
    assert "crt/math_functions.h" in finding.source and "bits/mathcalls.h" in finding.source
    if verdict == "block":
        assert 'exception specification is incompatible with that of previous function "rsqrt"' in finding.message
        assert "cuda.glibc_rsqrt_fix in distros/fedora-44.yaml" in finding.remedy


def test_the_rsqrt_gate_follows_the_distro_files(project: Project) -> None:
    """Each GPU distro's declared glibc against its CUDA: only Fedora 44 (glibc 2.43) needs, and has, the fix."""
    verdicts = {}
    for distro in project.distros.values():
        if distro.cuda is None:
            continue
        finding = gates.glibc_rsqrt_gate(
            cuda_version=distro.cuda.version,
            glibc=distro.toolchain.glibc,
            glibc_origin="yaml",
            fix_declared=distro.cuda.glibc_rsqrt_fix,
            distro_name=distro.name,
        )
        needs = gates.glibc_rsqrt_gate(
            cuda_version=distro.cuda.version,
            glibc=distro.toolchain.glibc,
            glibc_origin="yaml",
            fix_declared=False,
            distro_name=distro.name,
        )
        verdicts[distro.name] = (finding.verdict, needs.verdict)
    assert verdicts["fedora-44"] == ("pass", "block")
    assert verdicts["ubuntu-24.04"] == verdicts["ubi-9"] == ("pass", "pass")
