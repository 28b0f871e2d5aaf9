"""One output channel: steps with timings, CI fold groups, warnings, quiet mode, and tables without a TTY."""

from __future__ import annotations

import io

import pytest
from rich.table import Table

from builders.cli import main
from builders.config import Project
from builders.log import Log, ci_system, print_table
from builders.log import console as wide_console


def _log(ci: str | None, quiet: bool = False) -> tuple[Log, list[str]]:
    lines: list[str] = []
    return Log(lines.append, ci=ci, quiet=quiet), lines  # type: ignore[arg-type]


def test_the_ci_is_told_by_its_own_variables() -> None:
    assert ci_system({"GITHUB_ACTIONS": "true"}) == "github"
    assert ci_system({"GITLAB_CI": "true"}) == "gitlab"
    assert ci_system({"CI": "true"}) is None


def test_a_step_is_announced_and_timed_even_when_it_fails() -> None:
    log, lines = _log(None)
    with pytest.raises(RuntimeError), log.step("base"):
        raise RuntimeError("no base")
    assert lines[0] == "forge: ▸ base" and lines[-1].startswith("forge: base: failed after ")
    assert "base" in log.timings


def test_github_and_gitlab_fold_each_step() -> None:
    log, lines = _log("github")
    with log.step("preflight"):
        log.output("a build line")
    assert lines[0] == "::group::forge: preflight" and lines[2] == "::endgroup::"
    assert lines[3].startswith("forge: preflight: done in ")
    log, lines = _log("gitlab")
    with log.step("sources"):
        pass
    assert "section_start:" in lines[0] and ":sources[collapsed=true]" in lines[0]
    assert "section_end:" in lines[1] and ":sources\r" in lines[1]


def test_quiet_hides_tool_output_not_forges_own_lines() -> None:
    log, lines = _log(None, quiet=True)
    log("#12 [toolchain 3/5] RUN apt-get ...")
    log("forge: base forge/base:debian-13 (local)")
    log.warning("preflight INCOMPLETE")
    assert lines == ["forge: base forge/base:debian-13 (local)", "forge: warning: preflight INCOMPLETE"]


def test_a_table_without_a_terminal_is_plain_text_at_full_width() -> None:
    out = io.StringIO()
    long = "x" * 150
    print_table("title", ("a", "b"), [("build-debian-13-cpu-wheel", long)], stream=out)
    lines = out.getvalue().splitlines()
    assert lines == [
        "title",
        "a                          b",
        "-" * 25 + "  " + "-" * 150,
        f"build-debian-13-cpu-wheel  {long}",
    ]


def test_forge_list_in_a_ci_log_shows_whole_session_names(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    for distro, recipe in project.pairs():
        assert f"build-{distro.name}-{recipe.target} " in out


def test_a_rich_table_outside_a_terminal_keeps_each_row_on_one_line() -> None:
    """smoke, sweep and repro print rich tables: in a CI log (no terminal) rows must not fold at 80 columns."""
    stream = io.StringIO()
    table = Table(title="forge smoke ci")
    for column in ("class", "pool", "req", "err", "TTFT p50/p99 ms", "ITL p50/p99 ms", "goodput", "gate"):
        table.add_column(column)
    table.add_row("interactive", "interactive", "20", "0", "16.7 / 37.2", "3.4 / 14.2", "1.00", "pass")
    wide_console(stream).print(table)
    rows = [line for line in stream.getvalue().splitlines() if "interactive" in line]
    assert len(rows) == 1 and "16.7 / 37.2" in rows[0] and "pass" in rows[0]
