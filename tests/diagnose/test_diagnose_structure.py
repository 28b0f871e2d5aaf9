"""Issue 39: rules read the structure of a message (which tool was killed, which filesystem filled, which
package pins torch), and a log that does not say gets the causes it cannot tell apart, not one guess."""

from __future__ import annotations

import pytest

from builders.diagnose import diagnose_text


@pytest.mark.parametrize(
    ("log", "tool"),
    [
        ("collect2: fatal error: ld terminated with signal 9 [Killed]\ncompilation terminated.\n", "ld"),
        ("c++: fatal error: Killed signal terminated program cc1plus\ncompilation terminated.\n", "cc1plus"),
        ("nvcc error   : 'ptxas' died due to signal 9 (Kill signal)\n", "ptxas"),
        ("g++: internal compiler error: Killed (program cc1plus)\n", "cc1plus"),
        ("collect2: fatal error: ld.gold terminated with signal 9 [Killed]\n", "ld.gold"),
    ],
)
def test_the_answer_names_the_killed_tool(log: str, tool: str) -> None:
    diagnosis = diagnose_text(log)
    assert diagnosis.category == "oom-killed"
    assert diagnosis.subject == tool
    assert diagnosis.subject_label == "killed tool"
    assert not diagnosis.cannot_tell_apart
    assert f"killed tool: {tool}" in diagnosis.render()


def test_a_linker_killed_under_a_rustc_note_still_decides() -> None:
    # rustc quotes the linker's output under `= note:`, which reads as a warning marker.
    diagnosis = diagnose_text("  = note: collect2: fatal error: ld terminated with signal 9 [Killed]\n")
    assert (diagnosis.category, diagnosis.subject) == ("oom-killed", "ld")


@pytest.mark.parametrize(
    ("line", "compiler"),
    [
        (
            "/usr/include/crt/host_config.h:147:2: error: -- unsupported clang version! clang version must be "
            "less than 13 and greater than 3.2 . The nvcc flag '-allow-unsupported-compiler' can be used",
            "clang",
        ),
        (
            r"C:\CUDA\v11.8\include\crt/host_config.h(153): fatal error C1189: #error:  -- unsupported "
            "Microsoft Visual Studio version! Only the versions between 2017 and 2022 (inclusive) are supported!",
            "Microsoft Visual Studio",
        ),
        ("nvcc fatal   : The version ('40000') of the host compiler ('clang') is not supported", "clang"),
        (
            "/usr/local/cuda/include/crt/host_config.h:139:2: error: #error -- unsupported GNU version! gcc "
            "versions later than 9 are not supported!",
            "GNU",
        ),
    ],
)
def test_nvcc_host_compiler_gate_names_the_compiler(line: str, compiler: str) -> None:
    diagnosis = diagnose_text(line + "\n")
    assert diagnosis.category == "gcc-gate"
    assert diagnosis.subject == compiler


@pytest.mark.parametrize(
    "line",
    [
        "Exception: Installed CUDA version 12.3 does not match the version torch was compiled with 12.1, "
        "unable to compile cuda/cpp extensions without a matching cuda version.",
        "RuntimeError: Cuda extensions are being compiled with a version of Cuda that does not match the "
        "version used to compile Pytorch binaries.  Pytorch binaries were compiled with Cuda 11.8.",
        "RuntimeError: The detected CUDA version (12.1) mismatches the version that was used to compile PyTorch "
        "(11.8). Please make sure to use the same CUDA versions.",
    ],
)
def test_cuda_versus_torch_mismatch_in_other_projects_words(line: str) -> None:
    assert diagnose_text(line + "\n").category == "cuda-mismatch"


def test_a_cuda_driver_mismatch_is_not_a_toolkit_versus_torch_mismatch() -> None:
    log = "RuntimeError: CUDA driver version is insufficient for CUDA runtime version\n"
    assert diagnose_text(log).category != "cuda-mismatch"


