"""`forge kvlab check [--mutants] [--json]` and `forge kvlab rank`: the Hybrid KV lab on the command line."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from builders import log
from builders.errors import ForgeError, UsageError
from builders.kvlab.cases import CASES, REQUIRED_FEATURES, Case
from builders.kvlab.check import Outcome, run_all, uncovered
from builders.kvlab.layouts import LAYOUTS
from builders.kvlab.mutants import MutantOutcome, mutants, run_mutant


class KvlabFailed(ForgeError):
    """A case failed, a feature of the study's list has no case, or a planted bug survived."""

    # 1-15 are builders/errors.py's and builders/repro/errors.py's.
    exit_code = 16
    kind = "kv lab failed"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "kvlab",
        help="check KV-cache layouts against a dense attention oracle and rank them for GPU profiling",
        description="The Hybrid KV lab: a block pool with vLLM V1's semantics, four layouts of its KV (paged table, "
        "compact spans, virtual-contiguous, hybrid prefix-shared), a dense fp32 oracle over named cases, planted "
        "bugs each case set must catch, and a ranking of the layouts measured on this machine (NumPy, CPU).",
    )
    sub = parser.add_subparsers(dest="kvlab_command", metavar="ACTION", required=True)
    check = sub.add_parser("check", help="run every case against every layout (and, with --mutants, every planted bug)")
    check.add_argument("--mutants", action="store_true", help="also run each planted bug; fail if one survives")
    check.add_argument("--json", action="store_true", help="print the cases, their features and results as JSON")
    check.add_argument(
        "--layout", action="append", choices=list(LAYOUTS), default=None, help="only this layout (repeatable)"
    )
    check.set_defaults(func=run_check)
    rank = sub.add_parser("rank", help="measure each layout here and rank them for hardware profiling")
    rank.add_argument("--report", type=Path, default=Path("reports/kvlab"), metavar="DIR", help="output folder")
    rank.add_argument("--quick", action="store_true", help="shorter sequences and fewer steps (a smoke run)")
    rank.add_argument("--steps", type=int, default=None, help="decode steps timed per scenario")
    rank.add_argument("--no-plots", action="store_true", help="skip rank.png")
    rank.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu (default): count each layout's bytes and indirections, NumPy times only break ties; cuda: time "
        "the Triton kernels against the GPU's memory bandwidth, beside SDPA and FlashInfer",
    )
    rank.add_argument("--reps", type=int, default=20, help="with --device cuda: timed repetitions per layout")
    rank.set_defaults(func=run_rank)
    kernels = sub.add_parser(
        "kernels",
        help="run the Triton kernel of every layout on the kernel cases (the interpreter on a CPU, compiled on a GPU)",
    )
    kernels.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu: Triton's interpreter")
    kernels.add_argument("--mutants", action="store_true", help="also plant each kernel bug; fail if one survives")
    kernels.add_argument("--json", action="store_true", help="print the runs as JSON")
    kernels.set_defaults(func=run_kernels)


def _case_json(case: Case, outcomes: Sequence[Outcome]) -> dict[str, Any]:
    return {
        "name": case.name,
        "target": case.target,
        "features": list(case.features),
        "params": case.params,
        "tolerance": {"atol": case.atol, "rtol": case.rtol, "why": case.why},
        "results": {
            (o.layout or case.target): {"passed": o.passed, "detail": o.detail, "seconds": round(o.seconds, 3)}
            for o in outcomes
        },
    }


def _mutant_json(outcome: MutantOutcome) -> dict[str, Any]:
    m = outcome.mutant
    return {
        "target": m.target,
        "bug": m.bug,
        "what": m.why,
        "caught": outcome.caught_by is not None,
        "caught_by": outcome.caught_by,
        "detail": outcome.detail,
    }


