"""Shared fixtures: the project checkout, and an engine for tests marked `engine`."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from builders.config import Project

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def project() -> Project:
    return Project.load(ROOT)


@pytest.fixture
def project_copy(tmp_path: Path) -> Path:
    """A writable copy of distros/, recipes/ and containers/ to break on purpose."""
    for sub in ("distros", "recipes", "containers"):
        shutil.copytree(ROOT / sub, tmp_path / sub)
    return tmp_path


@pytest.fixture(scope="session")
def engine() -> Iterator[object]:
    from builders.engine import Engine
    from builders.errors import EngineError

    try:
        eng = Engine.connect()
    except EngineError as exc:
        pytest.fail(f"engine-backed test, but no engine answers: {exc.message} (start dockerd as .ci/run does)")
    yield eng