RESOLVER_LOG = """\
ERROR: Cannot install -r requirements.txt (line 2) and torch==2.0.0 because these package versions have conflicting dependencies.

The conflict is caused by:
    The user requested torch==2.0.0
    torchvision 0.15.1 depends on torch==2.0.0
    xformers 0.0.26.post1 depends on torch==2.3.0

ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/
"""


def test_resolver_failure_names_the_package_whose_exact_pin_conflicts() -> None:
    diagnosis = diagnose_text(RESOLVER_LOG)
    assert diagnosis.category == "torch-pin-conflict"
    # torchvision asks for the torch the user requested: the pin that conflicts is xformers'.
    assert diagnosis.subject == "xformers"
    assert diagnosis.line == "xformers 0.0.26.post1 depends on torch==2.3.0"


def test_a_torch_pin_outside_a_resolver_conflict_is_no_answer() -> None:
    log = "Collecting xformers\nxformers 0.0.26 depends on torch==2.3.0\nERROR: something else failed\n"
    assert diagnose_text(log).category != "torch-pin-conflict"


@pytest.mark.parametrize(
    "line",
    [
        "[3] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left on device",
        "RuntimeError: unable to write to file </torch_8289_606636967_0>: No space left on device (28)",
        "misc/shmutils.cc:88 NCCL WARN Error: failed to extend /dev/shm/nccl-WU88OE to 9637892 bytes, "
        "error: No space left on device (28)",
        "OSError: [Errno 28] No space left on device: '/dev/shm/psm_3c9d1e2f'",
        "RuntimeError: DataLoader worker (pid 46794) is killed by signal: Bus error. It is possible that "
        "dataloader's workers are out of shared memory. Please try to raise your shared memory limit.",
    ],
)
def test_no_space_in_shared_memory_is_not_a_full_disk(line: str) -> None:
    diagnosis = diagnose_text(line + "\n")
    assert diagnosis.category == "shm-too-small"
    assert not diagnosis.cannot_tell_apart


def test_ambiguous_no_space_left_names_both_filesystems_and_the_df_that_tells_them_apart() -> None:
    log = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 12, in <module>\n'
        "    main()\n"
        "OSError: [Errno 28] No space left on device\n"
    )
    diagnosis = diagnose_text(log)
    assert diagnosis.possible_categories == ("disk-full", "shm-too-small")
    assert len(diagnosis.cannot_tell_apart) == 2
    assert "df -h" in diagnosis.remedy and "/dev/shm" in diagnosis.remedy
    assert diagnosis.render().startswith("diagnosis: disk-full or shm-too-small (the log cannot tell which")


@pytest.mark.parametrize(
    "line",
    [
        "cc1plus: fatal error: error writing to /tmp/ccA1b2C3.s: No space left on device",
        "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device",
        "failed to register layer: write /var/lib/docker/overlay2/3f0c/diff/usr/lib/libLLVM.so.15: no space "
        "left on device",
    ],
)
def test_no_space_left_with_a_path_or_a_disk_writer_is_a_full_disk(line: str) -> None:
    diagnosis = diagnose_text(line + "\n")
    assert diagnosis.category == "disk-full"
    assert not diagnosis.cannot_tell_apart


def test_killed_alone_names_the_causes_and_the_dmesg_that_tells_them_apart() -> None:
    log = "[41/120] Building CXX object CMakeFiles/_C.dir/csrc/cpu/attention.cpp.o\nKilled\n"
    diagnosis = diagnose_text(log)
    assert diagnosis.category == "oom-killed"
    assert diagnosis.subject is None
    assert diagnosis.possible_categories == ("oom-killed",)
    assert any("linker" in cause for cause in diagnosis.cannot_tell_apart)
    assert any("compiler" in cause for cause in diagnosis.cannot_tell_apart)
    assert "dmesg" in diagnosis.remedy and "oom" in diagnosis.remedy.lower()


def test_killed_with_the_kernel_saying_why_is_settled() -> None:
    log = "Out of memory: Killed process 4182 (cc1plus) total-vm:9000000kB\nKilled\n"
    diagnosis = diagnose_text(log)
    assert diagnosis.category == "oom-killed"
    assert not diagnosis.cannot_tell_apart
