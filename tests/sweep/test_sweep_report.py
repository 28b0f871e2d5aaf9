"""The sweep report from real traffic records: rows, the goal's ratios, Markdown and the PNG plots, drawn so that
their title and legend stay on the canvas and off the data."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.figure import Figure
from sweep_records import profile_run, repetition, streamed, sweep_of

from builders.router.classes import RequestClass
from builders.sweep.claims import judge
from builders.sweep.definition import ORDER
from builders.sweep.repeat import aggregate
from builders.sweep.report import class_rows, compare_to, goodput_figure, render_markdown, ttft_cdf_figure, write_plots
from builders.sweep.report_model import SweepReport
from builders.traffic.plan import TrafficPlan
from builders.traffic.results import TrafficResult

PLAN = TrafficPlan.model_validate(
    {
        "model": "m",
        "max_model_len": 1024,
        "interactive": {"count": 3, "rate_per_s": 1.0, "max_tokens": 4, "slo": {"ttft_p99_ms": 500}},
        "long_prefill": {"count": 2, "rate_per_s": 1.0, "max_tokens": 8, "slo": {"ttft_p99_ms": 5000}},
    }
)


def result(interactive_ttfts: list[float | None], long_ttfts: list[float | None]) -> TrafficResult:
    records = [streamed(RequestClass.INTERACTIVE, i, t, max_tokens=4) for i, t in enumerate(interactive_ttfts)]
    records += [streamed(RequestClass.LONG_PREFILL, i, t, max_tokens=8) for i, t in enumerate(long_ttfts)]
    return TrafficResult.build(PLAN, records, wall_s=10.0, stopped_by="completed")


def sweep_report() -> SweepReport:
    shared = result([0.1, 0.9, 2.0], [1.0, 2.0])
    wc = result([0.05, 0.1, None], [1.0, 9.0])
    return sweep_of({"shared": profile_run(class_rows(shared)), "work-conserving": profile_run(class_rows(wc))})


def test_rows_count_good_requests_and_their_tokens_per_second() -> None:
    rows = sweep_report().profiles["shared"].classes
    interactive = rows["interactive"]
    # 0.1 s meets the 500 ms SLO; 0.9 s and 2.0 s do not.
    assert interactive.good == 1 and interactive.goodput == round(1 / 3, 4)
    assert interactive.useful_tokens_per_s == 4 / 10.0
    assert interactive.ttft_samples_ms == [100.0, 900.0, 2000.0]
    assert rows["long_prefill"].good == 2 and rows["long_prefill"].useful_tokens_per_s == 16 / 10.0
    assert not interactive.gate_passed


def test_the_goal_compares_interactive_p99_and_long_prefill_good_requests_with_the_shared_pool() -> None:
    report = sweep_report()
    goal = compare_to(report.profiles, reference="shared", candidate="work-conserving")
    assert goal is not None
    shared_p99 = report.profiles["shared"].classes["interactive"].ttft_ms.p99
    wc_p99 = report.profiles["work-conserving"].classes["interactive"].ttft_ms.p99
    assert shared_p99 is not None and wc_p99 is not None
    assert goal.interactive_ttft_p99_ratio == round(wc_p99 / shared_p99, 3)
    assert goal.long_prefill_good_ratio == 0.5
    # No batch traffic in either run: nothing to compare, said as None rather than a made-up ratio.
    assert goal.batch_good_ratio is None
    assert compare_to(report.profiles, reference="shared", candidate="missing") is None


def test_markdown_has_a_row_per_profile_and_class(tmp_path: Path) -> None:
    text = render_markdown(sweep_report())
    lines = text.split("\n\n")[0].splitlines()
    assert lines[0].startswith("| engine | profile | class |")
    assert len(lines) == 2 + 4
    assert "| work-conserving | interactive | 3 | 1 |" in text
    # No x-forge-pool answered in these records: the pool column says unknown rather than guessing.
    assert lines[2].endswith("| unknown 3 |")


def test_plots_are_png_files(tmp_path: Path) -> None:
    paths = write_plots(sweep_report(), tmp_path)
    assert [p.name for p in paths] == ["ttft-cdf.png", "goodput.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def repeated_report() -> SweepReport:
    """Two valid repetitions of shared and work-conserving, as run_sweep records them."""
    runs = [
        {"shared": result([0.1, 0.9, 2.0], [1.0, 2.0]), "work-conserving": result([0.05, 0.1, 0.2], [1.0, 9.0])},
        {"shared": result([0.1, 0.2, 3.0], [1.0, 3.0]), "work-conserving": result([0.05, 0.1, 0.3], [1.0, 8.0])},
    ]
    repetitions = []
    for i, profiles in enumerate(runs):
        rep = repetition(
            i,
            {name: profile_run(class_rows(r), repetition=i, load=(1.0 + i, 2.5)) for name, r in profiles.items()},
            valid=True,
        )
        rep.order = rep.order[i:] + rep.order[:i]
        repetitions.append(rep)
    agg = aggregate(repetitions)
    return sweep_of(
        repetitions[0].profiles,
        repeat=2,
        seeds=[7, 8],
        repetitions=repetitions,
        aggregate=agg,
        claims=judge(agg),
    )


def test_a_repeated_sweep_shows_medians_and_spreads_and_the_claims() -> None:
    report = repeated_report()
    text = render_markdown(report)
    lines = text.splitlines()
    assert lines[0] == (
        "| engine | profile | class | runs | TTFT p99 ms median [min-max] | ITL p99 ms median [min-max] | "
        "goodput median [min-max] | gate passed |"
    )
    assert report.aggregate is not None
    shared = report.aggregate["shared"].classes["interactive"].ttft_p99_ms
    assert shared.n == 2 and shared.min is not None and shared.max is not None and shared.min < shared.max
    assert shared.median is not None
    row = f"| vllm | shared | interactive | 2 | {shared.median:.0f} [{shared.min:.0f}-{shared.max:.0f}] |"
    assert row in text
    assert "| vllm | shared | interactive | 2 |" in text and "| 0 of 2 |" in text
    assert "host load average (1 min) at traffic start->end: shared#1 1.00->2.50" in text
    assert "work-conserving#2 2.00->2.50" in text
    claims_at = lines.index("## Claims")
    assert lines[claims_at + 2].startswith("- shared fails the interactive gate: HOLDS (")
    assert sum("NOT RUN" in line for line in lines[claims_at:]) == 5


def test_a_single_run_keeps_its_table_and_adds_the_claims() -> None:
    report = sweep_report()
    before = render_markdown(report)
    report.claims = judge(aggregate([repetition(0, report.profiles)]))
    after = render_markdown(report)
    assert after.startswith(before)
    assert "\n## Claims\n" in after and "shared fails the interactive gate: HOLDS" in after


def full_sweep(names: list[str]) -> SweepReport:
    """Every class measured, every request good: the bars reach the top of the axes, where a legend drawn
    inside them would sit, and the load in the title is as long as the sweep's own."""
    plan = TrafficPlan.model_validate(
        {
            "model": "m",
            "max_model_len": 1024,
            **{c.value: {"count": 4, "rate_per_s": 1.0, "max_tokens": 4} for c in RequestClass},
        }
    )
    records = [streamed(c, i, 0.05 * (i + 1)) for c in RequestClass for i in range(4)]
    rows = class_rows(TrafficResult.build(plan, records, wall_s=10.0, stopped_by="completed"))
    load = (
        "interactive 2/s, rag 0.5/s, long_prefill 0.25/s, agent 0.2/s, batch 0.1/s, slow_stream 0.2/s; "
        "60 s, seed 11; 4 CPUs per profile"
    )
    return sweep_of({name: profile_run(rows) for name in names}, load=load)


