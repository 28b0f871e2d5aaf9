"""How the decisive line is chosen: warnings never decide, context opens gates, the failing step and the end
of the log weigh most, and an unknown answer points at the first real error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builders.diagnose import CONFIDENCE_THRESHOLD, UNKNOWN, Diagnosis, diagnose_file, diagnose_text
from builders.diagnose.diagnosis import read_log
from builders.diagnose.loglines import split_log
from builders.errors import UsageError

NINJA = [f"[{k}/496] Building CXX object CMakeFiles/_C.dir/csrc/cpu/kernel_{k}.cpp.o" for k in range(1, 301)]
GCC_WARNING = (
    "/usr/include/c++/12/bits/stl_algobase.h:431:30: warning: 'void* __builtin_memmove(void*, const void*, long "
    "unsigned int)' writing 1 or more bytes into a region of size 0 overflows the destination [-Wstringop-overflow=]"
)
PIP_TAIL = [
    "  error: subprocess-exited-with-error",
    "  × Building wheel for vllm (pyproject.toml) did not run successfully.",
    "  │ exit code: 1",
    "  ╰─> See above for output.",
    "  note: This error originates from a subprocess, and is likely not a problem with pip.",
    "  ERROR: Failed building wheel for vllm",
    "ERROR: Failed to build one or more wheels",
]


def _log(*parts: list[str] | str) -> str:
    lines: list[str] = []
    for part in parts:
        lines.extend([part] if isinstance(part, str) else part)
    return "\n".join(lines) + "\n"


def _number_of(text: str, needle: str, occurrence: int = 0) -> int:
    hits = [i for i, line in enumerate(text.split("\n"), start=1) if needle in line]
    return hits[occurrence]


def test_a_warning_that_names_a_gate_never_decides() -> None:
    text = _log(
        NINJA[:50],
        '/usr/local/cuda/include/crt/host_config.h:143:2: warning: #warning "unsupported GNU version! gcc '
        'versions later than 14 are not supported!" [-Wcpp]',
        NINJA[50:60],
        "ninja: build stopped: subcommand failed.",
    )
    diagnosis = diagnose_text(text)
    assert diagnosis.category == UNKNOWN
    assert diagnosis.alternatives == ()


def test_gcc_warnings_and_notes_do_not_outvote_a_full_disk() -> None:
    noise = []
    for line in NINJA:
        noise += [
            line,
            GCC_WARNING,
            "gcc: note: the ABI of passing structure with 'complex float' member has changed in GCC 4.4",
        ]
    text = _log(
        "Step 9/12 : RUN pip wheel --no-build-isolation -v . -w dist",
        noise,
        "cc1plus: warning: X86 backend requires gcc/g++ >= 12.3 for AVX512-BF16 [-Wdeprecated]",
        "/usr/bin/ld: final link failed: No space left on device",
        "collect2: error: ld returned 1 exit status",
        "ninja: build stopped: subcommand failed.",
        PIP_TAIL,
    )
    diagnosis = diagnose_text(text)
    assert diagnosis.category == "disk-full"
    assert diagnosis.line_number == _number_of(text, "final link failed")
    assert diagnosis.line == "/usr/bin/ld: final link failed: No space left on device"


def test_cmake_message_body_takes_the_seriousness_of_its_header() -> None:
    as_error = _log(
        "-- The CXX compiler identification is GNU 12.2.0",
        "CMake Error at cmake/cpu_extension.cmake:136 (message):",
        "  X86 backend requires gcc/g++ >= 12.3",
        "Call Stack (most recent call first):",
        "  CMakeLists.txt:175 (include)",
        "-- Configuring incomplete, errors occurred!",
    )
    as_warning = as_error.replace("CMake Error at", "CMake Warning at").replace(
        "-- Configuring incomplete, errors occurred!", "-- Configuring done"
    )
    error = diagnose_text(as_error)
    assert (error.category, error.line_number) == ("gcc-gate", 3)
    assert 2 in error.evidence or 1 in error.evidence
    assert diagnose_text(as_warning).category == UNKNOWN


PIP_NOT_FOUND = [
    "ERROR: Could not find a version that satisfies the requirement {pkg} (from versions: none)",
    "ERROR: No matching distribution found for {pkg}",
]
RETRY = (
    "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection "
    "broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f2a>: Failed to "
    "establish a new connection: [Errno -3] Temporary failure in name resolution')': /simple/{pkg}/"
)
CERT = (
    "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection "
    "broken by 'SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
    "self-signed certificate in certificate chain (_ssl.c:1006)'))': /simple/{pkg}/"
)


@pytest.mark.parametrize(
    ("pkg", "warnings", "expected"),
    [
        ("numpy", [], UNKNOWN),
        ("numpy", [RETRY], "network-fetch"),
        ("torch==2.14.0+cpu", [], "torch-mismatch"),
        ("torch==2.14.0+cpu", [RETRY], "network-fetch"),
        ("torch==2.14.0+cpu", [CERT], "tls-untrusted"),
        ("numpy", [CERT, RETRY], "tls-untrusted"),
    ],
    ids=["bare", "connection-errors", "torch", "torch-connection-errors", "torch-cert", "cert-and-retry"],
)
def test_pip_not_found_means_what_its_context_says(pkg: str, warnings: list[str], expected: str) -> None:
    text = _log(
        "Step 5/9 : RUN pip install -r requirements/build/cpu.txt",
        [w.format(pkg=pkg.split("=")[0]) for w in warnings for _ in range(3)],
        [line.format(pkg=pkg) for line in PIP_NOT_FOUND],
        "The command '/bin/sh -c pip install -r requirements/build/cpu.txt' returned a non-zero code: 1",
    )
    diagnosis = diagnose_text(text)
    assert diagnosis.category == expected
    if expected != UNKNOWN:
        assert "Could not find a version" in (diagnosis.line or "")


def test_buildkit_summary_echo_reports_the_original_line() -> None:
    killed = "c++: fatal error: Killed signal terminated program cc1plus"
    text = _log(
        "#12 [wheel 4/6] RUN pip wheel --no-build-isolation -v . -w dist",
        [f"#12 {10 + k * 0.5:.3f} {line}" for k, line in enumerate(NINJA[:40])],
        f"#12 31.200 {killed}",
        "#12 31.201 compilation terminated.",
        "#12 33.004 ninja: build stopped: subcommand failed.",
        '#12 ERROR: process "/bin/sh -c pip wheel --no-build-isolation -v . -w dist" did not complete successfully: exit code: 1',
        "------",
        " > [wheel 4/6] RUN pip wheel --no-build-isolation -v . -w dist:",
        f"31.200 {killed}",
        "31.201 compilation terminated.",
        "33.004 ninja: build stopped: subcommand failed.",
        "------",
        'ERROR: failed to solve: process "/bin/sh -c pip wheel --no-build-isolation -v . -w dist" did not complete successfully: exit code: 1',
    )
    diagnosis = diagnose_text(text)
    assert diagnosis.category == "oom-killed"
    assert diagnosis.line_number == _number_of(text, killed, 0)
    assert _number_of(text, killed, 1) in diagnosis.evidence


def test_buildkit_only_the_failing_stage_counts_fully() -> None:
    """A sibling stage that printed an error and finished is not why the build failed."""
    text = _log(
        "#7 [base 2/5] RUN pip download torch==2.14.0+cpu -d /wheels || true",
        "#7 1.204 ERROR: No matching distribution found for torch==2.14.0+cpu",
        "#7 DONE 1.3s",
        "",
        "#9 [wheel 3/6] RUN apt-get install -y libnuma-devel",
        "#9 0.412 Reading package lists...",
        "#9 0.980 E: Unable to locate package libnuma-devel",
        '#9 ERROR: process "/bin/sh -c apt-get install -y libnuma-devel" did not complete successfully: exit code: 100',
    )
    diagnosis = diagnose_text(text)
    assert diagnosis.category == UNKNOWN
    assert diagnosis.line == "#9 0.980 E: Unable to locate package libnuma-devel"
    assert [alt.category for alt in diagnosis.alternatives] == ["torch-mismatch"]


TCMALLOC = (
    "ERROR: ld.so: object '/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4' from LD_PRELOAD cannot be "
    "preloaded (cannot open shared object file): ignored."
)


def _legacy_steps(last_step: list[str]) -> str:
    return _log(
        "Step 1/4 : FROM rockylinux:9",
        " ---> 3f2a9c1e7b3d",
        "Step 2/4 : ENV LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
        " ---> Running in 8c1d2e3f4a5b",
        " ---> 9d8c7b6a5f4e",
        "Step 3/4 : RUN dnf install -y numactl-libs",
        " ---> Running in 1a2b3c4d5e6f",
        TCMALLOC,
        "Complete!",
        " ---> 0f9e8d7c6b5a",
        "Step 4/4 : RUN pip wheel --no-build-isolation -v . -w dist",
        " ---> Running in 6f5e4d3c2b1a",
        last_step,
        "The command '/bin/sh -c pip wheel --no-build-isolation -v . -w dist' returned a non-zero code: 1",
    )


def test_noise_seen_in_completed_steps_does_not_hide_a_later_error() -> None:
    error = "/workspace/vllm/csrc/cpu/pos_encoding.cpp:351:11: error: 'rotary_impl' was not declared in this scope"
    text = _legacy_steps([TCMALLOC, *NINJA, error, "ninja: build stopped: subcommand failed.", *PIP_TAIL])
    diagnosis = diagnose_text(text)
    assert diagnosis.category == UNKNOWN
    assert diagnosis.line == error
    assert diagnosis.alternatives[0].category == "tcmalloc-preload"
    # The catch-all's own score at the error line: never above what a named cause needs.
    assert 0.0 < diagnosis.confidence < CONFIDENCE_THRESHOLD
    assert not diagnosis.alternatives[0].close


def test_preload_failure_that_ends_the_build_is_named() -> None:
    text = _legacy_steps(
        [TCMALLOC, TCMALLOC, "INFO 11-29 23:52:41 [__init__.py:216] Automatically detected platform cpu."]
    )
    diagnosis = diagnose_text(text)
    assert diagnosis.category == "tcmalloc-preload"
    assert diagnosis.line_number == _number_of(text, TCMALLOC, 1)  # first occurrence in the failing step


def test_first_error_of_a_parallel_build_beats_later_output() -> None:
    header = "csrc/cpu/utils.cpp:2:12: fatal error: numa.h: No such file or directory"
    text = _log(
        NINJA[:100],
        "FAILED: CMakeFiles/_C.dir/csrc/cpu/utils.cpp.o",
        header,
        "    2 |   #include <numa.h>",
        "      |            ^~~~~~~~",
        "compilation terminated.",
        [line for line in NINJA[100:300] for line in (line, GCC_WARNING)],
        "ninja: build stopped: subcommand failed.",
        PIP_TAIL,
    )
    diagnosis = diagnose_text(text)
    assert (diagnosis.category, diagnosis.line) == ("missing-header", header)
    assert diagnosis.confidence >= CONFIDENCE_THRESHOLD


def test_line_numbers_count_newlines_only_and_ansi_is_removed() -> None:
    text = (
        "Collecting torch\r\n"
        "  Downloading torch.whl\r   1%\r  50%\r 100%\r\n"
        "\x1b[91mc++: fatal error: Killed signal terminated program cc1plus\x1b[0m\r\n"
        "ninja: build stopped: subcommand failed.\r\n"
    )
    diagnosis = diagnose_text(text)
    assert diagnosis.line_number == 3
    assert diagnosis.line == "c++: fatal error: Killed signal terminated program cc1plus"


@pytest.mark.parametrize("text", ["", "\n\n\n", "all good\nreally\n"])
def test_a_log_without_errors_is_unknown_with_no_line(text: str) -> None:
    diagnosis = diagnose_text(text)
    assert (diagnosis.category, diagnosis.line_number, diagnosis.line, diagnosis.confidence) == (
        UNKNOWN,
        None,
        None,
        0.0,
    )


def test_a_very_long_line_is_handled() -> None:
    text = "x" * 3_000_000 + "\nOSError: [Errno 28] No space left on device\n"
    diagnosis = diagnose_text(text)
    assert (diagnosis.category, diagnosis.line_number) == ("disk-full", 2)


def test_json_shape_is_stable() -> None:
    diagnosis = diagnose_text("E: Unable to locate package libnuma-devel\n")
    data = json.loads(diagnosis.to_json())
    assert {"category", "line_number", "line", "cause", "remedy", "confidence", "evidence"} <= set(data)
    assert data == diagnosis.to_dict()
    assert Diagnosis.model_validate(data) == diagnosis


def test_diagnose_file_reads_undecodable_bytes(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    log.write_bytes(b"\xff\xfe garbage\nc++: fatal error: Killed signal terminated program cc1plus\n")
    assert diagnose_file(log).category == "oom-killed"


def test_unreadable_paths_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        read_log(tmp_path / "missing.log")
    with pytest.raises(UsageError, match="is a directory"):
        read_log(tmp_path)


def test_a_specific_rule_keeps_its_line_against_a_generic_one_with_more_context() -> None:
    """/dev/shm full is also 'No space left on device'; disk-full's context must not take the line."""
    text = _log(
        "Step 7/7 : RUN python3 -m vllm.entrypoints.openai.api_server --model /models/tiny & sleep 60",
        " ---> Running in 4c3b2a1f0e9d",
        "INFO 11-29 23:40:02 [__init__.py:216] Automatically detected platform cpu.",
        "WARNING 11-29 23:40:03 [utils.py:81] failed to copy tokenizer cache to /var/lib/docker/tmp, continuing",
        "OSError: [Errno 28] No space left on device: '/dev/shm/psm_3c9d1e2f'",
        "The command '/bin/sh -c python3 -m vllm.entrypoints.openai.api_server' returned a non-zero code: 1",
    )
    diagnosis = diagnose_text(text)
    assert diagnosis.category == "shm-too-small"
    assert diagnosis.line_number == _number_of(text, "/dev/shm/psm_")


