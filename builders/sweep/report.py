"""The sweep's report: profile × class rows, its JSON, a table for the terminal and Markdown, and the plots."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.table import Table

from builders.router.classes import ALL_CLASSES, RequestClass
from builders.sweep.claims import claim_lines
from builders.traffic.results import TrafficResult

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


def class_rows(result: TrafficResult) -> dict[str, dict[str, Any]]:
    """Per planned class: the summary's numbers plus what a sweep compares profiles by.

    `good` counts requests that met every SLO of their class; `useful_tokens_per_s` is their output tokens
    over the run's wall time; `served_by` counts requests per answering pool (where spill put them). Every request sends ignore_eos, so a good request produced exactly its
    max_tokens. `ttft_samples_ms` (successful requests, sorted) feed the CDF plot.
    """
    rows: dict[str, dict[str, Any]] = {}
    for request_class, summary in result.summaries.items():
        slo = result.plan.for_class(request_class).slo
        records = [r for r in result.records if r.request_class is request_class]
        good = [r for r in records if r.meets(slo)]
        ttfts = sorted(round(t * 1000, 3) for r in records if (t := r.ttft_s) is not None)
        rows[request_class.value] = {
            "requests": summary.requests,
            "errors": summary.errors,
            "ttft_ms": summary.ttft_ms.as_json(),
            "itl_ms": summary.itl_ms.as_json(),
            "goodput": round(summary.goodput, 4),
            "good": len(good),
            "gate_passed": summary.gate_passed,
            "useful_tokens_per_s": round(sum(r.max_tokens for r in good) / result.wall_s, 2) if result.wall_s else 0.0,
            "served_by": dict(summary.served_by),
            "ttft_samples_ms": ttfts,
        }
    return rows


def compare_to(
    profiles: Mapping[str, Mapping[str, Any]], *, reference: str, candidate: str
) -> dict[str, float | None] | None:
    """The work-conserving goal's two ratios against the reference (shared) pool: interactive TTFT p99 and
    long_prefill goodput (good requests; the same arrivals were sent to both)."""
    if reference not in profiles or candidate not in profiles:
        return None
    ref = profiles[reference]["classes"]
    cand = profiles[candidate]["classes"]

    def ratio(ours: float | None, theirs: float | None) -> float | None:
        if ours is None or theirs in (None, 0):
            return None
        return round(ours / theirs, 3)

    def good_ratio(request_class: RequestClass) -> float | None:
        name = request_class.value
        if name not in cand or name not in ref:
            return None
        return ratio(cand[name].get("good"), ref[name].get("good"))

    interactive = RequestClass.INTERACTIVE.value
    return {
        "interactive_ttft_p99_ratio": ratio(
            cand.get(interactive, {}).get("ttft_ms", {}).get("p99"),
            ref.get(interactive, {}).get("ttft_ms", {}).get("p99"),
        )
        if interactive in cand and interactive in ref
        else None,
        "long_prefill_good_ratio": good_ratio(RequestClass.LONG_PREFILL),
        # Not part of the goal, shown so that a profile cannot meet it by starving the other bulk class.
        "batch_good_ratio": good_ratio(RequestClass.BATCH),
    }


def judge_validity(
    profiles: Mapping[str, Mapping[str, Any]], *, reference: str, floor: float, names: list[str]
) -> dict[str, Any]:
    """Whether the run compares anything: the reference profile (or the first that ran) must answer at least
    `floor` of the requests it was sent without error. Below it every profile is overloaded, and a ranking of
    their failures says nothing about their policies."""
    name = reference if reference in profiles else (names[0] if names else None)
    if name is None:
        return {"valid": False, "reference": None, "served_fraction": None, "floor": floor, "why": "no profile ran"}
    rows = profiles[name]["classes"].values()
    sent = sum(row["requests"] for row in rows)
    answered = sum(row["requests"] - row["errors"] for row in rows)
    fraction = answered / sent if sent else 0.0
    valid = sent > 0 and fraction >= floor
    why = (
        f"{name} answered {answered} of {sent} requests ({fraction:.0%}), at least the floor of {floor:.0%}"
        if valid
        else f"{name} answered {answered} of {sent} requests ({fraction:.0%}), under the floor of {floor:.0%}: "
        "the offered load is beyond this host, every profile is overloaded and the table ranks failures"
    )
    return {"valid": valid, "reference": name, "served_fraction": round(fraction, 4), "floor": floor, "why": why}


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """What the table alone does not say: the dtype served, the calibration, and whether the run is valid."""
    lines = []
    dtype = report.get("dtype") or {}
    if dtype:
        lines.append(f"dtype {dtype['dtype']} on {dtype['cpu']} ({dtype['isa']}): {dtype['reason']}")
    calibration = report.get("calibration") or {}
    if calibration.get("calibrated"):
        capacity = calibration["capacity"]
        decode = ", ".join(f"{v} tok/s at batch {b}" for b, v in capacity["decode_tokens_per_s"].items())
        lines.append(
            f"calibration{' of ' + calibration['engine'] if 'engine' in calibration else ''} on {capacity['replica']} (cpus {capacity['cpus']}): prefill "
            f"{capacity['prefill_tokens_per_s']} tok/s, decode {decode}; configured load "
            f"{calibration['configured_utilisation']}x of {calibration['replicas_worth']:g} replica(s), rates "
            f"x{calibration['applied_factor']:g} for {calibration['load_fraction']:g} of capacity"
            + (" (held up by the per-class floor)" if calibration.get("clamped") else "")
        )
        lines += _sizing_lines(report, calibration)
    elif calibration:
        lines.append(f"calibration off: configured rates x{calibration.get('applied_factor', 1.0):g}")
    for kind, own in (calibration.get("engines") or {}).items():
        if own.get("calibrated"):
            capacity = own["capacity"]
            decode = ", ".join(f"{v} tok/s at batch {b}" for b, v in capacity["decode_tokens_per_s"].items())
            lines.append(
                f"calibration of {kind} on {capacity['replica']} (cpus {capacity['cpus']}): prefill "
                f"{capacity['prefill_tokens_per_s']} tok/s, decode {decode}; its rates x{own['applied_factor']:g} "
                f"for {own['load_fraction']:g} of its own capacity"
                + (" (held up by the per-class floor)" if own.get("clamped") else "")
            )
    loads = _load_line(report)
    if loads:
        lines.append(loads)
    validity = report.get("validity") or {}
    if validity:
        lines.append(("valid: " if validity["valid"] else "INVALID RUN: ") + validity["why"])
    return lines


def _load_line(report: Mapping[str, Any]) -> str:
    """The host's 1-minute load average as each profile run's traffic started and ended, in running order."""
    runs = []
    for repetition in report.get("repetitions") or []:
        for name in repetition.get("order", []):
            load = repetition["profiles"][name].get("load_average_1m") or {}
            start, end = (load.get(k) for k in ("start", "end"))
            label = f"{name}#{repetition['repetition'] + 1}" if report.get("repeat", 1) > 1 else name
            runs.append(f"{label} {_num(start)}->{_num(end)}")
    return "host load average (1 min) at traffic start->end: " + ", ".join(runs) if runs else ""


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _sizing_lines(report: Mapping[str, Any], calibration: Mapping[str, Any]) -> list[str]:
    """What calibration kept (every class's arrivals in the window) and what it took off (the model's size)."""
    sizing = calibration.get("sizing") or {}
    if not sizing:
        return []
    arrivals = ", ".join(f"{name} {n}" for name, n in sizing["arrivals"].items())
    lines = [
        f"arrivals in the {calibration.get('window_s', sizing['window_s']):g} s window (min {sizing['min_arrivals']}): {arrivals}"
    ]
    model = report.get("model") or calibration.get("model") or {}
    for resize in calibration.get("resized", []):
        was, now = resize["from"], resize["to"]
        lines.append(
            f"model resized for this host: {was['num_hidden_layers']} layers of {was['hidden_size']} -> "
            f"{now['num_hidden_layers']} of {now['hidden_size']} (the rates alone would have thinned classes away)"
        )
    if model and not calibration.get("resized"):
        lines.append(f"model: {model['num_hidden_layers']} layers of {model['hidden_size']}, not resized in this run")
    if "over_fraction" in calibration:
        lines.append(
            f"load above the fraction asked for: an estimated {calibration['over_fraction']:g} of capacity "
            "(no class was thinned below its minimum to hide it)"
        )
    return lines


def _pair(values: Mapping[str, float | None] | None) -> str:
    values = values or {}
    return " / ".join("-" if values.get(q) is None else f"{values[q]:.0f}" for q in ("p50", "p99"))


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


def table_rows(report: Mapping[str, Any]) -> list[list[str]]:
    out = []
    for name, profile in report["profiles"].items():
        for class_name in [c.value for c in ALL_CLASSES]:
            row = profile["classes"].get(class_name)
            if row is None:
                continue
            out.append(
                [
                    # Reports written before the engine axis ran vLLM only.
                    str(profile.get("engine", "vllm")),
                    name,
                    class_name,
                    str(row["requests"]),
                    str(row["errors"]),
                    _pair(row["ttft_ms"]),
                    _pair(row["itl_ms"]),
                    f"{row['goodput']:.2f} ({row['good']})",
                    "pass" if row["gate_passed"] else "FAIL",
                    f"{row['useful_tokens_per_s']:.1f}",
                    ", ".join(f"{pool} {n}" for pool, n in row.get("served_by", {}).items()) or "-",
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


def _spread(value: Mapping[str, Any] | None, digits: int) -> str:
    if not value or value.get("median") is None:
        return "-"
    text = f"{value['median']:.{digits}f}"
    return text + (f" [{value['min']:.{digits}f}-{value['max']:.{digits}f}]" if value["n"] > 1 else "")


def repeated_rows(report: Mapping[str, Any]) -> list[list[str]]:
    """A repeated sweep's rows: per profile × class the median and min-max over its valid repetitions."""
    out = []
    for name, profile in report["aggregate"].items():
        engine = str(report["profiles"].get(name, {}).get("engine", "vllm"))
        for class_name in [c.value for c in ALL_CLASSES]:
            row = profile["classes"].get(class_name)
            if row is None:
                continue
            out.append(
                [
                    engine,
                    name,
                    class_name,
                    str(row["runs"]),
                    _spread(row["ttft_p99_ms"], 0),
                    _spread(row["itl_p99_ms"], 0),
                    _spread(row["goodput"], 2),
                    f"{row['gate_passes']} of {row['runs']}",
                ]
            )
    return out


