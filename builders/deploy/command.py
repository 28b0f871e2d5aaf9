"""`forge deploy render`: write a profile's pools and router as plain Kubernetes YAML, ready for kustomize."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from builders import log
from builders.config.types import INT32_MAX
from builders.deploy.manifests import DeployOptions, GpuPlacement, Object, check_image, kustomization, render
from builders.errors import UsageError
from builders.gpu_image import ImageFacts, LabelsRead, image_facts, image_facts_from_labels, read_image_labels
from builders.output import output_dir, write_output
from builders.preflight.gpu_gate import add_gpu_gate_args, gate_from_args
from builders.project import find_root
from builders.smoke.profile import load_profile
from builders.smoke.stack import check_traffic

DEFAULT_ROUTER_IMAGE = "forge/debian-12-router:latest"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "deploy", help="the smoke stack of a profile as Kubernetes objects", description=__doc__
    )
    sub = parser.add_subparsers(dest="deploy_command", metavar="ACTION", required=True)
    rend = sub.add_parser(
        "render",
        help="write the profile's pools and router as Kubernetes YAML with a kustomization.yaml",
        description="One Deployment, headless Service and PodDisruptionBudget per pool; the router as a "
        "Deployment with its config in a ConfigMap, its keys from a Secret, a Service and a "
        "PodDisruptionBudget. The pools' vLLM arguments, the model and the router config are those `forge "
        "smoke` derives from the same profile.",
    )
    rend.add_argument("--profile", default="ci", help="profile name in profiles/ or a YAML path (default: ci)")
    rend.add_argument("--image", required=True, metavar="REF", help="vLLM image of the pools (best by digest)")
    rend.add_argument(
        "--router-image",
        default=DEFAULT_ROUTER_IMAGE,
        metavar="REF",
        help=f"router image, one with Forge installed (default: {DEFAULT_ROUTER_IMAGE})",
    )
    rend.add_argument("-o", "--output", type=Path, required=True, metavar="DIR", help="directory to write")
    rend.add_argument(
        "--network",
        choices=("cluster", "host"),
        default="cluster",
        help="cluster: pod networking, the router finds replicas by DNS (default); host: every pod on the "
        "node's 127.0.0.1 at the profile's ports, for one machine (podman kube play)",
    )
    rend.add_argument("--base-port", type=int, default=None, help="with --network host: router port, replicas after it")
    rend.add_argument("--router-replicas", type=int, default=None, help="router pods (default: 2; 1 with host)")
    rend.add_argument(
        "--dns-interval", type=float, default=5.0, metavar="S", help="seconds between DNS resolutions (default 5)"
    )
    rend.add_argument(
        "--gpus",
        type=int,
        default=None,
        metavar="N",
        help="GPUs each pool replica requests, and the image is a GPU image (default: the pool's tensor-parallel "
        "size, for an image whose labels or --image-archs say it is a GPU image)",
    )
    add_gpu_gate_args(rend)
    rend.set_defaults(func=run_render)


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    # Multi-line values (the router config, the model files) as literal blocks, readable in review.
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _str)


def dump(objects: list[Object]) -> str:
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, width=120)


def run_render(args: argparse.Namespace) -> int:
    console = log.console()
    root = Path(args.root).resolve() if getattr(args, "root", None) else find_root()
    profile, path = load_profile(args.profile, root=root)
    # The same checks as `forge smoke --validate-only` that do not depend on this host (its CPUs, its dtype):
    # a profile smoke refuses is refused here, with the same file and key.
    check_traffic(profile, str(path))
    replicas = args.router_replicas if args.router_replicas is not None else (1 if args.network == "host" else 2)
    if not 1 <= replicas <= INT32_MAX:
        raise UsageError(
            f"--router-replicas {replicas}: give 1 to {INT32_MAX:,} (Kubernetes keeps replicas in 32 bits)"
        )
    if not math.isfinite(args.dns_interval) or args.dns_interval <= 0:
        raise UsageError(f"--dns-interval {args.dns_interval}: give a positive number of seconds")
    if args.base_port is not None and (args.network != "host" or not 1024 <= args.base_port <= 65000):
        raise UsageError("--base-port goes with --network host and takes a port between 1024 and 65000")
    if args.gpus is not None and not 1 <= args.gpus <= 64:
        raise UsageError(f"--gpus {args.gpus}: give 1 to 64 GPUs per replica")
    # The image's own labels, where the local engine holds it: a GPU image's pools then request GPUs. The
    # reference is checked first: the engine is asked only about one a registry could hold.
    check_image("--image", args.image)
    image = None if args.image_archs else read_image_labels(args.image, _labels_of(args))
    # A Deployment that schedules onto GPUs the image has no kernels for, or onto a driver too old for its CUDA,
    # would crash-loop: refuse to write it.
    for verdict in gate_from_args(args, image=image) or ():
        for line in verdict.lines():
            console.print(line, markup=False)
    gpu = gpu_placement(args, image)
    if gpu is None and image is not None and image.error:
        console.print(
            f"[yellow]note:[/yellow] the labels of {args.image} were not read ({image.error}): its pools are "
            "rendered for CPUs; for a GPU image pass --image-archs REPORT or --gpus N",
        )
    options = DeployOptions(
        image=args.image,
        router_image=args.router_image,
        network=args.network,
        router_replicas=replicas,
        dns_interval_s=args.dns_interval,
        base_port=args.base_port,
        gpu=gpu,
    )
    rendered = render(profile, str(path), options)
    out = output_dir(args.output)
    header = (
        f"# Rendered by `forge deploy render` from {path.name} (profile {profile.name}), network {args.network}.\n"
        "# Do not edit: change the profile and render again, or patch it from a kustomize overlay.\n"
    )
    written: list[str] = []
    for name, objects in rendered.files.items():
        target = out / name
        write_output(target, header + dump(objects))
        if name == "secret.yaml":
            target.chmod(0o600)
        written.append(f"{name} ({', '.join(str(o['kind']) for o in objects)})")
    write_output(out / "kustomization.yaml", header + dump([kustomization(rendered, profile)]))
    for note in rendered.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    console.print(f"wrote {out}: kustomization.yaml, " + "; ".join(written))
    return 0


def _labels_of(args: argparse.Namespace) -> Callable[[str], Mapping[str, str]]:
    def labels_of(ref: str) -> Mapping[str, str]:
        from builders.container import connect

        return connect(getattr(args, "engine", None)).image_info(ref).labels

    return labels_of


def gpu_placement(args: argparse.Namespace, image: LabelsRead | None) -> GpuPlacement | None:
    """A GPU image's placement, from --image-archs, else its labels; --gpus alone marks it a GPU image of unknown
    archs (GPUs requested, no compute affinity)."""
    facts: ImageFacts | None
    if args.image_archs:
        facts = image_facts(args.image_archs)
    elif image is not None and image.labels is not None:
        facts = image_facts_from_labels(image.labels, ref=image.ref)
    else:
        facts = None
    if facts is None and args.gpus is None:
        return None
    cuda = facts.cuda.version if facts and facts.cuda else None
    if args.image_cuda:
        from builders.cuda_driver import CudaVersion

        try:
            cuda = CudaVersion.parse(args.image_cuda)
        except ValueError as exc:
            raise UsageError(f"--image-cuda: {exc}") from exc
    return GpuPlacement(libraries=tuple(facts.libraries) if facts else (), cuda=cuda, gpus_per_replica=args.gpus)


def load_dir(directory: Path) -> list[dict[str, Any]]:
    """Every object in a rendered directory, in kustomization order (what tests and `kube play` read)."""
    order = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))["resources"]
    objects: list[dict[str, Any]] = []
    for name in order:
        objects.extend(o for o in yaml.safe_load_all((directory / name).read_text(encoding="utf-8")) if o)
    return objects
