"""The KV lab's one prepared run for a GPU host: `nox -s kvlab-gpu`, or where Forge's dependencies are absent,
`python3 -m builders.kvlab.gpu_check --out DIR` from a checkout.

It installs nothing and needs only what the GPU hosts within reach have: Python with torch (CUDA), Triton, NumPy
and rich. It imports none of Forge's CLI (pydantic, httptools, docker, gguf, nox). In about 5 minutes:

1. the device: GPU, driver, torch and Triton builds, the datasheet peak and a measured device-to-device copy;
2. every layout's Triton kernel timed at bandwidth-bound sizes (gpu_bench.SCENARIOS), each output for sampled
   requests checked against the oracle first, beside torch's SDPA and, where it imports, FlashInfer;
3. the kernel cases CI runs under the interpreter, compiled on the GPU, and each planted kernel bug on every
   layout against the case named to catch it.

Each stage stops at its share of `--budget`; what did not fit is listed as skipped. Results: DIR/results.json
(everything), DIR/results.md (the tables for the README's KV-lab part) and DIR/log.txt. Exit 0 when every run
check passed (the bars in results are verdicts, not failures), 1 when a case or a check failed, 2 when no GPU
is visible. `--dry-run` runs the same script end to end on a CPU under Triton's interpreter at tiny sizes, to
test its plumbing where no GPU is.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    # Types only: gpu_bench is imported where it runs, after the kernels are built for the GPU or the interpreter.
    from builders.kvlab.gpu_bench import CaseRuns, CaughtRun, GpuScenario, KernelRun, MutantRuns


class _Log:
    """Every line to stdout and to log.txt as it happens: a run cut off by its time limit keeps what it said."""

    def __init__(self, path: Path) -> None:
        self.file: TextIO = path.open("w", encoding="utf-8")
        self.start = time.monotonic()

    def __call__(self, line: str) -> None:
        text = f"[{time.monotonic() - self.start:6.1f} s] {line}"
        print(text, flush=True)
        self.file.write(text + "\n")
        self.file.flush()


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m builders.kvlab.gpu_check", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT") or "reports/kvlab-gpu"), help="folder (default $OUT)"
    )
    parser.add_argument("--budget", type=float, default=270.0, help="seconds for the whole run (default 270)")
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions per layout and scenario")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, under Triton's interpreter, tiny sizes")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the two headline scenarios (one shared-prefix one in a dry run), one kernel case (fp8) and one planted "
        "bug on each layout",
    )
    args = parser.parse_args(argv)
    if args.budget <= 0 or args.reps < 1:
        parser.error("--budget must be positive and --reps at least 1")
    return args


def _cases(device: str, deadline: float, quick: bool, say: _Log) -> tuple[CaseRuns, MutantRuns]:
    from builders.kvlab.kernel_cases import CATCHERS, KERNEL_CASES, run_kernel_case, run_kernel_mutant
    from builders.kvlab.triton_layouts import TRITON_LAYOUTS

    # The quick form's one case is a cheap one that still takes fp8 through the whole path.
    cases = [c for c in KERNEL_CASES if c.name == "fp8-e4m3-scales"] if quick else KERNEL_CASES
    runs: list[KernelRun] = []
    skipped: list[str] = []
    for case in cases:
        for layout in TRITON_LAYOUTS:
            if time.monotonic() > deadline:
                skipped.append(f"{case.name} on {layout}")
                continue
            o = run_kernel_case(case, layout, device=device)
            runs.append({"case": case.name, "layout": layout, "passed": o.passed, "detail": o.detail})
            if not o.passed:
                say(f"FAIL {case.name} on {layout}: {o.detail}")
    say(f"kernel cases: {sum(r['passed'] for r in runs)} of {len(runs)} passed, {len(skipped)} skipped")
    bugs = list(CATCHERS.items())[:1] if quick else list(CATCHERS.items())
    caught: list[CaughtRun] = []
    for bug, catcher in bugs:
        case = next(c for c in KERNEL_CASES if c.name == catcher)
        for layout in TRITON_LAYOUTS:
            if time.monotonic() > deadline:
                skipped.append(f"planted {bug} on {layout}")
                continue
            m = run_kernel_mutant(bug, layout, device=device, cases=[case])
            caught.append({"bug": bug, "layout": layout, "caught_by": m.caught_by, "detail": m.detail})
    say(f"planted kernel bugs: {sum(1 for m in caught if m['caught_by'])} of {len(caught)} caught")
    return {"runs": runs, "skipped": skipped}, {"runs": caught}


def _scenarios(args: argparse.Namespace) -> Sequence[GpuScenario]:
    from builders.kvlab import gpu_bench

    if not args.dry_run:
        return gpu_bench.SCENARIOS[:2] if args.quick else gpu_bench.SCENARIOS
    # The quick dry run keeps the scenario with a shared prefix: it is the one where the cascade groups requests.
    return gpu_bench.DRY_SCENARIOS[-1:] if args.quick else gpu_bench.DRY_SCENARIOS


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    say = _Log(args.out / "log.txt")
    start = time.monotonic()
    device = "cpu" if args.dry_run else "cuda"
    # The kernels are built for the GPU or the interpreter before anything imports triton.
    from builders.kvlab.triton_layouts import load_kernels

    load_kernels(interpret=args.dry_run)
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        say(f"no GPU: torch {torch.__version__} sees no CUDA device (use --dry-run to test the plumbing on a CPU)")
        return 2
    from builders.kvlab import gpu_bench

    say(f"KV lab GPU run: {'dry run, interpreter' if args.dry_run else 'CUDA'}, budget {args.budget:.0f} s")
    report = gpu_bench.run_bench(
        device,
        scenarios=_scenarios(args),
        spec=gpu_bench.DRY_SPEC if args.dry_run else gpu_bench.SPEC,
        reps=1 if args.dry_run else args.reps,
        copy_bytes=2**30,
        deadline=start + 0.55 * args.budget,
        progress=say,
    )
    report["cases"], report["mutants"] = _cases(device, start + 0.92 * args.budget, args.quick, say)
    report["when"] = datetime.now(UTC).isoformat(timespec="seconds")
    report["seconds"] = round(time.monotonic() - start, 1)
    report["mode"] = "dry run: Triton's interpreter on the CPU, tiny sizes" if args.dry_run else "CUDA"
    (args.out / "results.json").write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    from builders.kvlab.gpu_bench import render

    (args.out / "results.md").write_text(f"{report['when']}, {report['mode']}\n\n" + render(report), "utf-8")
    say(f"results: {args.out / 'results.json'}, results.md ({report['seconds']} s)")
    failed_checks = [
        f"{s}/{n}" for s, row in report["scenarios"].items() for n, r in row["layouts"].items() if "failed" in r
    ]
    failed_cases = [f"{r['case']} on {r['layout']}" for r in report["cases"]["runs"] if not r["passed"]]
    survivors = [f"{m['bug']} on {m['layout']}" for m in report["mutants"]["runs"] if not m["caught_by"]]
    for label, items in (("oracle checks failed", failed_checks), ("cases failed", failed_cases)):
        if items:
            say(f"{label}: {', '.join(items)}")
    if survivors:
        say(f"planted bugs not caught: {', '.join(survivors)}")
    return 1 if failed_checks or failed_cases or survivors else 0


if __name__ == "__main__":
    sys.exit(main())
