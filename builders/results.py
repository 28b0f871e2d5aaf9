"""Committed results: one small JSON summary per published figure set, in results/NAME.json.

A figure in the README or docs names the results file it comes from, and a test checks the quoted number
against the file (tests/pipeline/test_results_figures.py; the rule is in docs/evidence.md). Raw logs and reports
stay in the ignored reports/; a summary holds what a reader needs to judge a figure: the date, Forge's commit,
the command, the machine (CPU, cores, ISA flags, memory), the load average around the run, the versions that
matter, the figures as named numbers with units, and where they come from (measured by the command, or
transcribed from a doc whose raw report was not kept).

A benchmark writes its summary with two calls:

    watch = LoadWatch.start()                  # before the run: the load average now, then sampled during it
    ...                                        # the run
    Result.capture("diagnosis", command="nox -s bench-diagnose -- --save", figures={"precision": Figure(
        value=0.99, unit="ratio")}, versions={"python": "3.11.7"}, load=watch).save(ROOT)   # results/diagnosis.json

capture() fills the date, the commit, the machine and the load itself; save() writes results/NAME.json.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

RESULTS_DIR = "results"
SCHEMA_REF = "../schemas/result.schema.json"
VERSION: Literal[1] = 1

# The CPU flags a published figure can depend on: the vector units vLLM's CPU kernels pick from (AVX2 only, AVX-512,
# BF16, AMX), and the ones a build's -march asks for.
ISA_FLAGS = (
    "sse4_2",
    "fma",
    "f16c",
    "avx2",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
)

_NAME = r"^[a-z0-9][a-z0-9.-]*$"
_KEY = r"^[a-z0-9][a-z0-9_.-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Figure(_Strict):
    """One named number."""

    value: int | float = Field(description="the number, in `unit`")
    unit: str = Field(
        description="s, ms, min, h (time); MB, GB, MiB, GiB (size); % or ratio (a share); × (a multiple); count; "
        "or another unit spelled out (requests/s)"
    )
    note: str = Field(default="", description="what the number is, where that is not clear from its key")


class Machine(_Strict):
    """The machine a result was measured on. A transcribed result holds what its doc said; `None`: not recorded."""

    cpu: str = Field(description="the CPU model as /proc/cpuinfo names it (or as the doc did)")
    cores: int | None = Field(description="logical CPUs the run could use")
    isa: list[str] | None = Field(description="the flags of ISA_FLAGS the CPU has")
    memory_gib: float | None = Field(description="RAM, GiB")
    arch: str | None = Field(default=None, description="x86_64, aarch64")
    note: str = Field(default="", description="anything else that mattered (shared with other work, a VM)")

    @classmethod
    def this_host(cls) -> Machine:
        cpuinfo = _read("/proc/cpuinfo")
        model = re.search(r"^(?:model name|Model)\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
        flags = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
        have = set(flags.group(1).split()) if flags else set()
        total = re.search(r"^MemTotal:\s+(\d+) kB", _read("/proc/meminfo"), re.MULTILINE)
        return cls(
            cpu=model.group(1).strip() if model else platform.processor() or "unknown",
            cores=len(os.sched_getaffinity(0)),
            isa=[f for f in ISA_FLAGS if f in have],
            memory_gib=round(int(total.group(1)) / 2**20, 1) if total else None,
            arch=platform.machine(),
        )


class Load(_Strict):
    """The host's load average (1, 5, 15 minutes) around the run: a figure measured on a loaded host is not an
    idle one."""

    before: tuple[float, float, float] | None = Field(description="at the start")
    after: tuple[float, float, float] | None = Field(description="at the end")
    peak_1min: float | None = Field(default=None, description="the highest 1-minute average sampled during the run")
    note: str = Field(default="", description="what the doc said, for a transcribed result; what else ran")


class Provenance(_Strict):
    """Where the figures come from."""

    kind: Literal["measured", "transcribed"] = Field(
        description="measured: written by the command on the machine above; transcribed: copied from a doc whose "
        "raw report was not kept"
    )
    source: str = Field(
        description="for measured, the command's report (reports/…, not committed); for transcribed, the doc"
    )
    source_commit: str | None = Field(default=None, description="the commit that wrote the transcribed figures")
    note: str = Field(default="", description="what a reader should know: what was not measured, what differs")


class Result(_Strict):
    """One results file."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_ref: str = Field(default=SCHEMA_REF, alias="$schema", description="the JSON schema of this file")
    version: Literal[1] = Field(default=VERSION, description="the format's version")
    name: str = Field(pattern=_NAME, description="the file's stem: results/NAME.json")
    date: str = Field(description="when the run ended, UTC, ISO 8601 (a transcribed run: the day its doc gives)")
    commit: str = Field(description="Forge's commit the run used (`+dirty` when the tree had changes)")
    command: str = Field(description="the command that produces these figures")
    machine: Machine
    load: Load
    versions: dict[str, str] = Field(description="engine, vLLM, Python … as the run saw them")
    figures: dict[str, Figure] = Field(description="the named numbers")
    provenance: Provenance

    @classmethod
    def capture(
        cls,
        name: str,
        *,
        command: str,
        figures: Mapping[str, Figure | tuple[int | float, str]],
        versions: Mapping[str, str],
        load: LoadWatch | None = None,
        source: str = "",
        note: str = "",
        root: Path | None = None,
    ) -> Result:
        """A result measured now, on this host: date, commit, machine and load are read here. `load`: the watch
        started before the run, which also holds the commit the run started from (without one, only the load at
        the end is known, and the commit is read now). `source`: where the run's raw report went (reports/…)."""
        here = root or Path(__file__).resolve().parents[1]
        before, peak = load.stop() if load is not None else (None, None)
        return cls(
            name=name,
            date=datetime.now(UTC).isoformat(timespec="seconds"),
            commit=load.commit if load is not None else commit_of(here),
            command=command,
            machine=Machine.this_host(),
            load=Load(before=before, after=loadavg(), peak_1min=peak),
            versions=dict(versions),
            figures={k: v if isinstance(v, Figure) else Figure(value=v[0], unit=v[1]) for k, v in figures.items()},
            provenance=Provenance(kind="measured", source=source or "the command's output", note=note),
        )

    def save(self, root: Path) -> Path:
        """Write root/results/NAME.json (whole, or not at all) and return its path."""
        for key in self.figures:
            if not re.match(_KEY, key):
                raise ValueError(f"figure key {key!r}: lower-case letters, digits, `_`, `.` and `-` only")
        folder = root / RESULTS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}.json"
        staged = path.with_name(f".{path.name}.new")
        staged.write_text(self.to_text(), encoding="utf-8")
        staged.replace(path)
        return path

    def to_text(self) -> str:
        return json.dumps(self.model_dump(mode="json", by_alias=True), indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def read(cls, path: Path) -> Result:
        return cls.model_validate_json(path.read_text(encoding="utf-8"))


class LoadWatch:
    """The load average at a run's start, and the highest 1-minute average seen during it (sampled every few
    seconds by a daemon thread, so a run that loads the host is seen doing so); and the commit it started from."""

    def __init__(self, every_s: float = 5.0, root: Path | None = None) -> None:
        # The commit the run uses is the one checked out as it starts, whatever is committed while it runs.
        self.commit = commit_of(root or Path(__file__).resolve().parents[1])
        self.before = loadavg()
        self.peak = self.before[0] if self.before else None
        self._every = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @classmethod
    def start(cls, every_s: float = 5.0, root: Path | None = None) -> LoadWatch:
        watch = cls(every_s, root)
        watch._thread.start()
        return watch

    def _sample(self) -> None:
        while not self._stop.wait(self._every):
            now = loadavg()
            if now is not None and (self.peak is None or now[0] > self.peak):
                self.peak = now[0]

    def stop(self) -> tuple[tuple[float, float, float] | None, float | None]:
        """(the load at the start, the highest 1-minute load during the run)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._every + 1)
        now = loadavg()
        if now is not None and (self.peak is None or now[0] > self.peak):
            self.peak = now[0]
        return self.before, self.peak


def unsaved_because(rows: Sequence[Mapping[str, object]]) -> str | None:
    """Why a benchmark's run must not replace its results file, or None: a step that did not succeed (a disk gate,
    a killed run) has no figure, and saving would swap the file's measured rows for that."""
    failed = [f"{row.get('step')}: {row.get('result')}" for row in rows if row.get("result") != "succeeded"]
    if not rows:
        return "no step ran"
    return "; ".join(failed) or None


def loadavg() -> tuple[float, float, float] | None:
    parts = _read("/proc/loadavg").split()
    try:
        return (float(parts[0]), float(parts[1]), float(parts[2]))
    except (IndexError, ValueError):
        return None


def commit_of(root: Path) -> str:
    """HEAD of the checkout at root, `+dirty` when the tree differs from it; `unknown` outside a checkout."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30, check=False
        )
        if head.returncode != 0:
            return "unknown"
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if status.stdout.strip() else "")


def read_results(root: Path) -> dict[str, Result]:
    """Every results file under root/results, by name."""
    return {p.stem: Result.read(p) for p in sorted((root / RESULTS_DIR).glob("*.json"))}


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