def _columns_and_rows(report: Mapping[str, Any]) -> tuple[tuple[str, ...], list[list[str]]]:
    # One run keeps today's table; a repeated sweep shows medians and spreads instead of one run's numbers.
    if report.get("repeat", 1) > 1 and "aggregate" in report:
        return REPEATED_COLUMNS, repeated_rows(report)
    return COLUMNS, table_rows(report)


def render_table(report: Mapping[str, Any]) -> Table:
    table = Table(title=f"forge sweep ({report['load']})")
    columns, rows = _columns_and_rows(report)
    for column in columns:
        table.add_column(column, justify="left" if column in ("engine", "profile", "class", "gate") else "right")
    for row in rows:
        table.add_row(*row)
    validity = report.get("validity") or {}
    if validity and not validity["valid"]:
        table.caption = f"INVALID RUN: {validity['why']}"
    return table


def render_markdown(report: Mapping[str, Any]) -> str:
    columns, rows = _columns_and_rows(report)
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    notes = summary_lines(report)
    text = "\n".join(lines) + "\n" + ("\n" + "\n".join(f"- {n}" for n in notes) + "\n" if notes else "")
    claims = report.get("claims")
    if claims:
        text += (
            "\n## Claims\n\n" + "\n".join(f"- {line.removeprefix('claim: ')}" for line in claim_lines(claims)) + "\n"
        )
    return text