def test_two_causes_that_score_alike_are_both_shown() -> None:
    text = _log(
        NINJA[:5],
        "c++: fatal error: Killed signal terminated program cc1plus",
        "/usr/bin/ld: final link failed: No space left on device",
        "ninja: build stopped: subcommand failed.",
    )
    diagnosis = diagnose_text(text)
    assert diagnosis.category == "oom-killed"
    close = [alt for alt in diagnosis.alternatives if alt.close]
    assert [alt.category for alt in close] == ["disk-full"]
    assert diagnosis.confidence - close[0].confidence <= 0.1
    rendered = diagnosis.render()
    assert "or, as likely: disk-full" in rendered and "ran out of" in rendered


def test_a_distant_runner_up_is_not_called_close() -> None:
    text = _log(NINJA[:5], "c++: fatal error: Killed signal terminated program cc1plus", "ninja: build stopped")
    diagnosis = diagnose_text(text)
    assert diagnosis.category == "oom-killed"
    assert not [alt for alt in diagnosis.alternatives if alt.close]
    assert "or, as likely" not in diagnosis.render()


def test_unknown_confidence_is_the_catch_all_score_not_a_certainty() -> None:
    diagnosis = diagnose_text("configuring\nerror: something odd happened\n")
    assert diagnosis.category == UNKNOWN
    assert diagnosis.line_number == 2
    assert 0.0 < diagnosis.confidence < CONFIDENCE_THRESHOLD
    assert f"no known cause reached {CONFIDENCE_THRESHOLD:.2f}" in diagnosis.render()


