"""Which stages of a build ran and which came from the engine's cache, read from the build's own log.

BuildKit's plain progress names a step `#N [STAGE k/n] INSTRUCTION` and, when it is cached, says `#N CACHED`;
a step that ran prints output lines `#N SECONDS …` and ends `#N DONE SECONDS` (or ERROR). buildah (podman build)
prints `[i/n] STEP k/m: INSTRUCTION` (no `[i/n]` with one stage), the stage's name only in its FROM step
(`STEP 1/m: FROM BASE AS NAME`), `--> Using cache ID` under a step it took from the cache, and a bare `--> ID`
after every step (so alone, after one that ran). Both formats are those of the real logs under
tests/rebuild/fixtures/. The legacy builder names no stages: its logs say nothing here.
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
_BUILDAH_ID = re.compile(r"^--> [0-9a-f]{6,}\s*$")
_FROM_AS = re.compile(r"\bAS\s+([\w.-]+)\s*$", re.IGNORECASE)
# A step that needs another stage's result: `COPY --from=NAME`, or a mount's `from=NAME`.
_WAITS_ON = re.compile(r"(?:--from=|[\s,]from=)([\w.-]+)(?=[\s,]|$)")  # not an image ref (a/b:c)


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


@dataclass(frozen=True, eq=False)  # two pending steps are never one
class _Step:
    index: str  # buildah's `[i/n]`
    stage: str
    last: bool  # `STEP m/m`: answering it finishes the stage
    waits_on: str | None  # the stage it copies or mounts from, if any


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
    # buildah (even with one job) runs stages as goroutines that hand one slot around: a step that needs another
    # stage (`COPY --from=extension`) is printed, gives the slot up while it waits, and prints its outcome only when
    # it gets the slot back, after any number of other stages' lines. So steps are attributed by their `[i/n]`
    # index, and each outcome line (`--> Using cache ID` for a cached step, a bare `--> ID` for one that ran)
    # answers the most recently opened step that can be answering now: one that waits on no stage, or whose stage
    # has finished. Two stages can wait at once (runtime on extension, runtime-venv on venv), so "the most recent
    # step" alone gave one stage's cache line to the other, and the cached step was then counted as run.
    counts: dict[str, list[int]] = {}
    names: dict[str, str] = {}  # buildah's stage index ("3", or "" without `[i/n]`) -> the stage's name
    pending: list[_Step] = []  # steps opened and not yet answered, oldest first
    finished: set[str] = set()  # stages whose last step was answered
    anonymous = 0
    echo = False  # the line after `--> Using cache FULL` repeats the id (`--> SHORT`): not an outcome

    def answer(step: _Step, cached: bool) -> None:
        pending.remove(step)
        counts.setdefault(step.stage, [0, 0])[0 if cached else 1] += 1
        if step.last:
            finished.add(step.stage)

    def answering() -> _Step | None:
        ready = [step for step in pending if step.waits_on is None or step.waits_on in finished]
        # Nothing ready: a wait on something the log never names as a stage (an image): the newest answers.
        candidates = ready or pending
        return candidates[-1] if candidates else None

    for line in lines:
        after_cache, echo = echo, False
        if m := _BUILDAH_STEP.match(line):
            index = m.group(1) or ""
            # The stage's previous step printed no outcome line: it ran.
            for held in [step for step in pending if step.index == index]:
                answer(held, cached=False)
            if m.group(4) == "FROM" and m.group(2) == "1":
                named = _FROM_AS.search(m.group(5))
                anonymous += 0 if named else 1
                names[index] = named.group(1) if named else f"stage-{anonymous}"
                counts.setdefault(names[index], [0, 0])
                if m.group(3) == "1":  # a stage of one FROM step is finished when it starts
                    finished.add(names[index])
            elif index in names:
                waits = _WAITS_ON.search(m.group(5))
                pending.append(
                    _Step(
                        index=index,
                        stage=names[index],
                        last=m.group(2) == m.group(3),
                        waits_on=waits.group(1) if waits else None,
                    )
                )
        elif _BUILDAH_CACHE.match(line):
            echo = True
            if step := answering():
                answer(step, cached=True)
        elif _BUILDAH_ID.match(line) and not after_cache and (step := answering()):
            answer(step, cached=False)
    for step in list(pending):
        answer(step, cached=False)
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
