"""How a build ends is recorded in one place (build.recorded): the loop over the phases only runs them. Here
the phases are stand-ins, so each way a build ends is seen without an engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builders import build as build_module
from builders.build import BuildOptions, build
from builders.context import Context
from builders.errors import BuildFailed, PreflightBlocked
from builders.project import Project


def _run(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_with: BaseException | None
) -> tuple[Path, list[str]]:
    ran: list[str] = []

    def first(ctx: Context) -> None:
        ran.append("first")
        ctx.context_dir = tmp_path / "context"
        ctx.context_dir.mkdir()

    def second(ctx: Context) -> None:
        ran.append("second")
        if fail_with is not None:
            raise fail_with

    def skipped(ctx: Context) -> None:
        ran.append("skipped")

    monkeypatch.setattr(
        build_module,
        "PHASES",
        (("first", first, lambda c: True), ("second", second, lambda c: True), ("skipped", skipped, lambda c: False)),
    )
    reports = tmp_path / "report"
    build(project, project.distro("debian-12"), project.recipe_for("cpu"), BuildOptions(reports_dir=reports), print)
    return reports, ran


def test_a_build_that_gets_to_the_end_succeeded_and_cleans_up(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reports, ran = _run(project, tmp_path, monkeypatch, None)
    report = json.loads((reports / "report.json").read_text())
    assert ran == ["first", "second"]
    assert (report["result"], report["ended_in"], report["error"]) == ("succeeded", None, None)
    assert set(report["phases"]) == {"first", "second"}
    assert not (tmp_path / "context").exists()
    assert "SUCCEEDED" in (reports / "summary.txt").read_text()


@pytest.mark.parametrize(
    ("error", "result", "says"),
    [
        (BuildFailed("the buildkit build exited 1"), "failed", "the buildkit build exited 1"),
        (PreflightBlocked("gcc-12 is too old"), "blocked", "gcc-12 is too old"),
        (KeyboardInterrupt(), "interrupted", "interrupted by SIGINT during second"),
        (RuntimeError("a defect"), "failed", "RuntimeError: a defect"),
    ],
)
def test_how_a_build_stopped_is_recorded_with_its_phase(
    project: Project,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    error: BaseException,
    result: str,
    says: str,
) -> None:
    with pytest.raises(type(error)):
        _run(project, tmp_path, monkeypatch, error)
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert (report["result"], report["ended_in"]) == (result, "second")
    assert says in report["error"]
    assert not (tmp_path / "context").exists()
