"""One output channel: steps with timings, CI fold groups, warnings, quiet mode, and tables without a TTY."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.table import Table

from builders.cli import main
from builders.log import Log, ci_system, print_table
from builders.log import console as wide_console
from builders.project import Project
from builders.router.classes import RequestClass
from builders.smoke.report import ChecksRequested, ClassRecord, SmokeReport, TrafficRecord, TrafficRecords
from builders.smoke.stack import summary_table
from builders.sweep.report import class_rows, table_rows
from builders.sweep.report import render_table as sweep_table
from builders.sweep.report_model import Calibration, LoadAverage, ProfileRun, SweepReport
from builders.traffic.metrics import RequestRecord
from builders.traffic.plan import TrafficPlan
from builders.traffic.results import TrafficResult


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


def _sweep_and_smoke_reports() -> tuple[SweepReport, SmokeReport, TrafficResult]:
    """Real rows from real traffic records: a shared pool whose interactive class fails its TTFT gate."""
    plan = TrafficPlan.model_validate(
        {
            "model": "m",
            "max_model_len": 1024,
            "interactive": {"count": 3, "rate_per_s": 1.0, "max_tokens": 4, "slo": {"ttft_p99_ms": 500}},
            "long_prefill": {"count": 2, "rate_per_s": 1.0, "max_tokens": 8, "slo": {"ttft_p99_ms": 5000}},
        }
    )
    records = []
    for request_class, ttfts, tokens in (
        (RequestClass.INTERACTIVE, [0.1, 0.9, 3212.5], 4),
        (RequestClass.LONG_PREFILL, [1.0, 2.0], 8),
    ):
        for index, ttft in enumerate(ttfts):
            r = RequestRecord(
                request_class=request_class,
                index=index,
                endpoint="chat",
                stream=True,
                sent_class_header=False,
                prompt_chars=10,
                max_tokens=tokens,
            )
            r.content_times_s = [ttft + 0.01 * i for i in range(tokens)]
            r.e2e_s = r.content_times_s[-1]
            records.append(r)
    traffic = TrafficResult.build(plan, records, wall_s=3300.0, stopped_by="completed")
    run = ProfileRun(
        file="profiles/sweep/shared.yaml",
        description="one pool",
        dtype="float32",
        engine="vllm",
        pools={},
        wall_s=traffic.wall_s,
        startup=None,
        stopped_by="completed",
        classes=class_rows(traffic),
        repetition=0,
        seed=7,
        load_average_1m=LoadAverage(start=None, end=None),
    )
    sweep = SweepReport(
        started_at="2026-01-01T00:00:00+00:00",
        load="seeded open loop",
        cpu_budget=2,
        calibration=Calibration(),
        replica_cache="none",
        profiles={"shared-one-pool": run, "work-conserving": run},
        failed_profiles={},
        repeat=1,
        seeds=[7],
        repetitions=[],
    )
    smoke = SmokeReport(
        run_id="0123abcd",
        profile="ci",
        profile_file="profiles/ci.yaml",
        started_at="2026-01-01T00:00:00+00:00",
        checks_requested=ChecksRequested(slow_clients=False, kill_replica=False),
        traffic=TrafficRecords(
            main=TrafficRecord(
                wall_s=traffic.wall_s,
                stopped_by="completed",
                requests=len(traffic.records),
                classes={
                    c.value: ClassRecord.of(summary, pool="interactive-and-batch")
                    for c, summary in traffic.summaries.items()
                },
            )
        ),
    )
    return sweep, smoke, traffic


def test_the_smoke_sweep_and_traffic_tables_keep_whole_rows_without_a_terminal() -> None:
    """The real renderers, through the console the smoke and sweep commands print with, into a stream that is
    not a TTY (a CI log): each row on one line with every cell whole, no cell cut short with an ellipsis."""
    sweep, smoke, traffic = _sweep_and_smoke_reports()
    tables = (sweep_table(sweep), summary_table(smoke), traffic.render_table())
    stream = io.StringIO()
    for table in tables:
        wide_console(stream).print(table)
    out = stream.getvalue()
    assert "…" not in out
    gate = "FAIL TTFT p99 3148268.0 ms > 500.0 ms"
    rows = [
        *table_rows(sweep),
        ["interactive", "interactive-and-batch", "900.0 / 3148268.0", "10.0 / 10.0", "0.33", "FAIL"],
        ["interactive", "900.0 / 3148268.0", "930.0 / 3148298.0", gate],
        ["long_prefill", "1500.0 / 1990.0", "1570.0 / 2060.0", "pass"],
    ]
    for row in rows:
        assert sum(1 for line in out.splitlines() if all(cell in line for cell in row)) >= 1, (row, out)
    # Each class appears on exactly one line per table: 2 sweep profiles + smoke + traffic, never a fold.
    for name in ("interactive ", "long_prefill "):
        assert sum(1 for line in out.splitlines() if line.startswith(f"│ {name}") or f"│ {name}" in line) == 4
    # What the wide console prevents: rich's default 80 columns outside a terminal cuts the same table.
    narrow = io.StringIO()
    Console(file=narrow).print(traffic.render_table())
    assert "…" in narrow.getvalue() and gate not in narrow.getvalue()
