"""forge.lock without an engine: round trip, canonical bytes, drift named entry by entry, and the input hashes."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import zipfile
from calendar import timegm
from pathlib import Path

import pytest

from builders.engines.vllm.lock import filtered_requirements
from builders.errors import ConfigError
from builders.project import Project
from builders.repro.errors import LockDrift
from builders.repro.integration import check_drift
from builders.repro.lockfile import (
    ArchiveLock,
    BaseLock,
    LockFile,
    PairLock,
    RequirementsLock,
    TreeLock,
    WheelLock,
    drift,
    dumps,
    merge,
    notes,
    read_lock,
    write_lock,
)
from builders.repro.resolve import sdist_epoch, tree_sha256, wheel_epoch
from builders.target import Target

FIXTURE_SOURCE = Path(__file__).resolve().parents[1] / "preflight" / "fixtures" / "vllm-0.33.0"
SHA_A, SHA_B = "a" * 64, "b" * 64


def _entry(**changes: object) -> PairLock:
    data: dict[str, object] = {
        "distro": "debian-12",
        "target": "cpu-wheel",
        "recipe": "vllm-cpu-wheel",
        "source_date_epoch": 1735689600,
        "epoch_from": "test",
        "base": BaseLock(
            ref="forge/base:debian-12",
            declared="docker.io/library/debian:bookworm",
            how="local",
            rootfs=("sha256:" + "1" * 64,),
            image_id="sha256:" + "2" * 64,
        ),
        "archives": (ArchiveLock(name="vllm", file="vllm-0.33.0.tar.gz", sha256=SHA_A),),
        "trees": (TreeLock(name="onednn", tree_sha256=SHA_A, files=3, version="3.7.2", origin="debian-source"),),
        "wheels": (
            WheelLock(file="torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl", sha256=SHA_A, installed=True),
            WheelLock(file="torchvision-0.28.0-cp311-cp311-linux_x86_64.whl", sha256=SHA_B, installed=False),
        ),
        "requirements": (RequirementsLock(name="runtime", origin="test", hashed=False, lines=("numpy>=2", "regex")),),
    }
    data.update(changes)
    return PairLock.model_validate(data)


def test_round_trip_is_equal_and_canonical(tmp_path: Path) -> None:
    lock = merge(LockFile(), [_entry(), _entry(distro="debian-13")])
    path = tmp_path / "forge.lock"
    write_lock(path, lock)
    again = read_lock(path)
    assert again == lock
    # Canonical: the same lock gives the same bytes, with sorted keys and pairs in name order.
    assert dumps(again) == path.read_text()
    data = json.loads(path.read_text())
    assert list(data["pairs"]) == ["debian-12/cpu-wheel", "debian-13/cpu-wheel"]
    assert list(data) == sorted(data)


def test_merge_replaces_named_pairs_and_keeps_the_rest() -> None:
    old = merge(LockFile(), [_entry(), _entry(target="router", recipe="router")])
    new = merge(old, [_entry(source_date_epoch=1)])
    assert new.pairs["debian-12/cpu-wheel"].source_date_epoch == 1
    assert new.pairs["debian-12/router"] == old.pairs["debian-12/router"]


def test_no_drift_between_equal_entries() -> None:
    assert drift(_entry(), _entry()) == []


def test_drift_names_the_wheel_that_changed_with_both_hashes() -> None:
    changed = _entry(
        wheels=(
            WheelLock(file="torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl", sha256=SHA_B, installed=True),
            WheelLock(file="torchvision-0.28.0-cp311-cp311-linux_x86_64.whl", sha256=SHA_B, installed=False),
        )
    )
    moved = drift(_entry(), changed)
    assert [d.entry for d in moved] == ["wheels[torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl]"]
    assert moved[0].locked == f"sha256:{SHA_A}" and moved[0].current == f"sha256:{SHA_B}"


def test_drift_names_requirement_lines_added_removed_and_changed() -> None:
    changed = _entry(
        requirements=(RequirementsLock(name="runtime", origin="test", hashed=False, lines=("numpy>=2.1", "tqdm")),)
    )
    moved = {d.entry: (d.locked, d.current) for d in drift(_entry(), changed)}
    assert moved == {
        "requirements.runtime[numpy]": ("numpy>=2", "numpy>=2.1"),
        "requirements.runtime[regex]": ("regex", "(absent)"),
        "requirements.runtime[tqdm]": ("(absent)", "tqdm"),
    }


def test_base_with_new_layers_drifts_but_a_reimport_with_the_same_layers_is_a_note() -> None:
    locked = _entry()
    reimported = _entry(base=locked.base.model_copy(update={"image_id": "sha256:" + "3" * 64}))
    assert drift(locked, reimported) == []
    assert "re-imported, same content" in notes(locked, reimported)[0]
    rebuilt = _entry(base=locked.base.model_copy(update={"rootfs": ("sha256:" + "4" * 64,)}))
    assert [d.entry for d in drift(locked, rebuilt)] == ["base.rootfs"]


def test_the_epoch_is_the_locks_to_decide_not_drift() -> None:
    assert drift(_entry(), _entry(source_date_epoch=42)) == []


def test_check_drift_raises_naming_every_entry_and_the_fix(tmp_path: Path) -> None:
    changed = _entry(
        archives=(ArchiveLock(name="vllm", file="vllm-0.33.0.tar.gz", sha256=SHA_B),),
        trees=(TreeLock(name="onednn", tree_sha256=SHA_B, files=3, version="3.7.2", origin="debian-source"),),
    )
    with pytest.raises(LockDrift) as err:
        check_drift(_entry(), changed, tmp_path / "forge.lock")
    text = err.value.render()
    assert "2 input(s) differ" in text
    assert f"archives[vllm]: locked vllm-0.33.0.tar.gz sha256:{SHA_A}, now vllm-0.33.0.tar.gz sha256:{SHA_B}" in text
    assert "trees[onednn]" in text
    assert "forge lock debian-12 cpu-wheel" in text
    assert err.value.exit_code == 10


def test_a_broken_lock_file_names_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "forge.lock"
    path.write_text("{\n  'pairs': {}\n}\n")
    with pytest.raises(ConfigError, match=r"not valid JSON at line 2"):
        read_lock(path)
    path.write_text(json.dumps({"version": 1, "generated_by": "x", "pairz": {}}))
    with pytest.raises(ConfigError, match=r"unknown key 'pairz' — did you mean 'pairs'"):
        read_lock(path)
    with pytest.raises(ConfigError, match="no lock file"):
        read_lock(tmp_path / "missing.lock")


def test_tree_hash_follows_content_and_exec_bit_not_mtime_or_git(tmp_path: Path) -> None:
    tree = tmp_path / "onednn"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "a.cpp").write_text("int a;\n")
    (tree / "run.sh").write_text("#!/bin/sh\n")
    (tree / "link").symlink_to("src/a.cpp")
    first, count = tree_sha256(tree)
    assert count == 4  # src/, src/a.cpp, run.sh, link
    os.utime(tree / "src" / "a.cpp", (1, 1))
    (tree / ".git").mkdir()
    (tree / ".git" / "HEAD").write_text("ref\n")
    (tree / ".forge-origin").write_text("debian-source: onednn 1\n")
    assert tree_sha256(tree)[0] == first
    (tree / "run.sh").chmod(0o755)
    assert tree_sha256(tree)[0] != first
    (tree / "run.sh").chmod(0o644)
    (tree / "src" / "a.cpp").write_text("int b;\n")
    assert tree_sha256(tree)[0] != first


def _sdist(tmp_path: Path, mtime: int) -> Path:
    root = tmp_path / "vllm-0.33.0"
    shutil.copytree(FIXTURE_SOURCE, root)
    path = tmp_path / "vllm-0.33.0.tar.gz"

    def stamp(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime = mtime
        return info

    with tarfile.open(path, "w:gz") as tar:
        tar.add(root, arcname="vllm-0.33.0", filter=stamp)
    return path


def test_source_requirements_are_filtered_by_the_builds_own_script(project: Project, tmp_path: Path) -> None:
    sdist = _sdist(tmp_path, 1700000000)
    build, runtime = filtered_requirements(
        project.containers_dir, sdist, Target.resolve(project.distro("debian-12"), project.recipe_for("cpu"))
    )
    assert build.name == "build" and runtime.name == "runtime"
    # torch comes from its own index, cmake from the distro (cmake_from_pip: false), triton's URL is dropped.
    for lines in (build.lines, runtime.lines):
        assert not [line for line in lines if line.startswith(("torch", "cmake")) or "://" in line]
    assert "setuptools==78.1.1" in build.lines and "ninja" in build.lines
    assert "-r common.txt" in runtime.lines and "numba == 0.65.0" in runtime.lines
    assert "filter_requirements.py --drop-cmake=yes" in build.origin
    assert sdist_epoch(sdist) == 1700000000


def test_wheel_epoch_reads_the_metadata_date_and_ignores_zeroed_dates(tmp_path: Path) -> None:
    def wheel(name: str, when: tuple[int, int, int, int, int, int]) -> Path:
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr(zipfile.ZipInfo("x-1.dist-info/METADATA", date_time=when), "Name: x\nVersion: 1\n")
        return path

    assert wheel_epoch(wheel("x-1-py3-none-any.whl", (2026, 10, 20, 8, 40, 22))) == timegm(
        (2026, 10, 20, 8, 40, 22, 0, 0, 0)
    )
    assert wheel_epoch(wheel("y-1-py3-none-any.whl", (1980, 1, 1, 0, 0, 0))) is None