def test_a_soft_wrapped_message_is_matched_whole_and_reported_at_its_first_line() -> None:
    # An 80-column wrapper cut nvcc's gate after "unsupported"; the neighbouring lines show that width.
    log = (
        "Executing '/usr/local/cuda/bin/nvcc -m64 --host-compilation C -Xcompiler -fPIC'\n"
        "In file included from /usr/local/cuda/bin/../include/cuda_runtime.h:59:0,\n"
        "/usr/local/cuda/bin/../include/host_config.h:82:2: error: #error -- unsupported\n"
        "GNU version! gcc 4.5 and up are not supported!\n"
        "error: command 'nvcc' failed with exit status 1\n"
    )
    lines = split_log(log)
    assert lines[2].text.endswith("unsupported GNU version! gcc 4.5 and up are not supported!")
    assert (lines[3].text, lines[3].continues) == ("", 3)
    diagnosis = diagnose_text(log)
    assert (diagnosis.category, diagnosis.line_number) == ("gcc-gate", 3)


def test_lines_that_end_their_sentence_or_start_a_message_are_not_joined() -> None:
    log = (
        "-- Configuring done, now generating the build files for the project in this directory.\n"
        "CMake Error at CMakeLists.txt:12 (message): something else went wrong in this configure step\n"
        "/usr/include/foo.h:3:1: error: expected ';' before '}' token in this translation unit here\n"
    )
    assert [line.continues for line in split_log(log)] == [None, None, None]


def test_a_compiler_diagnostic_is_read_by_its_structure_in_another_locale() -> None:
    diagnosis = diagnose_text(
        "src/numa_array.cpp:4:10: schwerwiegender Fehler: numa.h: Datei oder Verzeichnis nicht gefunden\n"
        "    4 | #include <numa.h>\n"
        "Kompilierung beendet.\n"
    )
    assert (diagnosis.category, diagnosis.line_number) == ("missing-header", 1)
    warning = diagnose_text("src/a.cpp:4:10: Warnung: numa.h: Datei oder Verzeichnis nicht gefunden\n")
    assert warning.category == UNKNOWN


def test_only_a_rules_warning_patterns_decide_on_a_warning_line() -> None:
    symbol = "WARNING 06-13 11:42:20 _custom_ops.py:11] Failed to import from vllm._C with ImportError('x/_C.abi3.so: "
    assert diagnose_text(symbol + "undefined symbol: _ZN3c104cuda9SetDeviceEi')\n").category == "torch-mismatch"
    assert diagnose_text("WARNING: Could not resolve host: github.com, retrying\n").category == UNKNOWN