def run_check(args: argparse.Namespace) -> int:
    out = log.Log()
    layouts = args.layout or list(LAYOUTS)
    start = time.monotonic()
    with out.step(f"{len(CASES)} cases × {len(layouts)} layouts"):
        outcomes = run_all(CASES, layouts)
    by_case: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by_case.setdefault(o.case, []).append(o)
    mutant_outcomes: list[MutantOutcome] = []
    if args.mutants:
        chosen = [m for m in mutants() if m.target in ("pool", "kernel") or m.target in layouts]
        with out.step(f"{len(chosen)} planted bugs"):
            mutant_outcomes = [run_mutant(m) for m in chosen]
    failed = [o for o in outcomes if not o.passed]
    survivors = [m for m in mutant_outcomes if m.caught_by is None]
    missing = uncovered()
    if args.json:
        report = {
            "cases": [_case_json(c, by_case[c.name]) for c in CASES],
            "coverage": {
                f: {"what": REQUIRED_FEATURES[f], "cases": [c.name for c in CASES if f in c.features]}
                for f in REQUIRED_FEATURES
            },
            "mutants": [_mutant_json(m) for m in mutant_outcomes],
            "summary": {
                "cases": len(CASES),
                "runs": len(outcomes),
                "passed": len(outcomes) - len(failed),
                "uncovered_features": missing,
                "mutants": len(mutant_outcomes),
                "mutants_caught": len(mutant_outcomes) - len(survivors),
                "seconds": round(time.monotonic() - start, 2),
            },
        }
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        _print_check(by_case, layouts, mutant_outcomes)
    problems = []
    if failed:
        problems.append(
            f"{len(failed)} of {len(outcomes)} case runs failed: "
            + ", ".join(f"{o.case} on {o.layout or 'the ' + o.case}" for o in failed[:6])
        )
    if missing:
        problems.append(f"no case covers {', '.join(missing)}")
    if survivors:
        problems.append("planted bugs survived: " + ", ".join(f"{m.mutant.target}/{m.mutant.bug}" for m in survivors))
    if problems:
        raise KvlabFailed(
            "; ".join(problems), hint="the failing case's detail says what differed; fix the layout (or the case) first"
        )
    summary = f"{len(outcomes)} case runs passed ({len(CASES)} cases, every feature covered)"
    if mutant_outcomes:
        summary += f"; {len(mutant_outcomes)} of {len(mutant_outcomes)} planted bugs caught"
    out.info(summary)
    return 0


def _print_check(
    by_case: dict[str, list[Outcome]], layouts: Sequence[str], mutant_outcomes: Sequence[MutantOutcome]
) -> None:
    rows = []
    for case in CASES:
        results = {o.layout: o for o in by_case[case.name]}
        cells = []
        for name in layouts:
            o = results.get(name) if case.target == "layouts" else None
            cells.append(("pass" if o.passed else "FAIL") if o else "")
        if case.target != "layouts":
            only = by_case[case.name][0]
            verdict = "pass" if only.passed else "FAIL"
        else:
            verdict = "pass" if all(o.passed for o in by_case[case.name]) else "FAIL"
        worst = max(o.worst_error for o in by_case[case.name])
        failing = next((o.detail for o in by_case[case.name] if not o.passed), "")
        rows.append(
            [
                case.name,
                case.target,
                ",".join(case.features),
                f"{case.atol:g}/{case.rtol:g}",
                *cells,
                verdict,
                f"{worst:.1e}",
                failing,
            ]
        )
    log.print_table(
        "kvlab cases (tolerance atol/rtol; worst |error| over runs)",
        ["case", "target", "features", "tol", *layouts, "verdict", "worst", "detail"],
        rows,
    )
    if mutant_outcomes:
        print()
        log.print_table(
            "planted bugs",
            ["target", "bug", "caught by", "what it gets wrong", "how it showed"],
            [
                [m.mutant.target, m.mutant.bug, m.caught_by or "SURVIVED", m.mutant.why, m.detail]
                for m in mutant_outcomes
            ],
        )


def _host() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import numpy

    return f"{model}, {platform.system()} {platform.machine()}, Python {platform.python_version()}, NumPy {numpy.__version__}"


def run_rank(args: argparse.Namespace) -> int:
    from builders.kvlab import rank

    if args.steps is not None and args.steps < 1:
        raise UsageError(f"--steps {args.steps}: time at least one decode step")
    if args.device == "cuda":
        return _rank_cuda(args)
    out = log.Log()
    with out.step("gate: cases and planted bugs per layout"):
        outcomes = run_all()
        planted = [run_mutant(m) for m in mutants() if m.target in LAYOUTS]
    survivors = {m.mutant.target for m in planted if m.caught_by is None}
    # Pool, oracle and format cases (layout None) gate every layout: they all read the same pool.
    gate = {
        name: all(o.passed for o in outcomes if o.layout in (name, None)) and name not in survivors for name in LAYOUTS
    }
    with out.step("measure every layout"):
        results = rank.run_ranking(quick=args.quick, steps=args.steps, progress=lambda line: out.info(line))
    rows = rank.rank(results, gate, quick=args.quick)
    args.report.mkdir(parents=True, exist_ok=True)
    host = _host()
    tables = CPU_LABEL + "\n\n" + render_rank(results, rows, quick=args.quick)
    (args.report / "rank.md").write_text(f"Host: {host}\n\n" + tables)
    (args.report / "rank.json").write_text(
        json.dumps({"host": host, "rank": rows, "measures": rank.as_json(results)}, indent=2) + "\n"
    )
    if not args.no_plots:
        rank.write_plots(results, args.report, quick=args.quick)
    print(f"host: {host}\n")
    print(tables)
    out.info(f"report: {args.report / 'rank.md'}, rank.json" + ("" if args.no_plots else ", rank.png"))
    return 0


