"""What preflight found, how it reads in a terminal, and its `--json` shape."""

from __future__ import annotations

from typing import Any, Literal, TextIO, TypedDict

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.text import Text

from builders.log import print_table

Verdict = Literal["pass", "warn", "block", "skip"]
# The answer for the whole report: never "clear" while any gate went unchecked (issue 9).
ReportVerdict = Literal["clear", "incomplete", "blocked"]


class Finding(BaseModel):
    """One gate's outcome: what was found, what is required, where that requirement comes from, what to do."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gate: str = Field(description="stable gate id: gcc, cmake, python, torch-wheel, disk-scratch, ram, isa, ...")
    found: str = Field(description="what this distro/host has (GCC 12.2)")
    required: str = Field(description="what the gate requires (≥ 12.3)")
    source: str = Field(
        description="where the requirement or the found value comes from: cmake/cpu_extension.cmake:136, "
        "distros/debian-12.yaml: toolchain.gcc, host /proc/meminfo"
    )
    blocking: bool = Field(description="the build cannot succeed until this is fixed")
    remedy: str = Field(default="", description="what to do instead; empty when the gate passed")
    message: str = Field(default="", description="one sentence saying what the gate checked and why it matters")
    passed: bool = Field(default=False, description="the gate was met; listed to show it was checked")
    evaluated: bool = Field(
        default=True,
        description="false: the gate was skipped or could not be evaluated (no source, index unreachable, base not "
        "probed); such a gate is never counted as passed and makes the report incomplete",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Finding:
        if self.passed and self.blocking:
            raise ValueError("a finding cannot both pass and block")
        if not self.evaluated and (self.passed or self.blocking):
            raise ValueError("a gate that was not evaluated can neither pass nor block")
        return self

    @property
    def verdict(self) -> Verdict:
        if not self.evaluated:
            return "skip"
        return "pass" if self.passed else ("block" if self.blocking else "warn")


def passed(gate: str, found: str, required: str, source: str, message: str = "") -> Finding:
    return Finding(
        gate=gate, found=found, required=required, source=source, blocking=False, passed=True, message=message
    )


def warning(gate: str, found: str, required: str, source: str, remedy: str, message: str = "") -> Finding:
    return Finding(
        gate=gate, found=found, required=required, source=source, blocking=False, remedy=remedy, message=message
    )


def blocker(gate: str, found: str, required: str, source: str, remedy: str, message: str = "") -> Finding:
    return Finding(
        gate=gate, found=found, required=required, source=source, blocking=True, remedy=remedy, message=message
    )


def unchecked(gate: str, found: str, required: str, source: str, remedy: str, message: str = "") -> Finding:
    """A gate preflight could not evaluate: `found` says why; the report is then incomplete, never clear."""
    return Finding(
        gate=gate,
        found=found,
        required=required,
        source=source,
        blocking=False,
        remedy=remedy,
        message=message,
        evaluated=False,
    )


class FindingJson(TypedDict):
    """A finding as `forge preflight --json` prints it."""

    gate: str
    found: str
    required: str
    source: str
    blocking: bool
    evaluated: bool
    remedy: str
    message: str


class PreflightJson(TypedDict):
    """`forge preflight --json`: what CI jobs read (issue 9's shape), the findings first."""

    distro: str
    target: str
    verdict: ReportVerdict
    blocked: bool
    complete: bool
    not_evaluated: list[str]
    findings: list[FindingJson]
    mode: Literal["probed", "declared"]
    recipe: str
    passed: list[FindingJson]
    seconds: float
    vllm_version: str | None
    source: str | None
    max_jobs: int | None
    probe_image: str | None


class PreflightReport(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    distro: str = Field(description="distro name (debian-12)")
    target: str = Field(description="target name (cpu)")
    recipe: str = Field(description="recipe file stem")
    blocked: bool = Field(description="at least one finding blocks the build")
    complete: bool = Field(description="every gate was evaluated; false: see not_evaluated")
    not_evaluated: tuple[str, ...] = Field(
        default=(), description="gates that were skipped or could not be evaluated, in report order"
    )
    verdict: ReportVerdict = Field(
        description="blocked (any gate blocks), else incomplete (any gate not evaluated), else clear"
    )
    mode: Literal["probed", "declared"] = Field(
        description="probed: toolchain facts came from the real base image; declared: from distros/*.yaml only"
    )
    findings: tuple[Finding, ...] = Field(description="gates that block, were not evaluated, or warn")
    passed: tuple[Finding, ...] = Field(description="gates that were checked and met")
    seconds: float = Field(description="wall time preflight took")
    vllm_version: str | None = Field(default=None, description="vLLM version of the source read")
    source: str | None = Field(default=None, description="vLLM source directory or sdist read")
    max_jobs: int | None = Field(default=None, description="compile jobs the RAM gate assumed")
    probe_image: str | None = Field(default=None, description="base image probed, in probed mode")

    @classmethod
    def from_findings(cls, items: list[Finding], **fields: Any) -> PreflightReport:
        order = {"block": 0, "skip": 1, "warn": 2}
        problems = tuple(sorted((f for f in items if not f.passed), key=lambda f: order[f.verdict]))
        blocked = any(f.blocking for f in items)
        skipped = tuple(dict.fromkeys(f.gate for f in problems if not f.evaluated))
        return cls(
            blocked=blocked,
            complete=not skipped,
            not_evaluated=skipped,
            verdict="blocked" if blocked else ("incomplete" if skipped else "clear"),
            findings=problems,
            passed=tuple(f for f in items if f.passed),
            **fields,
        )

    @property
    def blocking(self) -> list[Finding]:
        return [f for f in self.findings if f.blocking]

    def finding(self, gate: str) -> Finding | None:
        """The first non-passing finding of a gate, else its passing one."""
        for item in (*self.findings, *self.passed):
            if item.gate == gate:
                return item
        return None

    def to_json(self) -> PreflightJson:
        """`distro`, `target`, `verdict`, `blocked`, `complete`, `not_evaluated` (gate ids), `findings` (each: gate,
        found, required, source, blocking, evaluated, remedy), plus mode, passed checks, timing and what was read."""

        def item(f: Finding) -> FindingJson:
            return {
                "gate": f.gate,
                "found": f.found,
                "required": f.required,
                "source": f.source,
                "blocking": f.blocking,
                "evaluated": f.evaluated,
                "remedy": f.remedy,
                "message": f.message,
            }

        return {
            "distro": self.distro,
            "target": self.target,
            "verdict": self.verdict,
            "blocked": self.blocked,
            "complete": self.complete,
            "not_evaluated": list(self.not_evaluated),
            "findings": [item(f) for f in self.findings],
            "mode": self.mode,
            "recipe": self.recipe,
            "passed": [item(f) for f in self.passed],
            "seconds": round(self.seconds, 2),
            "vllm_version": self.vllm_version,
            "source": self.source,
            "max_jobs": self.max_jobs,
            "probe_image": self.probe_image,
        }

    def summary(self) -> str:
        blocking = len(self.blocking)
        skipped = sum(1 for f in self.findings if not f.evaluated)
        warnings = len(self.findings) - blocking - skipped
        how = f"probed {self.probe_image}" if self.mode == "probed" else "declared facts only, base not probed"
        verdict = "clear" if self.verdict == "clear" else self.verdict.upper()
        return (
            f"preflight {self.distro} × {self.target}: {verdict} — {blocking} blocking, {skipped} not evaluated, "
            f"{warnings} warning(s), {len(self.passed)} passed ({how}; {self.seconds:.1f} s)"
        )


_STYLE = {"pass": "green", "warn": "yellow", "block": "bold red", "skip": "magenta"}
_LABEL = {"pass": "pass", "warn": "warn", "block": "block", "skip": "not evaluated"}


def render_table(report: PreflightReport, stream: TextIO | None = None, *, show_passed: bool = True) -> None:
    """The findings as a table: folded on a terminal, one full-width line per gate in a CI log or a pipe."""
    rows = [
        (f.gate, f.found, f.required, f.source, Text(_LABEL[f.verdict], style=_STYLE[f.verdict]), f.remedy or f.message)
        for f in (*report.findings, *(report.passed if show_passed else ()))
    ]
    columns = ("gate", "found", "required", "source", "verdict", "remedy")
    print_table(report.summary(), columns, rows, stream=stream, lines_between=True)