def drawn(figure: Figure) -> Figure:
    """The figure laid out as savefig lays it out (constrained layout runs at draw time)."""
    figure.draw_without_rendering()
    return figure


@pytest.mark.parametrize("names", [["shared", "work-conserving"], list(ORDER)], ids=["two-profiles", "seven"])
def test_the_goodput_plot_keeps_title_and_legend_on_the_canvas_and_off_the_bars(names: list[str]) -> None:
    figure = goodput_figure(full_sweep(names))
    drawn(figure)
    canvas = figure.bbox
    (title,) = figure.texts
    (legend,) = figure.legends
    (axes,) = figure.axes
    for artist in (title, legend, *axes.get_xticklabels(), axes.yaxis.label):
        box = artist.get_window_extent()
        assert canvas.x0 <= box.x0 and box.x1 <= canvas.x1 and canvas.y0 <= box.y0 and box.y1 <= canvas.y1, artist
    bars = [bar.get_window_extent() for bar in axes.patches]
    assert len(bars) == len(names) * len(RequestClass)
    assert max(bar.y1 for bar in bars) > axes.get_window_extent().y1 * 0.9, "the bars reach the top"
    legend_box = legend.get_window_extent()
    assert not any(legend_box.overlaps(bar) for bar in bars)
    assert not legend_box.overlaps(title.get_window_extent())


def test_the_ttft_plot_keeps_its_legend_below_the_panels_and_every_profile_in_it() -> None:
    figure = ttft_cdf_figure(full_sweep(list(ORDER)))
    drawn(figure)
    (title,) = figure.texts
    (legend,) = figure.legends
    canvas = figure.bbox
    for artist in (title, legend):
        box = artist.get_window_extent()
        assert canvas.x0 <= box.x0 and box.x1 <= canvas.x1 and canvas.y0 <= box.y0 and box.y1 <= canvas.y1, artist
    legend_box = legend.get_window_extent()
    panels = [axes.get_window_extent() for axes in figure.axes if axes.get_visible() and axes.axison]
    assert len(panels) == len(RequestClass)
    assert not any(legend_box.overlaps(panel) for panel in panels)
    assert [text.get_text() for text in legend.get_texts()] == list(ORDER)