def render_rank(results: Sequence[Any], rows: Sequence[dict[str, Any]], *, quick: bool = False) -> str:
    """Three Markdown tables: the scenarios as measured, what each layout did in them, and the rank."""
    from builders.kvlab.rank import BATCH, BLOCK_SIZE, CRITERIA, scenarios

    chosen = scenarios(quick)
    first = results[0].measures
    lines = [
        f"Scenarios (batch {BATCH}, block size {BLOCK_SIZE}, decode steps; fragmentation and sharing as measured in the pool):",
        "",
        "| scenario | context tokens | pool | blocks/request | contiguous runs/request | KV slots in shared blocks |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for s in chosen:
        m = first[s.name]
        lines.append(
            f"| {s.name} | ~{s.seq_len} | {s.fragment or 'fresh'} | {m.blocks_per_request:.1f} | "
            f"{m.runs_per_request:.1f} | {m.shared_fraction:.0%} |"
        )

    def label(s: Any) -> str:
        return {"length": f"L={s.seq_len}", "fragmentation": s.fragment or "fresh", "sharing": f"share {s.label}"}[
            s.axis
        ]

    head = [
        "layout",
        *[f"ms {label(s)}" for s in chosen],
        "meta B/req (worst)",
        "indirections/req (worst)",
        "KV MiB read/step (top share)",
        "KiB copied/step",
    ]
    lines += ["", "Attention ms per decode step (fastest of the steps) and what each layout read:", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    top_share = next(s.name for s in reversed(chosen) if s.axis == "sharing")
    for r in results:
        ms = r.measures
        cells = [f"{ms[s.name].ms_per_step:.2f}" for s in chosen]
        cells += [
            f"{max(m.metadata_bytes_per_request for m in ms.values()):.0f}",
            f"{max(m.indirections_per_request for m in ms.values()):.0f}",
            f"{ms[top_share].kv_bytes_read_per_step / 2**20:.2f}",
            f"{max(m.kv_bytes_copied_per_step for m in ms.values()) / 1024:.0f}",
        ]
        lines.append("| " + " | ".join([r.layout, *cells]) + " |")
    units = {"metadata": (1, "B"), "kv_read": (2**20, "MiB"), "indirections": (1, "")}
    rank_head = ["place", "layout", "gate", *[why for _, why in CRITERIA], "score (sum of ranks)", "ms/step at longest"]
    lines += ["", "Rank for profiling (gate first, then the sum of the criteria's ranks; CPU time breaks ties):", ""]
    lines += ["| " + " | ".join(rank_head) + " |", "|" + " --- |" * len(rank_head)]
    for row in rows:
        crit = []
        for key, _ in CRITERIA:
            scale, unit = units[key]
            crit.append(
                f"{row['values'][key] / scale:.{2 if scale > 1 else 0}f} {unit} (rank {row['ranks'][key]:g})".replace(
                    "  ", " "
                )
            )
        place = str(row["place"]) if row["place"] else "—"
        gate = "pass" if row["gate"] else "FAIL"
        lines.append(
            "| "
            + " | ".join([place, row["layout"], gate, *crit, f"{row['score']:g}", f"{row['ms_at_longest']:.2f}"])
            + " |"
        )
    return "\n".join(lines) + "\n"


CPU_LABEL = (
    "What this ranks: bytes and indirections each layout's attention reads, counted; the times are NumPy on this "
    "CPU and only break ties. It is not a ranking of speed: `forge kvlab rank --device cuda` times the Triton "
    "kernels on a GPU against its memory bandwidth."
)


def _rank_cuda(args: argparse.Namespace) -> int:
    """The Triton kernels timed on the GPU (gpu_bench), ranked by their step times."""
    from builders.kvlab.gpu_bench import unavailable

    why = unavailable()
    if why:
        raise UsageError(f"--device cuda: {why}", hint="run on a machine with a GPU, or leave --device at cpu")
    if args.reps < 1:
        raise UsageError(f"--reps {args.reps}: time at least one repetition")
    from builders.kvlab.triton_layouts import load_kernels

    load_kernels(interpret=False)
    from builders.kvlab import gpu_bench

    out = log.Log()
    scenarios = gpu_bench.SCENARIOS[:2] if args.quick else gpu_bench.SCENARIOS
    with out.step(f"time {len(scenarios)} scenarios × 4 layouts, SDPA and FlashInfer"):
        report = gpu_bench.run_bench(
            "cuda",
            scenarios=scenarios,
            spec=gpu_bench.SPEC,
            reps=args.reps,
            copy_bytes=2**30,
            deadline=time.monotonic() + 3600,
            progress=lambda line: out.info(line),
        )
    args.report.mkdir(parents=True, exist_ok=True)
    text = gpu_bench.render(report)
    (args.report / "rank-cuda.md").write_text(text)
    (args.report / "rank-cuda.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(text)
    failed = [f"{s}/{n}" for s, row in report["scenarios"].items() for n, r in row["layouts"].items() if "failed" in r]
    if failed:
        raise KvlabFailed(f"layouts differ from the oracle on the GPU: {', '.join(failed)}")
    out.info(f"report: {args.report / 'rank-cuda.md'}, rank-cuda.json")
    return 0


def run_kernels(args: argparse.Namespace) -> int:
    """The kernel cases on every Triton layout; with --mutants, each planted kernel bug against every case."""
    if args.device == "cuda":
        from builders.kvlab.gpu_bench import unavailable

        why = unavailable()
        if why:
            raise UsageError(f"--device cuda: {why}", hint="leave --device at cpu to run Triton's interpreter")
    else:
        import importlib.util

        missing = [m for m in ("torch", "triton") if importlib.util.find_spec(m) is None]
        if missing:
            raise UsageError(
                f"the Triton kernels need {' and '.join(missing)}", hint="pip install -e '.[kernels]' (a CPU torch)"
            )
    from builders.kvlab.triton_layouts import load_kernels

    load_kernels(interpret=args.device == "cpu")
    from builders.kvlab.kernel_cases import KERNEL_CASES, run_kernel_cases, run_kernel_mutant
    from builders.kvlab.triton_layouts import KERNEL_BUGS, TRITON_LAYOUTS

    out = log.Log()
    with out.step(f"{len(KERNEL_CASES)} kernel cases × {len(TRITON_LAYOUTS)} layouts on {args.device}"):
        outcomes = run_kernel_cases(args.device)
    mutant_rows = []
    if args.mutants:
        with out.step(f"{len(KERNEL_BUGS)} planted kernel bugs × {len(TRITON_LAYOUTS)} layouts"):
            mutant_rows = [
                run_kernel_mutant(bug, name, device=args.device) for bug in KERNEL_BUGS for name in TRITON_LAYOUTS
            ]
    failed = [o for o in outcomes if not o.passed]
    survivors = [m for m in mutant_rows if m.caught_by is None]
    if args.json:
        json.dump(
            {
                "cases": [
                    {"case": o.case, "layout": o.layout, "passed": o.passed, "detail": o.detail} for o in outcomes
                ],
                "mutants": [vars(m) for m in mutant_rows],
            },
            sys.stdout,
            indent=2,
        )
        print()
    else:
        log.print_table(
            "kernel cases",
            ["case", "layout", "verdict", "detail"],
            [[o.case, o.layout or "", "pass" if o.passed else "FAIL", o.detail] for o in outcomes],
        )
        if mutant_rows:
            log.print_table(
                "planted kernel bugs",
                ["bug", "layout", "caught by", "how it showed"],
                [[m.bug, m.layout, m.caught_by or "SURVIVED", m.detail] for m in mutant_rows],
            )
    if failed or survivors:
        raise KvlabFailed(
            f"{len(failed)} kernel case runs failed, {len(survivors)} planted kernel bugs survived",
            hint="the detail column says what differed",
        )
    out.info(
        f"{len(outcomes)} kernel case runs passed"
        + (f"; {len(mutant_rows)} planted bugs caught" if mutant_rows else "")
    )
    return 0
