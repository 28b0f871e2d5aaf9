"""A real registry for the publish tests: the one .ci/run started (FORGE_TEST_REGISTRY), else one of their own."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from builders.registry.local import local_registry


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a running distribution 2.8 registry on 127.0.0.1."""
    given = os.environ.get("FORGE_TEST_REGISTRY")
    if given:
        yield given
        return
    root: Path = tmp_path_factory.mktemp("registry")
    with local_registry(root) as host:
        yield host