def write_plots(report: Mapping[str, Any], directory: Path) -> list[Path]:
    """ttft-cdf.png (one panel per class, one line per profile) and goodput.png (good requests per class,
    one bar group per profile). Drawn off-screen, so it works on a CI runner without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profiles = report["profiles"]
    classes = [c.value for c in ALL_CLASSES if any(c.value in p["classes"] for p in profiles.values())]
    paths = []

    columns = 3
    rows = max(1, (len(classes) + columns - 1) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    for panel, class_name in zip(axes.flat, classes, strict=False):
        for name, profile in profiles.items():
            samples = profile["classes"].get(class_name, {}).get("ttft_samples_ms") or []
            sent = profile["classes"].get(class_name, {}).get("requests") or 0
            if not samples or not sent:
                continue
            # The CDF is over requests *sent*: failed ones never reach 1.0, so a curve that stops short shows
            # the errors as well as the latency.
            ys = [(i + 1) / sent for i in range(len(samples))]
            panel.step(samples, ys, where="post", label=name)
        panel.set_title(class_name)
        panel.set_xscale("log")
        panel.set_xlabel("TTFT (ms, log)")
        panel.set_ylabel("fraction of requests sent")
        panel.set_ylim(0, 1.02)
        panel.grid(True, alpha=0.3)
    for panel in list(axes.flat)[len(classes) :]:
        panel.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4) or 1)
    fig.suptitle(f"TTFT CDF per class ({report['load']})")
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    path = directory / "ttft-cdf.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    paths.append(path)

    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(profiles) + 4), 4.5))
    width = 0.8 / max(1, len(classes))
    for offset, class_name in enumerate(classes):
        xs = [i + offset * width for i in range(len(profiles))]
        ys = [p["classes"].get(class_name, {}).get("goodput", 0.0) for p in profiles.values()]
        ax.bar(xs, ys, width=width, label=class_name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(profiles))], list(profiles), rotation=15)
    ax.set_ylabel("goodput (requests meeting their SLOs / sent)")
    ax.set_ylim(0, 1.05)
    ax.legend(ncol=3, fontsize="small")
    ax.set_title(f"Goodput per profile ({report['load']})")
    fig.tight_layout()
    path = directory / "goodput.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    paths.append(path)
    return paths
