"""`forge smoke`: prove a built image serves mixed traffic through the class-aware router."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console

from builders import log
from builders.engines import ENGINES
from builders.engines.args import raise_for_problems
from builders.errors import UsageError
from builders.gpu_image import read_image_labels
from builders.preflight.gpu_gate import Verdict, add_gpu_gate_args, gate_from_args
from builders.project import find_root
from builders.smoke.endpoint import EndpointOptions, check_api_key, check_url, smoke_endpoint
from builders.smoke.profile import load_profile
from builders.smoke.runtimes import Runtimes, add_serving_options, serving_options_given
from builders.smoke.stack import SmokeOptions, SmokeRun, summary_table, validate_profile


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "smoke",
        help="start a router stack on an image and judge mixed traffic against per-class SLOs",
        description="Start the profile's pools from IMAGE (vLLM) or --llama-image (llama.cpp pools; a tiny random "
        "model, loopback only), the class-aware router "
        "in front, drive the profile's traffic plan, judge each class's gate, write a report, and tear "
        "everything down, also on failure or Ctrl-C.",
    )
    default = ENGINES.default
    parser.add_argument("--profile", default="ci", help="profile name in profiles/ or a YAML path (default: ci)")
    parser.add_argument("--report", type=Path, default=None, metavar="DIR", help="write the JSON report here")
    parser.add_argument(
        "--router-image",
        default=None,
        metavar="IMAGE",
        help="run the router from this image (default: a local process)",
    )
    add_serving_options(
        parser,
        image_help=f"image with {default.title} to test (omit with {default.local_option} or --endpoint)",
    )
    parser.add_argument(
        "--endpoint",
        default=None,
        metavar="URL",
        help="judge a stack Forge did not start (a deployed router's base URL): start nothing, run the profile's "
        "traffic against it, report each class's gate and where its requests were served",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="Bearer key of the --endpoint (default: $FORGE_API_KEY)",
    )
    parser.add_argument(
        "--model", default=None, help="model name to request from the --endpoint (default: the profile's)"
    )
    parser.add_argument("--base-port", type=int, default=None, help="router port; replicas use the ports after it")
    parser.add_argument(
        "--check-slow-clients",
        action="store_true",
        help="also run with the slow clients reading at full speed and check the other classes' p99 TTFT/ITL "
        "with slow readers stay within the profile's margin of it",
    )
    parser.add_argument(
        "--check-kill-replica",
        action="store_true",
        help="also run while killing a replica (profile checks.kill_replica): its clients must get an error "
        "within the bound and the other pools' classes must keep their gates",
    )
    parser.add_argument(
        "--validate-only",
        action="store_true",
        help="only check the profile and its vLLM arguments against the image's vLLM; start nothing",
    )
    add_gpu_gate_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    console = log.console()
    root = Path(args.root).resolve() if getattr(args, "root", None) else find_root()
    if args.endpoint is not None:
        return run_endpoint(args, root, console)
    if (args.api_key is not None and "FORGE_API_KEY" not in os.environ) or args.model is not None:
        raise UsageError("--api-key and --model go with --endpoint; a stack Forge starts makes its own keys")
    # Before any container starts: a GPU the image has no kernels for, or a driver too old for its CUDA, fails
    # here, not minutes into vLLM's start. Without --image-archs the image's own labels say, once it is local.
    from_labels = args.image is not None and not args.image_archs
    if not from_labels:
        _print_gate(console, gate_from_args(args))
    runtimes = Runtimes.from_args(args)
    if args.base_port is not None and not 1024 <= args.base_port <= 65000:
        raise UsageError(f"--base-port {args.base_port}: use a port between 1024 and 65000")
    profile, path = load_profile(args.profile, root=root)
    for line in runtimes.pull_pinned():
        console.print(f"forge: {line}", markup=False)
    if from_labels:
        image = read_image_labels(args.image, lambda ref: runtimes.engine.image_info(ref).labels)
        if image.error:
            # Said as not evaluated: a gate that read nothing has passed nothing.
            console.print(
                f"forge: GPU gate not evaluated: the labels of {args.image} were not read ({image.error}); "
                "--image-archs REPORT judges this host's GPUs without them",
                markup=False,
            )
        _print_gate(console, gate_from_args(args, image=image))

    if args.validate_only:
        # The traffic plans and router config are checked first: they need no vLLM.
        valid = validate_profile(profile, str(path), run_id="validate", base_port=args.base_port)
        for group in valid.plan.runtime_groups():
            runtime = runtimes.replicas(group.engine, group.image, Path("/nonexistent"), Path("/nonexistent"))
            probe = runtime.probe(timeout_s=profile.timeouts.probe_s)
            problems = runtime.serving.check(valid.plan.pool_argvs(pools=group.pools), probe)
            for problem in problems:
                console.print(f"{problem.severity}: {problem.render()}")
            raise_for_problems(problems, profile=str(path), server=runtime.serving.title)
            console.print(
                f"profile {profile.name}: the arguments of pools {', '.join(group.pools)} are accepted by "
                f"{runtime.description} (entry: {' '.join(probe.entry)})"
            )
        return 0

    options = SmokeOptions(
        profile=profile,
        profile_path=path,
        report_dir=args.report,
        base_port=args.base_port,
        check_slow_clients=args.check_slow_clients,
        check_kill_replica=args.check_kill_replica,
    )
    smoke = SmokeRun(
        options=options,
        replicas_runtime_factory=runtimes.replicas,
        router_runtime_factory=runtimes.router,
        console=console,
    )
    report = smoke.execute()
    console.print(summary_table(report))
    console.print(f"[green]smoke passed[/green]: profile {profile.name}, report {report.report_file or '(none)'}")
    return 0


def _print_gate(console: Console, verdicts: list[Verdict] | None) -> None:
    for verdict in verdicts or ():
        for line in verdict.lines():
            console.print(f"forge: {line}", markup=False)


def run_endpoint(args: argparse.Namespace, root: Path, console: Console) -> int:
    given = [
        flag
        for flag, value in (
            *serving_options_given(args),
            ("--router-image", args.router_image),
            ("--base-port", args.base_port),
            ("--validate-only", args.validate_only or None),
            ("--check-slow-clients", args.check_slow_clients or None),
            ("--check-kill-replica", args.check_kill_replica or None),
        )
        if value is not None
    ]
    if given:
        raise UsageError(
            f"--endpoint judges a stack Forge did not start: {', '.join(given)} cannot go with it",
            hint="drop them, or drop --endpoint to have Forge start the stack",
        )
    check_url(args.endpoint)
    if args.api_key is not None:
        api_key: str | None = check_api_key(args.api_key, where="--api-key")
    elif os.environ.get("FORGE_API_KEY"):
        api_key = check_api_key(os.environ["FORGE_API_KEY"], where="FORGE_API_KEY")
    else:
        api_key = None
    profile, path = load_profile(args.profile, root=root)
    options = EndpointOptions(
        profile=profile,
        profile_path=path,
        url=args.endpoint,
        api_key=api_key,
        model=args.model,
        report_dir=args.report,
    )
    report = smoke_endpoint(options, console)
    console.print(summary_table(report))
    console.print(
        f"[green]smoke passed[/green]: profile {profile.name} against {report.endpoint}, "
        f"report {report.report_file or '(none)'}"
    )
    return 0
