"""The report's reuse section: each layer's verdict from the log, the parts' hashes, the files changed since the
previous build in the same folder, and ccache's counters (or why there are none)."""

from __future__ import annotations

import json
from pathlib import Path

from builders.engines.vllm.devloop import reuse_section, toolchain_identity
from builders.engines.vllm.devtree import VLLM_LAYOUT
from builders.project import Project
from builders.rebuild.ccache_stats import BEGIN, END
from builders.rebuild.devtree import MANIFEST, TreeManifest, read_manifest, split_tree
from builders.rebuild.records import CcacheRecord
from builders.report import BuildReport

FIXTURES = Path(__file__).parent / "fixtures"
ENV = {"MAX_JOBS": "2"}
TOOLCHAIN = toolchain_identity("sha256:abc", ("gcc", "g++", "ccache"))


def _tree(root: Path) -> Path:
    for rel, text in {
        "setup.py": "x",
        "csrc/a.cpp": "int a;",
        "csrc/b.cpp": "int b;",
        "requirements/cpu.txt": "numpy\n",
        "vllm/__init__.py": "",
        "vllm/core.py": "A = 1\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _log(env: str, extension: str, stats: str | None) -> str:
    """A BuildKit log in the format of tests/rebuild/fixtures/buildkit-*.log: each stage's steps CACHED or run."""
    lines = []
    for n, (stage_name, state) in enumerate((("env", env), ("extension", extension), ("runtime", "ran")), 5):
        lines.append(f"#{n} [{stage_name} 2/3] RUN step of {stage_name}")
        if state == "cached":
            lines.append(f"#{n} CACHED")
        else:
            if stage_name == "extension" and stats is not None:
                lines += [f"#{n} 1.000 {BEGIN}", *(f"#{n} 1.001 {s}" for s in stats.splitlines()), f"#{n} 1.002 {END}"]
            lines.append(f"#{n} DONE 3.0s")
    return "\n".join(lines) + "\n"


def test_a_python_edit_reuses_env_and_extension_and_names_the_file(tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    first = split_tree(root, VLLM_LAYOUT)
    previous: TreeManifest = {"started": "2026-12-03T09:00:00Z", "files": first.manifest()}
    (root / "vllm/core.py").write_text("A = 2\n")
    split = split_tree(root, VLLM_LAYOUT)
    section = reuse_section(
        split,
        log=_log("cached", "cached", None),
        compile_env=ENV,
        toolchain=TOOLCHAIN,
        cache_mounted=True,
        previous=previous,
    )
    assert section.environment and section.extension and section.package  # a tree: every layer
    assert section.environment.verdict == "reused" and section.extension.verdict == "reused"
    assert section.package.verdict == "rebuilt"
    assert section.package.changed_files == ["~vllm/core.py"]
    assert section.extension.changed_files == [] and section.environment.changed_files == []
    assert isinstance(section.ccache, str) and section.ccache.startswith("not run")
    assert section.extension.compiler_input_hash == first.compiler_input_hash(ENV, TOOLCHAIN)


def test_a_cpp_edit_rebuilds_the_extension_and_reports_ccache(tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    previous: TreeManifest = {"started": "t0", "files": split_tree(root, VLLM_LAYOUT).manifest()}
    (root / "csrc/b.cpp").write_text("int b = 2;")
    stats = (FIXTURES / "ccache-4.7.5-one-edit.stats").read_text()
    section = reuse_section(
        split_tree(root, VLLM_LAYOUT),
        log=_log("cached", "ran", stats),
        compile_env=ENV,
        toolchain=TOOLCHAIN,
        cache_mounted=True,
        previous=previous,
    )
    assert section.environment and section.extension and section.package  # a tree: every layer
    assert section.extension.verdict == "rebuilt" and section.extension.changed_files == ["~csrc/b.cpp"]
    ccache = section.ccache
    assert isinstance(ccache, CcacheRecord) and (ccache.hits, ccache.misses, ccache.hit_rate) == (1, 1, 0.5)
    report = BuildReport(distro="debian-12", target="cpu", recipe="vllm-cpu", reuse=section)
    summary = report.summary()
    assert "extension: rebuilt" in summary and "~csrc/b.cpp" in summary and "hit rate 50%" in summary


def test_without_a_cache_mount_ccache_is_not_mounted_and_a_first_build_names_no_changes(tmp_path: Path) -> None:
    section = reuse_section(
        split_tree(_tree(tmp_path), VLLM_LAYOUT),
        log=_log("ran", "ran", (FIXTURES / "ccache-4.7.5-cold.stats").read_text()),
        compile_env=ENV,
        toolchain=TOOLCHAIN,
        cache_mounted=False,
        previous=None,
    )
    assert section.environment and section.extension and section.package  # a tree: every layer
    assert isinstance(section.ccache, str) and section.ccache.startswith("not mounted")
    assert section.extension.changed_files is None and section.previous_build is None


def test_a_manifest_that_cannot_be_read_is_no_previous_build(tmp_path: Path) -> None:
    assert read_manifest(tmp_path) is None
    (tmp_path / MANIFEST).write_text("{not json")
    assert read_manifest(tmp_path) is None
    (tmp_path / MANIFEST).write_text(json.dumps({"started": "t", "files": {"package": {}}}))
    assert read_manifest(tmp_path) == {"started": "t", "files": {"package": {}}}


def test_the_reuse_phase_follows_the_build_for_a_tree_only(project: Project, tmp_path: Path) -> None:
    from builders.build import PHASES, BuildOptions, start
    from builders.log import Log

    names = [name for name, _, _ in PHASES]
    assert names.index("reuse") == names.index("build") + 1
    runs = dict((name, when) for name, _, when in PHASES)["reuse"]
    ctx = start(
        project, project.distro("debian-12"), project.recipe_for("cpu"), BuildOptions(reports_dir=tmp_path), Log()
    )
    assert not runs(ctx)  # an sdist, or a wheel: nothing split
    ctx.tree = split_tree(_tree(tmp_path / "tree"), VLLM_LAYOUT)
    assert runs(ctx)
