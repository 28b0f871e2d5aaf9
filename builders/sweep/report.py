"""The sweep's report: profile × class rows, its JSON, a table for the terminal and Markdown, and the plots."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from builders.router.classes import ALL_CLASSES, RequestClass
from builders.smoke.report import Quantiles
from builders.sweep.claims import claim_lines
from builders.sweep.report_model import (
    Calibration,
    ClassRow,
    ClassSpread,
    Goal,
    ProfileRun,
    Spread,
    SweepReport,
    Validity,
)
from builders.traffic.results import TrafficResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROW_KEYS = (
    "requests",
    "errors",
    "ttft_ms",
    "itl_ms",
    "goodput",
    "good",
    "gate_passed",
    "useful_tokens_per_s",
    "served_by",
    "ttft_samples_ms",
)


def class_rows(result: TrafficResult) -> dict[str, ClassRow]:
    """Per planned class: the summary's numbers plus what a sweep compares profiles by.

    `good` counts requests that met every SLO of their class; `useful_tokens_per_s` is their output tokens
    over the run's wall time; `served_by` counts requests per answering pool (where spill put them). Every request sends ignore_eos, so a good request produced exactly its
    max_tokens. `ttft_samples_ms` (successful requests, sorted) feed the CDF plot.
    """
    rows: dict[str, ClassRow] = {}
    for request_class, summary in result.summaries.items():
        slo = result.plan.for_class(request_class).slo
        records = [r for r in result.records if r.request_class is request_class]
        good = [r for r in records if r.meets(slo)]
        ttfts = sorted(round(t * 1000, 3) for r in records if (t := r.ttft_s) is not None)
        rows[request_class.value] = ClassRow(
            requests=summary.requests,
            errors=summary.errors,
            ttft_ms=Quantiles.model_validate(summary.ttft_ms.as_json()),
            itl_ms=Quantiles.model_validate(summary.itl_ms.as_json()),
            goodput=round(summary.goodput, 4),
            good=len(good),
            gate_passed=summary.gate_passed,
            useful_tokens_per_s=round(sum(r.max_tokens for r in good) / result.wall_s, 2) if result.wall_s else 0.0,
            served_by=dict(summary.served_by),
            ttft_samples_ms=ttfts,
        )
    return rows


def compare_to(profiles: Mapping[str, ProfileRun], *, reference: str, candidate: str) -> Goal | None:
    """The work-conserving goal's two ratios against the reference (shared) pool: interactive TTFT p99 and
    long_prefill goodput (good requests; the same arrivals were sent to both)."""
    if reference not in profiles or candidate not in profiles:
        return None
    ref = profiles[reference].classes
    cand = profiles[candidate].classes

    def ratio(ours: float | None, theirs: float | None) -> float | None:
        if ours is None or theirs in (None, 0):
            return None
        return round(ours / theirs, 3)

    def good_ratio(request_class: RequestClass) -> float | None:
        name = request_class.value
        if name not in cand or name not in ref:
            return None
        return ratio(cand[name].good, ref[name].good)

    interactive = RequestClass.INTERACTIVE.value
    return Goal(
        interactive_ttft_p99_ratio=ratio(cand[interactive].ttft_ms.p99, ref[interactive].ttft_ms.p99)
        if interactive in cand and interactive in ref
        else None,
        long_prefill_good_ratio=good_ratio(RequestClass.LONG_PREFILL),
        # Not part of the goal, shown so that a profile cannot meet it by starving the other bulk class.
        batch_good_ratio=good_ratio(RequestClass.BATCH),
    )


def judge_validity(profiles: Mapping[str, ProfileRun], *, reference: str, floor: float, names: list[str]) -> Validity:
    """Whether the run compares anything: the reference profile (or the first that ran) must answer at least
    `floor` of the requests it was sent without error. Below it every profile is overloaded, and a ranking of
    their failures says nothing about their policies."""
    name = reference if reference in profiles else (names[0] if names else None)
    if name is None:
        return Validity(valid=False, reference=None, served_fraction=None, floor=floor, why="no profile ran")
    rows = profiles[name].classes.values()
    sent = sum(row.requests for row in rows)
    answered = sum(row.requests - row.errors for row in rows)
    fraction = answered / sent if sent else 0.0
    valid = sent > 0 and fraction >= floor
    why = (
        f"{name} answered {answered} of {sent} requests ({fraction:.0%}), at least the floor of {floor:.0%}"
        if valid
        else f"{name} answered {answered} of {sent} requests ({fraction:.0%}), under the floor of {floor:.0%}: "
        "the offered load is beyond this host, every profile is overloaded and the table ranks failures"
    )
    return Validity(valid=valid, reference=name, served_fraction=round(fraction, 4), floor=floor, why=why)


def summary_lines(report: SweepReport) -> list[str]:
    """What the table alone does not say: the dtype served, the calibration, and whether the run is valid."""
    lines = []
    dtype = report.dtype
    if dtype:
        lines.append(f"dtype {dtype.dtype} on {dtype.cpu} ({dtype.isa}): {dtype.reason}")
    calibration = report.calibration
    capacity = calibration.capacity
    if calibration.calibrated and capacity is not None:
        decode = ", ".join(f"{v} tok/s at batch {b}" for b, v in capacity.decode_tokens_per_s.items())
        of = f" of {calibration.engine}" if calibration.engine else ""
        lines.append(
            f"calibration{of} on {capacity.replica} (cpus {capacity.cpus}): prefill "
            f"{capacity.prefill_tokens_per_s} tok/s, decode {decode}; configured load "
            f"{calibration.configured_utilisation}x of {calibration.replicas_worth or 0:g} replica(s), rates "
            f"x{calibration.applied_factor or 0:g} for {calibration.load_fraction or 0:g} of capacity"
            + (" (held up by the per-class floor)" if calibration.clamped else "")
        )
        lines += _sizing_lines(report, calibration)
    elif calibration.calibrated is not None:
        applied = 1.0 if calibration.applied_factor is None else calibration.applied_factor
        lines.append(f"calibration off: configured rates x{applied:g}")
    for engine, own in (calibration.engines or {}).items():
        measured = own.capacity
        if own.calibrated and measured is not None:
            decode = ", ".join(f"{v} tok/s at batch {b}" for b, v in measured.decode_tokens_per_s.items())
            lines.append(
                f"calibration of {engine} on {measured.replica} (cpus {measured.cpus}): prefill "
                f"{measured.prefill_tokens_per_s} tok/s, decode {decode}; its rates x{own.applied_factor or 0:g} "
                f"for {own.load_fraction or 0:g} of its own capacity"
                + (" (held up by the per-class floor)" if own.clamped else "")
            )
    loads = _load_line(report)
    if loads:
        lines.append(loads)
    validity = report.validity
    if validity:
        lines.append(("valid: " if validity.valid else "INVALID RUN: ") + validity.why)
    return lines


def _load_line(report: SweepReport) -> str:
    """The host's 1-minute load average as each profile run's traffic started and ended, in running order."""
    runs = []
    for repetition in report.repetitions:
        for name in repetition.order:
            load = repetition.profiles[name].load_average_1m
            label = f"{name}#{repetition.repetition + 1}" if report.repeat > 1 else name
            runs.append(f"{label} {_num(load.start)}->{_num(load.end)}")
    return "host load average (1 min) at traffic start->end: " + ", ".join(runs) if runs else ""


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _sizing_lines(report: SweepReport, calibration: Calibration) -> list[str]:
    """What calibration kept (every class's arrivals in the window) and what it took off (the model's size)."""
    sizing = calibration.sizing
    if not sizing:
        return []
    arrivals = ", ".join(f"{name} {n}" for name, n in sizing.arrivals.items())
    window = calibration.window_s if calibration.window_s is not None else sizing.window_s
    lines = [f"arrivals in the {window:g} s window (min {sizing.min_arrivals}): {arrivals}"]
    model = report.model or calibration.model
    for resize in calibration.resized or []:
        was, now = resize.from_, resize.to
        lines.append(
            f"model resized for this host: {was.num_hidden_layers} layers of {was.hidden_size} -> "
            f"{now.num_hidden_layers} of {now.hidden_size} (the rates alone would have thinned classes away)"
        )
    if model and not calibration.resized:
        lines.append(f"model: {model.num_hidden_layers} layers of {model.hidden_size}, not resized in this run")
    if calibration.over_fraction is not None:
        lines.append(
            f"load above the fraction asked for: an estimated {calibration.over_fraction:g} of capacity "
            "(no class was thinned below its minimum to hide it)"
        )
    return lines


def _pair(values: Quantiles) -> str:
    return " / ".join("-" if v is None else f"{v:.0f}" for v in (values.p50, values.p99))


COLUMNS = (
    "engine",
    "profile",
    "class",
    "req",
    "err",
    "TTFT p50 / p99 ms",
    "ITL p50 / p99 ms",
    "goodput",
    "gate",
    "useful tok/s",
    "served by",
)


def table_rows(report: SweepReport) -> list[list[str]]:
    out = []
    for name, profile in report.profiles.items():
        for class_name in [c.value for c in ALL_CLASSES]:
            row = profile.classes.get(class_name)
            if row is None:
                continue
            out.append(
                [
                    profile.engine,
                    name,
                    class_name,
                    str(row.requests),
                    str(row.errors),
                    _pair(row.ttft_ms),
                    _pair(row.itl_ms),
                    f"{row.goodput:.2f} ({row.good})",
                    "pass" if row.gate_passed else "FAIL",
                    f"{row.useful_tokens_per_s:.1f}",
                    ", ".join(f"{pool} {n}" for pool, n in row.served_by.items()) or "-",
                ]
            )
    return out


REPEATED_COLUMNS = (
    "engine",
    "profile",
    "class",
    "runs",
    "TTFT p99 ms median [min-max]",
    "ITL p99 ms median [min-max]",
    "goodput median [min-max]",
    "gate passed",
)


def _spread(value: Spread, digits: int) -> str:
    if value.median is None:
        return "-"
    text = f"{value.median:.{digits}f}"
    if value.n > 1 and value.min is not None and value.max is not None:
        text += f" [{value.min:.{digits}f}-{value.max:.{digits}f}]"
    return text


def repeated_rows(report: SweepReport) -> list[list[str]]:
    """A repeated sweep's rows: per profile × class the median and min-max over its valid repetitions."""
    out = []
    for name, profile in (report.aggregate or {}).items():
        run = report.profiles.get(name)
        engine = run.engine if run is not None else "vllm"
        for class_name in [c.value for c in ALL_CLASSES]:
            row: ClassSpread | None = profile.classes.get(class_name)
            if row is None:
                continue
            out.append(
                [
                    engine,
                    name,
                    class_name,
                    str(row.runs),
                    _spread(row.ttft_p99_ms, 0),
                    _spread(row.itl_p99_ms, 0),
                    _spread(row.goodput, 2),
                    f"{row.gate_passes} of {row.runs}",
                ]
            )
    return out


