"""Where the stack's servers run: containers from an image (through builders.container) or host processes.

Both give the same handles, so the orchestration in stack.py never knows which it drives. The host-process
mode (`--local-vllm`, `--local-llama-server`: each serving engine's `--local-<name>`) exists to develop the router
against real servers without building an image. The options naming each engine's image and host binary are
generated from the registry of serving engines (`add_serving_options`), and read back by `Runtimes.from_args`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import IO, Literal, Protocol

from builders.container import Engine, EngineChoice, RunSpec, connect
from builders.container.select import chosen as chosen_engine
from builders.cpusets import parse_cpuset
from builders.engines import ENGINES, ServerProbe, ServingEngine, serving_engine
from builders.errors import EngineError, UsageError
from builders.smoke.plan import CONTAINER_MODEL_DIR, RUN_LABEL, ReplicaPlan

ROUTER_CONFIG_DIR = "/forge/router"
# Where the directory the replicas of one sweep share for their start-up caches is mounted (read-write).
CONTAINER_CACHE_DIR = "/forge/cache"


class Launched(Protocol):
    """A started server: a container or a host process group."""

    name: str

    def alive(self) -> bool: ...

    def logs(self, tail: int = 200) -> str: ...

    def kill(self) -> None:
        """Die at once, as a crash would (SIGKILL)."""

    def stop(self) -> None:
        """Shut down cleanly if it can within a few seconds, else kill; afterwards nothing of it remains."""


@dataclass(kw_only=True)
class LaunchedContainer:
    engine: Engine
    cid: str
    name: str

    def alive(self) -> bool:
        return self.engine.is_running(self.cid)

    def logs(self, tail: int = 200) -> str:
        return self.engine.logs(self.cid, tail=tail)

    def kill(self) -> None:
        self.engine.kill(self.cid)

    def stop(self) -> None:
        self.engine.stop_and_remove(self.cid, timeout=5)


@dataclass(kw_only=True)
class LaunchedProcess:
    """A host process started in its own session, so its whole tree (vLLM's engine core and worker
    processes included) is signalled through its process group."""

    process: subprocess.Popen[bytes]
    name: str
    log_path: Path
    _log: IO[bytes] | None = field(default=None, repr=False)

    def alive(self) -> bool:
        return self.process.poll() is None

    def group_members(self) -> list[int]:
        """Live (not zombie) processes of the group: vLLM's engine core and workers outlive a killed parent
        for a moment, and a zombie waiting for init to reap it is gone for every purpose here."""
        members = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text(encoding="ascii", errors="replace")
            except OSError:
                continue
            # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
            fields = stat[stat.rfind(")") + 2 :].split()
            if len(fields) > 2 and fields[2] == str(self.process.pid) and fields[0] != "Z":
                members.append(int(entry.name))
        return members

    def group_alive(self) -> bool:
        return bool(self.group_members())

    def logs(self, tail: int = 200) -> str:
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-tail:])

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _wait_group(self, seconds: float) -> bool:
        """Reap the leader and wait for the whole group to end; True when it did in time."""
        deadline = time.monotonic() + seconds
        while True:
            self.process.poll()
            if not self.group_alive():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)
        if not self._wait_group(8):
            self._signal(signal.SIGKILL)
            self._wait_group(5)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=1)
        if self._log is not None:
            self._log.close()
            self._log = None


def start_process(
    argv: Sequence[str],
    *,
    name: str,
    env: Mapping[str, str],
    log_path: Path,
    cpus: frozenset[int] | None = None,
) -> LaunchedProcess:
    """Start argv in its own session; with `cpus`, confined to them before it runs (its children inherit it)."""
    log = log_path.open("wb")

    def confine() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    try:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
            preexec_fn=confine if cpus is not None else None,
        )
    except OSError as exc:
        log.close()
        raise UsageError(f"cannot start {argv[0]}: {exc.strerror}", hint="check the path given") from exc
    return LaunchedProcess(process=process, name=name, log_path=log_path, _log=log)


class ReplicaRuntime(Protocol):
    description: str
    serving: ServingEngine

    def probe(self, *, timeout_s: float) -> ServerProbe: ...

    def start(self, replica: ReplicaPlan, probe: ServerProbe, *, run_id: str) -> Launched: ...

    def leftovers(self, run_id: str) -> list[str]:
        """What of this run still runs, for the report; empty after a clean teardown."""

    def sweep(self, run_id: str) -> None:
        """Remove whatever of this run still runs, also what was never handed back as a handle."""


class ContainerReplicas:
    """Replicas as containers of the image under test, on the host network, bound to loopback."""

    def __init__(
        self,
        engine: Engine,
        image: str,
        *,
        model_dir: Path,
        serving: ServingEngine | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        if not engine.image_exists(image):
            raise UsageError(f"image {image!r} is not in the engine", hint="build it first (`forge build`) or pull it")
        self.engine = engine
        self.image = image
        self.model_dir = model_dir
        self.serving = serving or ENGINES.default
        self.cache_dir = cache_dir
        self.image_id = engine.image_info(image).id
        self.description = f"image {image} ({self.image_id[:19]})"
        self._started: list[LaunchedContainer] = []

    def _seed_cache(self) -> None:
        """Copy the image's own warmed caches into the shared directory, once, while it is still empty."""
        seed = self.serving.cache_seed(CONTAINER_CACHE_DIR)
        if self.cache_dir is None or seed is None:
            return
        if self.cache_dir.exists() and any(self.cache_dir.iterdir()):
            return  # an earlier profile of the sweep seeded it, and its replicas added to it
        rc, out = self.engine.run_once(
            RunSpec(
                image=self.image,
                entrypoint=[seed[0]],
                command=seed[1:],
                volumes={str(self.cache_dir): f"{CONTAINER_CACHE_DIR}:rw"},
            ),
            timeout=120,
        )
        if rc != 0:
            # Only a slower first start: the replicas fill the cache themselves.
            print(
                f"forge: could not copy {self.image}'s own caches into the shared cache (exit {rc}); the first "
                f"replica fills it instead: {out.strip()[-300:]}",
                file=sys.stderr,
            )

    def probe(self, *, timeout_s: float) -> ServerProbe:
        def run(argv: list[str]) -> tuple[int, str]:
            return self.engine.run_once(
                RunSpec(image=self.image, command=argv[1:], entrypoint=[argv[0]], env={"HF_HUB_OFFLINE": "1"}),
                timeout=timeout_s,
            )

        return self.serving.probe(
            run,
            entries=self.serving.help_entries(None),
            source=self.description,
            cache_key=self.image_id.replace(":", "-"),
        )

    def start(self, replica: ReplicaPlan, probe: ServerProbe, *, run_id: str) -> Launched:
        argv = self.serving.argv(probe, CONTAINER_MODEL_DIR, replica.args)
        cache_env = self.serving.cache_env(CONTAINER_CACHE_DIR) if self.cache_dir else {}
        if cache_env:
            self._seed_cache()
        cid = self.engine.run_detached(
            RunSpec(
                image=self.image,
                entrypoint=[argv[0]],
                command=argv[1:],
                name=replica.name,
                env={**replica.env, **cache_env},
                volumes={
                    str(self.model_dir): CONTAINER_MODEL_DIR,
                    # Mounted only for an engine that keeps something there; the replicas write to it.
                    **({str(self.cache_dir): f"{CONTAINER_CACHE_DIR}:rw"} if cache_env else {}),
                },
                network_host=True,
                shm_size="2g",
                labels={RUN_LABEL: run_id, f"{RUN_LABEL}.replica": replica.label},
                cpuset_cpus=replica.cpuset,
            )
        )
        launched = LaunchedContainer(engine=self.engine, cid=cid, name=replica.name)
        self._started.append(launched)
        return launched

    def leftovers(self, run_id: str) -> list[str]:
        return self.engine.containers_with_label(RUN_LABEL, run_id)

    def sweep(self, run_id: str) -> None:
        for cid in self.engine.containers_with_label(RUN_LABEL, run_id):
            self.engine.stop_and_remove(cid, timeout=2)


