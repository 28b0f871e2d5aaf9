"""Reading vLLM's gates from its source: real files, and modified copies standing in for a later release."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest

from builders.engines.vllm.cmake_script import condition_terms, locate, tokenize
from builders.engines.vllm.source_facts import SourceFacts, read_source_facts
from builders.errors import SourceUnavailable

FIXTURE = Path(__file__).parent / "fixtures" / "vllm-0.33.0"


def _line(rel: str, number: int, root: Path = FIXTURE) -> str:
    return (root / rel).read_text().splitlines()[number - 1]


def _copy(tmp_path: Path, name: str = "vllm-0.34.0") -> Path:
    dest = tmp_path / name
    shutil.copytree(FIXTURE, dest)
    return dest


@pytest.fixture(scope="module")
def facts() -> SourceFacts:
    return read_source_facts(FIXTURE)


def test_gcc_gates_are_cited_by_the_line_of_their_fatal_error(facts: SourceFacts) -> None:
    by_file = {(g.file, g.specifier): g for g in facts.compiler_gates}
    x86 = by_file[("cmake/cpu_extension.cmake", ">=12.3")]
    assert "message(FATAL_ERROR" in _line(x86.file, x86.line)
    assert "X86 backend requires gcc/g++ >= 12.3" in x86.message
    assert x86.source == f"cmake/cpu_extension.cmake:{x86.line}"
    every = by_file[("CMakeLists.txt", ">=11.3")]
    assert "message(FATAL_ERROR" in _line(every.file, every.line)
    cuda = by_file[("CMakeLists.txt", ">=13")]
    assert "with CUDA" in cuda.message
    assert len(facts.compiler_gates) == 3


def test_gate_scope_follows_the_enclosing_conditions(facts: SourceFacts) -> None:
    def sources(device: str, arch: str) -> set[str]:
        return {f"{g.file}:{g.specifier}" for g in facts.gates_for(device, arch)}

    assert sources("cpu", "x86_64") == {"CMakeLists.txt:>=11.3", "cmake/cpu_extension.cmake:>=12.3"}
    # The x86 gate sits under `CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|amd64" OR ENABLE_X86_ISA`.
    assert sources("cpu", "aarch64") == {"CMakeLists.txt:>=11.3"}
    assert sources("cuda", "x86_64") == {"CMakeLists.txt:>=11.3", "CMakeLists.txt:>=13"}
    x86 = next(g for g in facts.compiler_gates if g.file == "cmake/cpu_extension.cmake")
    assert x86.scope.label == "x86 CPU"
    assert x86.admits("12.3") and x86.admits("14.2.0") and not x86.admits("12.2.0")


def test_cmake_python_and_version(facts: SourceFacts) -> None:
    assert facts.cmake_minimum is not None and facts.cmake_minimum.value == "3.26"
    assert "cmake_minimum_required" in _line("CMakeLists.txt", facts.cmake_minimum.line)
    assert facts.cmake_requirement is not None and facts.cmake_requirement.value == "cmake>=3.26.1"
    assert '"cmake>=3.26.1"' in _line("pyproject.toml", facts.cmake_requirement.line)
    assert facts.requires_python is not None and facts.requires_python.value == ">=3.11,<3.15"
    assert "requires-python" in _line("pyproject.toml", facts.requires_python.line)
    assert facts.python_supported is not None and facts.python_supported.value.split() == [
        "3.11",
        "3.12",
        "3.13",
        "3.14",
    ]
    assert facts.vllm_version == "0.33.0"


def test_torch_pins_honour_markers(facts: SourceFacts) -> None:
    x86 = facts.pins_for("cpu", arch="x86_64", python="3.11")
    assert {(p.kind, p.version, p.file) for p in x86} == {
        ("build", "2.14.0+cpu", "requirements/build/cpu.txt"),
        ("runtime", "2.14.0+cpu", "requirements/cpu.txt"),
    }
    for pin in x86:
        assert pin.requirement.split(";")[0].strip() in _line(pin.file, pin.line)
    power = facts.pins_for("cpu", arch="ppc64le", python="3.12")
    assert {p.version for p in power} == {"2.14.0"}
    cuda = facts.pins_for("cuda", arch="x86_64", python="3.12")
    assert [(p.version, p.file) for p in cuda] == [("2.14.0", "requirements/cuda.txt")]
    assert any(p.file == "pyproject.toml" and p.version == "2.14.0" for p in facts.torch_pins)


def test_fetched_onednn_for_x86_and_its_override(facts: SourceFacts) -> None:
    x86 = facts.fetched_for("cpu", "x86_64")
    assert [(d.name, d.tag) for d in x86] == [("oneDNN", "v3.13")]
    dep = x86[0]
    assert "GIT_TAG" in _line(dep.file, dep.line) or "FetchContent_Declare" in _line(dep.file, dep.line)
    assert dep.override_var == "FETCHCONTENT_SOURCE_DIR_ONEDNN"
    assert dep.override_honoured_at is not None
    file, line = dep.override_honoured_at.split(":")
    assert "$ENV{FETCHCONTENT_SOURCE_DIR_ONEDNN}" in _line(file, int(line))
    arm = {d.name: d.tag for d in facts.fetched_for("cpu", "aarch64")}
    assert arm["oneDNN"] != "v3.13" and "arm_compute" in arm
    # CUTLASS's tag is a variable set a few lines above its FetchContent_Declare.
    cuda = facts.fetched_for("cuda", "x86_64")
    assert [d.name for d in cuda] == ["cutlass"]
    assert cuda[0].tag is not None and "${" not in cuda[0].tag


def test_a_release_that_moves_the_numbers_moves_the_gates(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    ext = root / "cmake" / "cpu_extension.cmake"
    text = ext.read_text()
    assert text.count("VERSION_GREATER_EQUAL 12.3") == 1
    text = text.replace("VERSION_GREATER_EQUAL 12.3", "VERSION_GREATER_EQUAL 13.1")
    text = text.replace('requires gcc/g++ >= 12.3"', 'requires gcc/g++ >= 13.1"')
    text = "# two lines more\n# above the gate\n" + text.replace("GIT_TAG        v3.13", "GIT_TAG        v3.14")
    ext.write_text(text)
    top = root / "CMakeLists.txt"
    top.write_text(
        top.read_text().replace("cmake_minimum_required(VERSION 3.26)", "cmake_minimum_required(VERSION 3.28...3.31)")
    )
    py = root / "pyproject.toml"
    py.write_text(py.read_text().replace('requires-python = ">=3.11,<3.15"', 'requires-python = ">=3.12,<3.15"'))
    req = root / "requirements" / "build" / "cpu.txt"
    req.write_text(req.read_text().replace("torch==2.14.0+cpu", "torch==2.15.1+cpu"))

    old, new = read_source_facts(FIXTURE), read_source_facts(root)
    old_x86 = next(g for g in old.compiler_gates if g.file == "cmake/cpu_extension.cmake")
    new_x86 = next(g for g in new.compiler_gates if g.file == "cmake/cpu_extension.cmake")
    assert new_x86.specifier == ">=13.1" and new_x86.line == old_x86.line + 2
    assert not new_x86.admits("12.3") and new_x86.admits("13.1")
    assert new.cmake_minimum is not None and new.cmake_minimum.value == "3.28"
    assert new.requires_python is not None and new.requires_python.value == ">=3.12,<3.15"
    assert [p.version for p in new.pins_for("cpu", arch="x86_64", python="3.12") if p.kind == "build"] == ["2.15.1+cpu"]
    assert [d.tag for d in new.fetched_for("cpu", "x86_64")] == ["v3.14"]
    assert new.vllm_version == "0.34.0"


def test_gate_read_from_condition_when_message_is_vague(tmp_path: Path) -> None:
    """The condition decides, not the wording: NOT(... VERSION_GREATER_EQUAL x) and VERSION_LESS x both mean ≥ x."""
    root = _copy(tmp_path)
    (root / "cmake" / "cpu_extension.cmake").write_text(
        'if (CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|amd64")\n'
        "  if(CMAKE_CXX_COMPILER_VERSION VERSION_LESS 14.1)\n"
        '    message(FATAL_ERROR "your compiler is too old")\n'
        "  endif()\n"
        "else()\n"
        "  if(CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 16)\n"
        '    message(FATAL_ERROR\n      "compiler too new "\n      "for this arch")\n'
        "  endif()\n"
        "endif()\n"
    )
    facts = read_source_facts(root)
    gates = {g.specifier: g for g in facts.compiler_gates if g.file == "cmake/cpu_extension.cmake"}
    assert set(gates) == {">=14.1", "<16"}
    assert gates[">=14.1"].line == 3 and gates[">=14.1"].scope.applies("cpu", "x86_64")
    assert gates["<16"].line == 7 and gates["<16"].message == "compiler too new for this arch"
    assert gates["<16"].scope.applies("cpu", "aarch64") and not gates["<16"].scope.applies("cpu", "x86_64")


def test_sdist_is_read_without_unpacking(tmp_path: Path) -> None:
    sdist = tmp_path / "vllm-0.33.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(FIXTURE, arcname="vllm-0.33.0")
    from_tar = read_source_facts(sdist)
    from_dir = read_source_facts(FIXTURE)
    assert from_tar.compiler_gates == from_dir.compiler_gates
    assert from_tar.torch_pins == from_dir.torch_pins
    assert from_tar.vllm_version == "0.33.0"
    assert list(tmp_path.iterdir()) == [sdist]


def test_pkg_info_version_wins_over_the_name(tmp_path: Path) -> None:
    root = _copy(tmp_path, "checkout")
    (root / "PKG-INFO").write_text("Metadata-Version: 2.4\nName: vllm\nVersion: 0.35.0rc1\n\nlong description\n")
    facts = read_source_facts(root)
    assert facts.vllm_version == "0.35.0rc1" and facts.version_source == "PKG-INFO:3"


def test_bad_sources_say_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable, match="does not exist"):
        read_source_facts(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceUnavailable, match=r"no top-level CMakeLists\.txt") as err:
        read_source_facts(tmp_path / "empty")
    assert err.value.hint is not None and "sdist" in err.value.hint
    junk = tmp_path / "vllm-1.0.tar.gz"
    junk.write_bytes(b"not a tarball")
    with pytest.raises(SourceUnavailable, match="neither a directory"):
        read_source_facts(junk)


def test_cmake_not_covers_the_following_term_only() -> None:
    (cmd,) = tokenize('if(NOT A STREQUAL "x" AND (B OR NOT C) AND NOT (D VERSION_LESS 1.2 OR E))\nendif()')[:1]
    terms = {t.left: t.negated for t in condition_terms(cmd.args)}
    assert terms == {"A": True, "B": False, "C": True, "D": True, "E": True}


def test_cmake_tokenizer_handles_comments_strings_and_else() -> None:
    text = (
        '# message(FATAL_ERROR "commented out")\n'
        "if(X) # trailing ) comment\n"
        '  set(V "a (paren) # not a comment")\n'
        "elseif(Y)\n"
        "  #[[ bracket\n  comment ]] set(W 1)\n"
        "else()\n"
        "  set(Z 2)\n"
        "endif()\n"
    )
    items = {i.command.words()[0]: i for i in locate(tokenize(text))}
    assert set(items) == {"V", "W", "Z"}
    assert items["V"].command.words()[1] == "a (paren) # not a comment"
    assert items["W"].command.line == 6
    (z_branch,) = items["Z"].branches
    assert [t.left for t in z_branch.effective_terms()] == ["X", "Y"]
    assert all(t.negated for t in z_branch.effective_terms())