def _columns_and_rows(report: SweepReport) -> tuple[tuple[str, ...], list[list[str]]]:
    # One run keeps today's table; a repeated sweep shows medians and spreads instead of one run's numbers.
    if report.repeat > 1 and report.aggregate is not None:
        return REPEATED_COLUMNS, repeated_rows(report)
    return COLUMNS, table_rows(report)


def render_table(report: SweepReport) -> Table:
    table = Table(title=f"forge sweep ({report.load})")
    columns, rows = _columns_and_rows(report)
    for column in columns:
        table.add_column(column, justify="left" if column in ("engine", "profile", "class", "gate") else "right")
    for row in rows:
        table.add_row(*row)
    if report.validity and not report.validity.valid:
        table.caption = f"INVALID RUN: {report.validity.why}"
    return table


def render_markdown(report: SweepReport) -> str:
    columns, rows = _columns_and_rows(report)
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    notes = summary_lines(report)
    text = "\n".join(lines) + "\n" + ("\n" + "\n".join(f"- {n}" for n in notes) + "\n" if notes else "")
    if report.claims:
        text += (
            "\n## Claims\n\n"
            + "\n".join(f"- {line.removeprefix('claim: ')}" for line in claim_lines(report.claims))
            + "\n"
        )
    return text


# A title font of 12 pt averages about a tenth of an inch per character: a title wraps a little inside the
# figure's width.
TITLE_CHARS_PER_INCH = 9