class LocalReplicas:
    """Replicas as host processes of a server installed on this machine (`--local-vllm PATH_TO_vllm`,
    `--local-llama-server PATH`)."""

    def __init__(
        self,
        binary: Path,
        *,
        model_dir: Path,
        log_dir: Path,
        serving: ServingEngine | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        self.serving = serving or ENGINES.default
        self.cache_dir = cache_dir
        given = binary if binary.is_absolute() or "/" in str(binary) else None
        resolved = given or (Path(found) if (found := shutil.which(str(binary))) else None)
        if resolved is None or not resolved.is_file() or not os.access(resolved, os.X_OK):
            raise UsageError(
                f"{self.serving.local_option} {binary}: not an executable file",
                hint=self.serving.local_hint,
            )
        self.binary = resolved
        self.model_dir = model_dir
        self.log_dir = log_dir
        self.description = f"local {self.serving.title} {resolved}"
        self.entries = self.serving.help_entries(resolved)
        self._started: list[LaunchedProcess] = []

    def probe(self, *, timeout_s: float) -> ServerProbe:
        def run(argv: list[str]) -> tuple[int, str]:
            try:
                done = subprocess.run(
                    argv,
                    capture_output=True,
                    timeout=timeout_s,
                    env={**os.environ, "HF_HUB_OFFLINE": "1"},
                    check=False,
                )
            except subprocess.TimeoutExpired:
                return 124, f"timed out after {timeout_s:.0f}s"
            except OSError as exc:
                return 127, f"cannot run {argv[0]}: {exc.strerror}"
            return done.returncode, (done.stdout + done.stderr).decode(errors="replace")

        return self.serving.probe(
            run, entries=self.entries, source=self.description, cache_key=self.serving.local_cache_key(self.binary)
        )

    def start(self, replica: ReplicaPlan, probe: ServerProbe, *, run_id: str) -> Launched:
        argv = self.serving.argv(probe, str(self.model_dir), replica.args)
        launched = start_process(
            argv,
            name=replica.name,
            env={**replica.env, **(self.serving.cache_env(str(self.cache_dir)) if self.cache_dir else {})},
            log_path=self.log_dir / f"{replica.name}.log",
            cpus=parse_cpuset(replica.cpuset) if replica.cpuset is not None else None,
        )
        self._started.append(launched)
        return launched

    def leftovers(self, run_id: str) -> list[str]:
        return [f"{p.name} (pid {p.process.pid})" for p in self._started if p.group_alive()]

    def sweep(self, run_id: str) -> None:
        for launched in self._started:
            if launched.group_alive():
                launched.kill()


class RouterRuntime(Protocol):
    description: str

    def start(self, config_dir: Path, config_name: str, *, run_id: str) -> Launched: ...

    def leftovers(self, run_id: str) -> list[str]: ...

    def sweep(self, run_id: str) -> None: ...


class LocalRouter:
    """The router as a host process of this Python (`python -m builders.router`)."""

    description = "local process (python -m builders.router)"

    def __init__(self, *, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._started: list[LaunchedProcess] = []

    def start(self, config_dir: Path, config_name: str, *, run_id: str) -> Launched:
        argv = [sys.executable, "-m", "builders.router", "--config", str(config_dir / config_name)]
        launched = start_process(
            argv, name=f"forge-smoke-{run_id}-router", env={}, log_path=self.log_dir / "router.log"
        )
        self._started.append(launched)
        return launched

    def leftovers(self, run_id: str) -> list[str]:
        return [f"{p.name} (pid {p.process.pid})" for p in self._started if p.group_alive()]

    def sweep(self, run_id: str) -> None:
        for launched in self._started:
            if launched.group_alive():
                launched.kill()


class ContainerRouter:
    """The router as a container of a router image (one with Forge installed)."""

    def __init__(self, engine: Engine, image: str) -> None:
        if not engine.image_exists(image):
            raise UsageError(f"router image {image!r} is not in the engine", hint="build or pull it first")
        self.engine = engine
        self.image = image
        self.description = f"router image {image}"

    def start(self, config_dir: Path, config_name: str, *, run_id: str) -> Launched:
        name = f"forge-smoke-{run_id}-router"
        try:
            cid = self.engine.run_detached(
                RunSpec(
                    image=self.image,
                    entrypoint=["python3", "-m", "builders.router"],
                    command=["--config", f"{ROUTER_CONFIG_DIR}/{config_name}"],
                    name=name,
                    env={},
                    volumes={str(config_dir): ROUTER_CONFIG_DIR},
                    network_host=True,
                    shm_size="64m",
                    labels={RUN_LABEL: run_id, f"{RUN_LABEL}.router": "1"},
                )
            )
        except EngineError as exc:
            raise EngineError(exc.message, hint="the router image needs python3 with Forge installed") from exc
        return LaunchedContainer(engine=self.engine, cid=cid, name=name)

    def leftovers(self, run_id: str) -> list[str]:
        return self.engine.containers_with_label(RUN_LABEL, run_id)

    def sweep(self, run_id: str) -> None:
        for cid in self.engine.containers_with_label(RUN_LABEL, run_id):
            self.engine.stop_and_remove(cid, timeout=2)


POSITIONAL_IMAGE = "IMAGE"
"""How an engine's ServeOptions names the commands' positional image argument (the default engine's)."""


def option_dest(option: str) -> str:
    """The argparse attribute an option is read back from (`--llama-image` → llama_image, IMAGE → image)."""
    return option.lstrip("-").replace("-", "_").lower()


def add_serving_options(
    parser: argparse.ArgumentParser,
    *,
    image_help: str,
    local_help: str | None = None,
    which: Literal["all", "positional", "others"] = "all",
) -> None:
    """Each served engine's image option and host-binary option, from the registry: `forge smoke` and `forge
    sweep` take the same. The engine whose image is the positional IMAGE takes `image_help` for it, and
    `local_help`, when given, for its host binary; every other option says what its engine declares. `which`
    adds only that engine's (positional) or only the others', for a command that lists them apart."""
    for serving in ENGINES.served:
        positional = serving.image_option == POSITIONAL_IMAGE
        if which != "all" and positional != (which == "positional"):
            continue
        if positional:
            parser.add_argument("image", nargs="?", help=image_help)
            parser.add_argument(
                serving.local_option,
                type=Path,
                default=None,
                metavar="PATH",
                help=local_help or serving.serve_options.local_help,
            )
            continue
        parser.add_argument(
            serving.image_option,
            default=None,
            metavar="IMAGE",
            help=serving.serve_options.image_help or f"image with the {serving.title} server for the profile's pools",
        )
        parser.add_argument(
            serving.local_option,
            type=Path,
            default=None,
            metavar="PATH",
            help=serving.serve_options.local_help or f"run {serving.name} pools as host processes of this binary",
        )


def serving_options_given(args: argparse.Namespace) -> list[tuple[str, object]]:
    """Each served engine's options as given on the command line (None where not): (how to name it, value)."""
    out: list[tuple[str, object]] = []
    for serving in ENGINES.served:
        for option in (serving.image_option, serving.local_option):
            out.append((option, getattr(args, option_dest(option), None)))
    return out


@dataclass(frozen=True, kw_only=True)
class Runtimes:
    """Where a stack's replicas and router run, chosen once from the command line: `forge smoke` and `forge
    sweep` start the same stacks. Each serving engine has its own image or host binary."""

    images: Mapping[str, str]
    """Serving engine -> the image its pools run (a pool's own `image` wins)."""
    local: Mapping[str, Path]
    """Serving engine -> the host binary its pools run as processes."""
    router_image: str | None
    engine_choice: EngineChoice = field(default_factory=chosen_engine)
    """The container engine the images run on (--engine, else what the CLI would choose), opened when a
    container is first needed."""
    replica_cache: Path | None = None
    """A directory every replica started through these runtimes shares for its start-up caches (a sweep's
    profiles start the same server on the same model dozens of times); None: each replica starts cold."""

    @classmethod
    def choose(
        cls,
        *,
        images: Mapping[str, str],
        local: Mapping[str, Path],
        router_image: str | None,
        engine: EngineChoice | None = None,
    ) -> Runtimes:
        """From each serving engine's image and host binary, as given (by name; engines not given are left out)."""
        default = ENGINES.default
        if not images and not local:
            others = [e for e in ENGINES.served if e is not default]
            raise UsageError(
                f"give an {default.image_option} to test, or {default.local_option} PATH to run {default.title} on "
                "this host",
                hint="; ".join(
                    f"for a profile's {e.title} pools: {e.image_option} IMAGE or {e.local_option} PATH" for e in others
                )
                or None,
            )
        for kind in set(images) & set(local):
            serving = serving_engine(kind)
            raise UsageError(f"give either {serving.image_option} or {serving.local_option}, not both")
        return cls(
            images=dict(images), local=dict(local), router_image=router_image, engine_choice=chosen_engine(engine)
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Runtimes:
        """From the options `forge smoke` and `forge sweep` both take (add_serving_options' and --router-image),
        so the two commands cannot read them differently."""
        images: dict[str, str] = {}
        local: dict[str, Path] = {}
        for serving in ENGINES.served:
            image = getattr(args, option_dest(serving.image_option), None)
            binary = getattr(args, option_dest(serving.local_option), None)
            if image is not None:
                images[serving.name] = image
            if binary is not None:
                local[serving.name] = binary
        return cls.choose(
            images=images, local=local, router_image=args.router_image, engine=getattr(args, "engine", None)
        )

    @property
    def image(self) -> str | None:
        """The default engine's image, the one `forge smoke IMAGE` names."""
        return self.images.get(ENGINES.default.name)

    @cached_property
    def engine(self) -> Engine:
        return connect(self.engine_choice)

    def pull_pinned(self) -> list[str]:
        """Pull every image named by digest (NAME@sha256:…) now, so the stack runs exactly what the registry holds
        under that digest, whatever the engine has under the name; returns one line per pull."""
        lines = []
        for ref in dict.fromkeys(r for r in (*self.images.values(), self.router_image) if r and "@sha256:" in r):
            image_id = self.engine.pull(ref)
            served = self.engine.image_info(ref).digests
            if ref not in served:
                raise EngineError(f"pulled {ref}, but the engine records it as {', '.join(served) or 'no digest'}")
            lines.append(f"pulled {ref} → image {image_id[:19]}")
        return lines

    def replicas(self, kind: str, image: str | None, model_dir: Path, logs_dir: Path) -> ReplicaRuntime:
        """The runtime of pools running serving engine `kind` (from `image`, the pool's own, when given)."""
        serving = serving_engine(kind)
        if image is None and kind in self.local:
            return LocalReplicas(
                self.local[kind], model_dir=model_dir, log_dir=logs_dir, serving=serving, cache_dir=self.replica_cache
            )
        chosen = image or self.images.get(kind)
        if chosen is None:
            raise UsageError(
                f"the profile has {serving.title} pools, and no image or host binary was given for them",
                hint=f"give {serving.image_option} IMAGE or {serving.local_option} PATH (or the pool's `image`)",
            )
        return ContainerReplicas(
            self.engine, chosen, model_dir=model_dir, serving=serving, cache_dir=self.replica_cache
        )

    def router(self, logs_dir: Path) -> RouterRuntime:
        if self.router_image is not None:
            return ContainerRouter(self.engine, self.router_image)
        return LocalRouter(log_dir=logs_dir)
