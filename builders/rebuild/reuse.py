"""Which stages of a build ran and which came from the engine's cache, read from the build's own log.

BuildKit's plain progress names a step `#N [STAGE k/n] INSTRUCTION` and, when it is cached, says `#N CACHED`;
a step that ran prints output lines `#N SECONDS …` and ends `#N DONE SECONDS` (or ERROR). buildah (podman build)
prints `[i/n] STEP k/m: INSTRUCTION` (no `[i/n]` with one stage), the stage's name only in its FROM step
(`STEP 1/m: FROM BASE AS NAME`), and `--> Using cache ID` under a step it took from the cache. Both formats are
those of the real logs under tests/rebuild/fixtures/. The legacy builder names no stages: its logs say nothing
here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Reuse = Literal["reused", "rebuilt", "not in log"]

_BK_STEP = re.compile(r"^#(\d+) \[([\w.-]+) (\d+)/(\d+)\] (\S+)")
_BK_CACHED = re.compile(r"^#(\d+) CACHED\s*$")
_BK_RAN = re.compile(r"^#(\d+) (?:DONE|ERROR|\d+\.\d+ )")
_BUILDAH_STEP = re.compile(r"^(?:\[(\d+)/\d+\] )?STEP (\d+)/(\d+): (\S+)(.*)$")
_BUILDAH_CACHE = re.compile(r"^--> Using cache [0-9a-f]+")
_FROM_AS = re.compile(r"\bAS\s+([\w.-]+)\s*$", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class StageReuse:
    """One stage's steps in a log: how many came from the cache and how many ran (FROM steps not counted: they
    pull or reuse a base, which says nothing about this stage's own work)."""

    stage: str
    cached: int
    ran: int

    @property
    def verdict(self) -> Reuse:
        if self.cached + self.ran == 0:
            return "not in log"
        return "rebuilt" if self.ran else "reused"


def _buildkit(lines: list[str]) -> dict[str, StageReuse]:
    step_stage: dict[str, str] = {}
    cached: set[str] = set()
    ran: set[str] = set()
    for line in lines:
        if m := _BK_STEP.match(line):
            if m.group(5) != "FROM":
                step_stage[m.group(1)] = m.group(2)
        elif m := _BK_CACHED.match(line):
            cached.add(m.group(1))
        elif m := _BK_RAN.match(line):
            ran.add(m.group(1))
    counts: dict[str, list[int]] = {}
    for step, stage in step_stage.items():
        entry = counts.setdefault(stage, [0, 0])
        # A step BuildKit reports both ways (it printed its header, then found it cached) is cached.
        if step in cached:
            entry[0] += 1
        elif step in ran:
            entry[1] += 1
    return {name: StageReuse(stage=name, cached=c, ran=r) for name, (c, r) in counts.items()}


def _buildah(lines: list[str]) -> dict[str, StageReuse]:
    # buildah runs a stage when a later one first needs it, so stages interleave: `[4/4] STEP 6/9: COPY
    # --from=extension` is printed, then all of stage 3's steps, then stage 4's `--> Using cache` for that COPY.
    # Steps are therefore attributed by their `[i/n]` index (the stage its FROM named), and each stage keeps its
    # own step whose outcome is not yet known. A cache line answers the most recently opened of those: a stage
    # that waits on another resumes only after that one's last step.
    counts: dict[str, list[int]] = {}
    names: dict[str, str] = {}  # buildah's stage index ("3", or "" without `[i/n]`) -> the stage's name
    pending: list[tuple[str, str]] = []  # (index, stage) of steps opened and not yet answered, oldest first
    anonymous = 0

    def close(index: str) -> None:
        for held in [p for p in pending if p[0] == index]:
            pending.remove(held)
            counts.setdefault(held[1], [0, 0])[1] += 1

    for line in lines:
        if m := _BUILDAH_STEP.match(line):
            index = m.group(1) or ""
            close(index)  # the stage's previous step printed no cache line: it ran
            if m.group(4) == "FROM" and m.group(2) == "1":
                named = _FROM_AS.search(m.group(5))
                anonymous += 0 if named else 1
                names[index] = named.group(1) if named else f"stage-{anonymous}"
                counts.setdefault(names[index], [0, 0])
            elif index in names:
                pending.append((index, names[index]))
        elif _BUILDAH_CACHE.match(line) and pending:
            counts.setdefault(pending.pop()[1], [0, 0])[0] += 1
    for _index, stage in pending:
        counts.setdefault(stage, [0, 0])[1] += 1
    return {name: StageReuse(stage=name, cached=c, ran=r) for name, (c, r) in counts.items()}


def stage_reuse(log: str) -> dict[str, StageReuse]:
    """Every named stage the log shows, with its cached and run steps; {} for a log of neither format."""
    lines = log.splitlines()
    if any(_BK_STEP.match(line) for line in lines):
        return _buildkit(lines)
    return _buildah(lines)


def verdict(log: str, stage: str) -> Reuse:
    found = stage_reuse(log).get(stage)
    return found.verdict if found else "not in log"
