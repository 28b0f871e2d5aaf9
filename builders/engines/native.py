"""What an engine module provides: its plan, its preflight gates and its image's test stage."""

from __future__ import annotations

import re
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from builders.config.models import Distro, Recipe
    from builders.container import Engine
    from builders.engines.checks import CheckResult
    from builders.plan import BuildPlan, PlanOptions
    from builders.preflight.findings import Finding
    from builders.preflight.inputs import PreflightInputs
    from builders.sources import ResolvedSource
    from builders.target import Target


class NativeEngine(Protocol):
    name: str

    def plan(self, distro: Distro, recipe: Recipe, options: PlanOptions) -> BuildPlan:
        """distro + recipe + options → BuildPlan, pure."""
        ...

    def source_version(self, source: Path) -> str | None:
        """The engine's own version as its pinned source states it (recorded in the report and labels)."""
        ...

    def sources(self, target: Target, overrides: dict[str, Path]) -> list[ResolvedSource]:
        """The checkouts the build needs beside the pinned archive, from --source NAME=PATH (none for most).
        Raises SourceUnavailable naming what to check out where one is missing."""
        ...

    def preflight(self, inputs: PreflightInputs) -> list[Finding]:
        """The gates this engine's build has, read from its own build files and cited by file and line."""
        ...

    def checks(self, engine: Engine, image: str, plan: BuildPlan) -> list[CheckResult]:
        """The test stage: run the built image and judge it."""
        ...


Progress = Callable[[str], None]


def sdist_member(sdist: Path, relative: str) -> str | None:
    """A text file of an sdist, by its path under the sdist's top folder, read without unpacking; None if absent."""
    with tarfile.open(sdist) as tar:
        top = tar.next()
        if top is None:
            return None
        try:
            member = tar.extractfile(f"{top.name.split('/', 1)[0]}/{relative}")
        except KeyError:
            return None
        return member.read().decode("utf-8", errors="replace") if member else None


def find_line(text: str, pattern: str) -> tuple[int, re.Match[str]] | None:
    """The first line matching `pattern`, numbered from 1 as a citation reads it, and its match."""
    for number, line in enumerate(text.splitlines(), start=1):
        match = re.search(pattern, line)
        if match:
            return number, match
    return None