def wrapped(text: str, figure_width_in: float) -> str:
    """`text` broken into lines that fit a figure `figure_width_in` inches wide (the load names every class)."""
    return textwrap.fill(text, width=max(30, int(figure_width_in * TITLE_CHARS_PER_INCH)), break_on_hyphens=False)


def ttft_cdf_figure(report: SweepReport) -> Figure:
    """One panel per class, one line per profile; the legend below the panels, the title wrapped above them."""
    from matplotlib.figure import Figure  # imported when a sweep draws: the CLI starts without it

    profiles = report.profiles
    classes = plotted_classes(report)
    columns = 3
    rows = max(1, (len(classes) + columns - 1) // columns)
    width = 5.0 * columns
    fig = Figure(figsize=(width, 3.6 * rows + 1.2), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False)
    for panel, class_name in zip(axes.flat, classes, strict=False):
        for index, (name, profile) in enumerate(profiles.items()):
            row = profile.classes.get(class_name)
            samples = (row.ttft_samples_ms or []) if row is not None else []
            sent = row.requests if row is not None else 0
            if not samples or not sent:
                continue
            # The CDF is over requests *sent*: failed ones never reach 1.0, so a curve that stops short shows
            # the errors as well as the latency.
            ys = [(i + 1) / sent for i in range(len(samples))]
            # One colour per profile in every panel, even where another profile measured nothing.
            panel.step(samples, ys, where="post", label=name, color=f"C{index % 10}")
        panel.set_title(class_name)
        panel.set_xscale("log")
        panel.set_xlabel("TTFT (ms, log)")
        panel.set_ylabel("fraction of requests sent")
        panel.set_ylim(0, 1.02)
        panel.grid(True, alpha=0.3)
    for panel in list(axes.flat)[len(classes) :]:
        panel.axis("off")
    # Every profile that drew a line once, in the report's order, whichever panel drew it first.
    drawn = {line.get_label(): line for panel in axes.flat for line in panel.get_lines()}
    names = [name for name in profiles if name in drawn]
    if names:
        fig.legend([drawn[n] for n in names], names, loc="outside lower center", ncol=min(len(names), 4))
    fig.suptitle(wrapped(f"TTFT CDF per class ({report.load})", width))
    return fig


def goodput_figure(report: SweepReport) -> Figure:
    """Good requests per class, one bar group per profile; the legend below the bars, the title wrapped."""
    from matplotlib.figure import Figure  # imported when a sweep draws: the CLI starts without it

    profiles = report.profiles
    classes = plotted_classes(report)
    width = max(9.0, 1.6 * len(profiles) + 5)
    fig = Figure(figsize=(width, 5.2), layout="constrained")
    ax = fig.subplots()
    bar = 0.8 / max(1, len(classes))
    for offset, class_name in enumerate(classes):
        xs = [i + offset * bar for i in range(len(profiles))]
        ys = [row.goodput if (row := p.classes.get(class_name)) else 0.0 for p in profiles.values()]
        ax.bar(xs, ys, width=bar, label=class_name)
    ax.set_xticks([i + 0.4 - bar / 2 for i in range(len(profiles))], list(profiles), rotation=15)
    ax.set_ylabel("goodput (requests meeting their SLOs / sent)")
    ax.set_ylim(0, 1.05)
    ax.grid(True, axis="y", alpha=0.3)
    if classes:
        fig.legend(loc="outside lower center", ncol=min(len(classes), 6), fontsize="small")
    fig.suptitle(wrapped(f"Goodput per profile ({report.load})", width))
    return fig


def plotted_classes(report: SweepReport) -> list[str]:
    """The classes any profile measured, in the router's order."""
    return [c.value for c in ALL_CLASSES if any(c.value in p.classes for p in report.profiles.values())]


def write_plots(report: SweepReport, directory: Path) -> list[Path]:
    """ttft-cdf.png and goodput.png, drawn off-screen (no display on a CI runner, no pyplot state)."""
    paths = []
    for name, draw in (("ttft-cdf.png", ttft_cdf_figure), ("goodput.png", goodput_figure)):
        path = directory / name
        draw(report).savefig(path, dpi=100)
        paths.append(path)
    return paths
