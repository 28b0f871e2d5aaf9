"""What preflight hands the engine module of a kind=native recipe (builders/engines/<engine>/image.py), whose
`preflight` runs that engine's own gates. Kept in preflight, which loads the module by name, so preflight
imports no engine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from builders.config.models import Distro, Recipe
    from builders.preflight.host import HostFacts


@dataclass(frozen=True, kw_only=True)
class PreflightInputs:
    """What preflight hands an engine module: the pair, the host, and where the pinned source is (if at hand)."""

    distro: Distro
    recipe: Recipe
    host: HostFacts
    source: Path | None  # the pinned archive, or None when it is not in the cache and may not be fetched
    source_why: str  # why source is None
    max_jobs: int | None
    run_flags: frozenset[str]  # CPU flags of the host the image will run on
    run_source: str
    # --source NAME=PATH other than the engine's own archive: checkouts an engine's build needs (sgl-kernel).
    local_sources: Mapping[str, Path] = field(default_factory=dict)
