"""verify-repro's verdict file (`repro.json`) as typed models, and how it is read back.

A run that got to its comparison writes a `ReproVerdict`: the two images, layer by layer, and whether they are
reproducible. A run that stopped before (interrupted, or a build that failed) writes a `ReproStopped`: which pair,
how it ended and during which step; that build's own report, in its folder, says which of its phases.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import Field

from builders.records import Record, ReportInvalid, absent
from builders.repro.compare import Comparison


class Images(Record):
    first: str = Field(description="the first build's image id")
    second: str = Field(description="the second build's image id")


class _Pair(Record):
    distro: str = Field(description="distro name")
    target: str = Field(description="target name")
    source_date_epoch: str | None = Field(description="SOURCE_DATE_EPOCH both builds were given")
    images: Images = Field(description="the two images compared")
    diffoscope: str | None = Field(description="diffoscope's output on the files that differ, when it is installed")


# The pair's fields first, then the comparison's: a model's fields follow its bases from the last to the first.
class ReproVerdict(Comparison, _Pair):
    """verify-repro got to its comparison."""


class ReproStopped(Record):
    """verify-repro stopped before its comparison."""

    distro: str = Field(description="distro name")
    target: str = Field(description="target name")
    result: Literal["interrupted", "failed"] = Field(description="how it ended")
    signal: str | None = absent("what interrupted it: SIGINT, SIGTERM or SIGHUP")
    ended_in: str = Field(description="the step running then: first build, second build or compare")


def read_repro(path: Path) -> ReproVerdict | ReproStopped:
    """repro.json as either model; ReportInvalid names the file and the field that is wrong."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReportInvalid(f"{path}: not a verify-repro report ({exc})") from None
    # A run that stopped says how; one that compared has no `result`.
    stopped = isinstance(data, dict) and "result" in data
    return ReproStopped.read(path) if stopped else ReproVerdict.read(path)
