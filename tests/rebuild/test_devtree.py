"""The planner splits a real tree into requirements, compiler inputs and package; each edit moves only its part's
hash, and a later build can name the files that changed."""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path

import pytest

from builders.engines.vllm.devtree import VLLM_LAYOUT
from builders.errors import SourceUnavailable, UsageError
from builders.project import Project
from builders.rebuild.devtree import TreeLayout, changed_files, matches, split_tree, stage_parts
from builders.sources import resolve_sdist

ENV = {"MAX_JOBS": "4", "VLLM_TARGET_DEVICE": "cpu"}


def _tree(root: Path) -> Path:
    """A small tree shaped like vLLM's: what each part holds is known file by file."""
    files = {
        "setup.py": "print('build')\n",
        "pyproject.toml": "[build-system]\n",
        "CMakeLists.txt": "project(x)\n",
        "cmake/utils.cmake": "# cmake\n",
        "csrc/cpu/attn.cpp": "int attn() { return 1; }\n",
        "csrc/ops.h": "int attn();\n",
        "requirements/cpu.txt": "-r common.txt\nnumpy\n",
        "requirements/common.txt": "requests\n",
        "requirements/build/cpu.txt": "cmake>=3.26\n",
        "vllm/__init__.py": "",
        "vllm/envs.py": "MAX_JOBS = None\n",
        "vllm/engine/core.py": "def run(): pass\n",
        "tests/test_core.py": "def test(): pass\n",
        "docs/index.md": "# docs\n",
        "vllm/__pycache__/core.cpython-311.pyc": "bytecode",
        "build/temp.linux/attn.o": "object",
        "vllm/_C.abi3.so": "the host's own in-place build",
        ".git/HEAD": "ref: refs/heads/main\n",
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_each_part_holds_its_files_and_nothing_else(tmp_path: Path) -> None:
    split = split_tree(_tree(tmp_path), VLLM_LAYOUT)
    assert sorted(split.requirements) == [
        "requirements/build/cpu.txt",
        "requirements/common.txt",
        "requirements/cpu.txt",
    ]
    assert sorted(split.compiler_inputs) == [
        "CMakeLists.txt",
        "cmake/utils.cmake",
        "csrc/cpu/attn.cpp",
        "csrc/ops.h",
        "pyproject.toml",
        "setup.py",
        "vllm/envs.py",
    ]
    # envs.py is read by setup.py and ships: in both parts. Bytecode, build/, .git, tests and docs: in none.
    assert sorted(split.package) == ["vllm/__init__.py", "vllm/engine/core.py", "vllm/envs.py"]


def test_a_python_edit_moves_only_the_package_hash(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    before = split_tree(root, VLLM_LAYOUT)
    (root / "vllm/engine/core.py").write_text("def run(): return 1\n")
    after = split_tree(root, VLLM_LAYOUT)
    assert after.package_hash != before.package_hash
    assert after.requirements_hash == before.requirements_hash
    assert after.compiler_input_hash(ENV, "gcc 12.2") == before.compiler_input_hash(ENV, "gcc 12.2")
    assert changed_files(before.package, after.package) == ["~vllm/engine/core.py"]


def test_a_cpp_edit_moves_only_the_compiler_input_hash(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    before = split_tree(root, VLLM_LAYOUT)
    (root / "csrc/cpu/attn.cpp").write_text("int attn() { return 2; }\n")
    after = split_tree(root, VLLM_LAYOUT)
    assert after.compiler_input_hash(ENV, "gcc 12.2") != before.compiler_input_hash(ENV, "gcc 12.2")
    assert (after.package_hash, after.requirements_hash) == (before.package_hash, before.requirements_hash)
    assert changed_files(before.compiler_inputs, after.compiler_inputs) == ["~csrc/cpu/attn.cpp"]


def test_a_requirements_edit_moves_only_the_requirements_hash(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    before = split_tree(root, VLLM_LAYOUT)
    (root / "requirements/common.txt").write_text("requests\nhttpx\n")
    after = split_tree(root, VLLM_LAYOUT)
    assert after.requirements_hash != before.requirements_hash
    assert after.package_hash == before.package_hash
    assert after.compiler_input_hash(ENV, "t") == before.compiler_input_hash(ENV, "t")


def test_environment_and_toolchain_are_folded_into_the_compiler_input_hash(tmp_path: Path) -> None:
    split = split_tree(_tree(tmp_path), VLLM_LAYOUT)
    base = split.compiler_input_hash(ENV, "gcc 12.2")
    assert split.compiler_input_hash({**ENV, "VLLM_CPU_AVX512BF16": "1"}, "gcc 12.2") != base
    assert split.compiler_input_hash(ENV, "gcc 13.1") != base
    # Order of the environment is no input: the same dict built the other way round hashes the same.
    assert split.compiler_input_hash(dict(reversed(list(ENV.items()))), "gcc 12.2") == base


def test_executable_bit_and_symlink_target_count_and_the_hash_is_stable(tmp_path: Path) -> None:
    root = _tree(tmp_path / "a")
    first = split_tree(root, VLLM_LAYOUT).compiler_input_hash(ENV, "t")
    # A copy elsewhere, with other mtimes: the same hash (paths are relative, times are no input).
    copy = tmp_path / "b"
    shutil.copytree(root, copy)
    os.utime(copy / "setup.py", (0, 0))
    assert split_tree(copy, VLLM_LAYOUT).compiler_input_hash(ENV, "t") == first
    (root / "cmake/utils.cmake").chmod(0o755)
    assert split_tree(root, VLLM_LAYOUT).compiler_input_hash(ENV, "t") != first
    (root / "csrc/alias.h").symlink_to("ops.h")
    with_link = split_tree(root, VLLM_LAYOUT)
    (root / "csrc/alias.h").unlink()
    (root / "csrc/alias.h").symlink_to("cpu/attn.cpp")
    assert split_tree(root, VLLM_LAYOUT).compiler_inputs["csrc/alias.h"] != with_link.compiler_inputs["csrc/alias.h"]


def test_changed_files_names_added_removed_and_modified() -> None:
    old = {"a.py": "1", "b.py": "2", "c.py": "3"}
    new = {"a.py": "1", "b.py": "9", "d.py": "4"}
    assert changed_files(old, new) == ["~b.py", "-c.py", "+d.py"]
    assert changed_files(new, new) == []


def test_globs_cross_folders_only_with_double_star() -> None:
    assert matches("csrc/cpu/attn.cpp", ["csrc/**"])
    assert not matches("csrc/cpu/attn.cpp", ["csrc/*"])
    assert matches("a/b/__pycache__/x.pyc", ["**/__pycache__/**"])
    assert matches("x.pyc", ["**/*.pyc"]) and not matches("setup.py", ["**/*.pyc"])
    assert not matches("mycsrc/a.cpp", ["csrc/**"])


def test_staged_parts_hold_exactly_their_files(tmp_path: Path) -> None:
    split = split_tree(_tree(tmp_path / "src"), VLLM_LAYOUT)
    dest = {part: tmp_path / "ctx" / part for part in ("requirements", "compiler_inputs", "package")}
    stage_parts(split, dest)  # type: ignore[arg-type]
    for part, folder in dest.items():
        staged = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        assert staged == sorted(split.files(part)), part  # type: ignore[arg-type]
    assert (dest["compiler_inputs"] / "csrc/cpu/attn.cpp").read_text() == "int attn() { return 1; }\n"


def test_a_file_or_an_empty_tree_is_a_named_error(tmp_path: Path) -> None:
    (tmp_path / "vllm.tar.gz").write_bytes(b"x")
    with pytest.raises(UsageError, match=r"vllm\.tar\.gz"):
        split_tree(tmp_path / "vllm.tar.gz", VLLM_LAYOUT)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceUnavailable, match="csrc"):
        split_tree(tmp_path / "empty", VLLM_LAYOUT)


def test_the_real_vllm_tree_splits_as_its_setup_py_reads_it(project: Project, tmp_path: Path) -> None:
    # The recipe's pinned sdist (cached, or fetched from PyPI once, as the quick run's preflight tests do),
    # unpacked: the layout is checked against the tree Forge builds, not a fixture shaped like it.
    sdist = resolve_sdist(project.recipe_for("cpu"), project.root, {}).path
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path, filter="data")
    (src,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    split = split_tree(src, VLLM_LAYOUT)
    inputs = split.compiler_inputs
    for needed in ("setup.py", "vllm/envs.py", "tools/build_rust.py", "CMakeLists.txt", "rust/src/cmd/Cargo.toml"):
        assert needed in inputs, needed
    assert any(p.startswith("csrc/cpu/") and p.endswith(".cpp") for p in inputs)
    assert not any(p.startswith(("vllm/engine/", "tests/", "docs/")) for p in inputs)
    assert "requirements/cpu.txt" in split.requirements and "requirements/build/cpu.txt" in split.requirements
    assert "vllm/engine/arg_utils.py" in split.package and "vllm/envs.py" in split.package


def test_a_layout_of_our_own_is_honoured(tmp_path: Path) -> None:
    layout = TreeLayout(requirements=("reqs.txt",), compiler_inputs=("src/**",), package=("pkg/**",))
    (tmp_path / "src").mkdir()
    (tmp_path / "src/a.cpp").write_text("a")
    (tmp_path / "reqs.txt").write_text("numpy")
    split = split_tree(tmp_path, layout)
    assert list(split.requirements) == ["reqs.txt"] and list(split.compiler_inputs) == ["src/a.cpp"]
    assert split.package == {}


def test_a_tree_is_not_locked_and_says_so(project: Project, tmp_path: Path) -> None:
    from builders.repro.resolve import _sdist

    with pytest.raises(SourceUnavailable, match=r"source tree: forge\.lock pins sdists"):
        _sdist(project, project.recipe_for("cpu"), {"vllm": _tree(tmp_path)})
