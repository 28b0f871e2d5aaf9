"""The whole smoke runs that the smoke tests build: replicas and router from the runtimes a test names, logged to
stderr at a width that reads the same in a CI log as in a terminal."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from builders.smoke.runtimes import LocalReplicas, LocalRouter, ReplicaRuntime, RouterRuntime
from builders.smoke.stack import SmokeOptions, SmokeRun


def smoke_run(
    options: SmokeOptions,
    replicas: Callable[[str, str | None, Path, Path], ReplicaRuntime],
    router: Callable[[Path], RouterRuntime],
) -> SmokeRun:
    """A SmokeRun whose replicas (by engine, image, model dir and logs dir) and router (by logs dir) come from the
    two factories."""
    return SmokeRun(
        options=options,
        replicas_runtime_factory=replicas,
        router_runtime_factory=router,
        console=Console(stderr=True, width=160),
    )


def local_run(options: SmokeOptions, binary: Path) -> SmokeRun:
    """Replicas as host processes of `binary` (a real or a stand-in `vllm`), the router a process of this checkout."""
    return smoke_run(
        options,
        lambda _kind, _image, model_dir, logs_dir: LocalReplicas(binary, model_dir=model_dir, log_dir=logs_dir),
        lambda logs_dir: LocalRouter(log_dir=logs_dir),
    )
