"""`forge sweep IMAGE --profiles …`: the serving profiles side by side on the same traffic."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from builders import log
from builders.engines import ENGINES
from builders.errors import SweepInvalid, UsageError
from builders.project import find_root
from builders.serving_dtype import this_host
from builders.smoke.plan import check_host_runs
from builders.smoke.runtimes import Runtimes, add_serving_options
from builders.sweep.claims import claim_lines
from builders.sweep.definition import available_sweep_profiles, load_sweep, load_sweep_settings
from builders.sweep.report import render_table, summary_lines
from builders.sweep.run import SweepOptions, run_sweep


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "sweep",
        help="drive the same seeded open-loop traffic against several stack profiles and compare them",
        description="Start each profile of profiles/sweep/ in turn on IMAGE (or --local-vllm), drive the traffic "
        "of profiles/sweep/common.yaml through the router, and write one report: a profile × class table "
        "(TTFT/ITL p50/p99, goodput, gate, useful throughput), sweep.json, sweep.md and PNG plots.",
    )
    default = ENGINES.default
    parser.add_argument(
        "--profiles",
        default="all",
        help="comma-separated profiles of profiles/sweep/ (or YAML paths); 'all' (default) runs every one",
    )
    parser.add_argument(
        "--engines",
        default=None,
        help=f"comma-separated serving engines ({','.join(e.name for e in ENGINES.served)}): run every profile on "
        "each, engine × profile in one table; a profile's `engines.<engine>` section gives its knobs there "
        "(default: as each is written)",
    )
    parser.add_argument("--report", type=Path, default=Path("reports/sweep"), metavar="DIR", help="output folder")
    add_serving_options(
        parser,
        image_help=f"image with {default.title} (omit with {default.local_option})",
        local_help="run replicas on this host",
        which="positional",
    )
    parser.add_argument("--router-image", default=None, metavar="IMAGE", help="run the router from this image")
    add_serving_options(parser, image_help="", which="others")
    parser.add_argument("--base-port", type=int, default=None, help="router port; replicas use the ports after it")
    parser.add_argument(
        "--duration-s", type=float, default=None, help="override the traffic's duration (traffic.deadline_s)"
    )
    parser.add_argument(
        "--startup-s",
        type=float,
        default=None,
        help="override how long replicas and router may take to start (timeouts.startup_s): a busy host needs more",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run every profile N times, interleaved (each repetition rotates the order by one), each repetition "
        "with its own traffic seed derived from the common one; the table shows medians and min-max spreads",
    )
    parser.add_argument(
        "--cold-replicas",
        action="store_true",
        help="start every replica with empty start-up caches; by default the sweep's replicas share one cache "
        "directory (vLLM's VLLM_CACHE_ROOT) for the whole sweep, so only the first start pays for what is the "
        "same in every start",
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument(
        "--no-calibrate",
        action="store_true",
        help="drive the configured rates as they are, without measuring a replica first (sweep.calibrate)",
    )
    parser.add_argument(
        "--load-fraction",
        type=float,
        default=None,
        help="offered load as a fraction of the measured capacity (sweep.load_fraction, default 0.5)",
    )
    parser.add_argument(
        "--rate-scale",
        type=float,
        default=1.0,
        help="multiply every rate after calibration (10 with --no-calibrate forces an overload)",
    )
    parser.add_argument(
        "--model-size",
        default=None,
        metavar="HIDDENxLAYERS",
        help="serve the sweep's model at this size from the start (e.g. 256x5, what an earlier calibration "
        "chose, under its table): calibration then sizes only the rates, and no profile starts twice",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    console = log.console()
    root = Path(args.root).resolve() if getattr(args, "root", None) else find_root()
    if args.base_port is not None and not 1024 <= args.base_port <= 65000:
        raise UsageError(f"--base-port {args.base_port}: use a port between 1024 and 65000")
    if args.repeat < 1:
        raise UsageError(f"--repeat {args.repeat}: give at least 1 run per profile")
    if args.rate_scale <= 0:
        raise UsageError(f"--rate-scale {args.rate_scale}: give a positive factor")
    if args.load_fraction is not None and not 0 < args.load_fraction <= 4:
        raise UsageError(f"--load-fraction {args.load_fraction}: give a fraction of capacity in (0, 4]")
    runtimes = Runtimes.from_args(args)
    names = available_sweep_profiles(root) if args.profiles == "all" else [n for n in args.profiles.split(",") if n]
    changes: dict[str, object] = {}
    if args.duration_s is not None:
        if args.duration_s <= 0:
            raise UsageError(f"--duration-s {args.duration_s}: give a positive number of seconds")
        changes["traffic"] = {"deadline_s": args.duration_s}
    if args.startup_s is not None:
        if args.startup_s <= 0:
            raise UsageError(f"--startup-s {args.startup_s}: give a positive number of seconds")
        changes["timeouts"] = {"startup_s": args.startup_s}
    sweep_changes: dict[str, object] = {}
    if args.model_size is not None:
        changes["model"] = _model_size(args.model_size)
        sweep_changes["resize_model"] = False
    if args.no_calibrate:
        sweep_changes["calibrate"] = False
    if args.load_fraction is not None:
        sweep_changes["load_fraction"] = args.load_fraction
    if sweep_changes:
        changes["sweep"] = sweep_changes
    engines = [e for e in args.engines.split(",") if e] if args.engines else None
    profiles = load_sweep(names, root=root, changes=changes, engines=engines)
    host = this_host()
    for sweep_profile in profiles:
        # Each profile run would refuse it too, but only after the profiles before it had run.
        check_host_runs(sweep_profile.profile, str(sweep_profile.path), host)
    settings = load_sweep_settings(root, changes=changes)
    with _replica_cache(cold=args.cold_replicas) as cache:
        runtimes = replace(runtimes, replica_cache=cache)
        report = run_sweep(
            SweepOptions(
                profiles=profiles,
                report_dir=args.report,
                base_port=args.base_port,
                plots=not args.no_plots,
                settings=settings,
                rate_scale=args.rate_scale,
                repeat=args.repeat,
                replica_cache=(
                    "none: every replica starts cold (--cold-replicas)"
                    if cache is None
                    else "one start-up cache directory shared by every replica of the sweep, created empty"
                ),
            ),
            replicas=runtimes.replicas,
            router=runtimes.router,
            console=console,
        )
    console.print(render_table(report))
    for name, why in report.failed_profiles.items():
        console.print(f"[red]profile {name} did not run:[/red] {why}")
    if report.goal is not None:
        console.print(f"work-conserving vs shared: {report.goal.as_json()}")
    for line in claim_lines(report.claims or []):
        console.print(line)
    for line in summary_lines(report):
        console.print(line)
    console.print(f"report: {args.report / 'sweep.json'}")
    # A sweep where nothing ran is a failed sweep (exit 1, reasons above), not an overloaded one.
    if report.profiles and report.validity is not None and not report.validity.valid:
        raise SweepInvalid(
            report.validity.why,
            hint="run where the model fits (or lower sweep.load_fraction); do not read this table as a ranking",
        )
    return 1 if report.failed_profiles else 0


@contextlib.contextmanager
def _replica_cache(*, cold: bool) -> Iterator[Path | None]:
    """An empty directory for the sweep's replicas to share, removed with everything in it when the sweep ends."""
    if cold:
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="forge-sweep-cache-"))
    # Replica containers run as the image's own user (uid 1000), not as whoever runs Forge.
    folder.chmod(0o777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _model_size(text: str) -> dict[str, int]:
    hidden, _, layers = text.lower().partition("x")
    if not (hidden.isdigit() and layers.isdigit()) or int(hidden) % 64 or not int(hidden) or not int(layers):
        raise UsageError(
            f"--model-size {text}: give HIDDENxLAYERS, hidden a multiple of 64 (e.g. 256x5)",
            hint="the size an earlier calibration chose is under its table ('model resized for this host')",
        )
    return {"hidden_size": int(hidden), "num_hidden_layers": int(layers)}
