"""The CI image pipeline on fresh runners: how long a build takes on a machine whose storage is empty, when the
only caches are a registry (the layers) and a Redis (sccache's objects). Steps, in order:

    runner-a       cold: every layer built, every translation unit compiled, layers and objects exported
    same-inputs    a fresh runner, the same tree: every layer from the registry
    python-edit    a fresh runner, one line added to the package: nothing compiled (the extension from the registry)
    cpp-edit       a fresh runner, one line of code in one C++ file: that file compiled, the rest from Redis
    requirements   a fresh runner, one comment line in the requirements: the environment again, objects from Redis

Each step runs on a runner of its own: a dockerd with its own data root (Docker), or Podman on its own storage
root, created for the step and removed after it, with the base image carried in from the main engine (as a CI
runner pulls its base) and, for the vLLM subject, a Forge cache folder of its own. The registry and Redis are
started by the benchmark on loopback, with their data under --work, so they outlive the steps and a --resume.

    python benchmarks/bench_ci_cache.py [--subject vllm|demo] [--engine docker|podman] [--source DIR]
                                         [--distro debian-13] [--max-jobs N] [--torch-index pypi] [--resume STEP]

--subject demo runs every step on the dev loop's small CMake project (tests/rebuild/project) in minutes: the
plumbing of the real run (runners, services, edits, rows, --resume) on a tree that compiles in seconds.
--resume STEP applies the edits of the steps before STEP without building them and takes their rows from their
reports in the same folder. Results: reports/bench-ci-cache/<subject>-<engine>/results.json, and a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args

from builders.bootstrap import ensure_base
from builders.cache import layers
from builders.cache.phase import TemplateLauncher
from builders.cache.sccache_stats import record_from_log
from builders.cache.secret import SECRET_ID, write_secret
from builders.cache.settings import parse_compiler_cache, parse_registry
from builders.config.models import TorchIndex
from builders.container import BuildRequest, Engine, choose_builder, connect
from builders.errors import ForgeError
from builders.project import Project
from builders.rebuild.devtree import PARTS, TreeLayout, split_tree, stage_parts
from builders.rebuild.reuse import verdict
from builders.registry import local
from builders.registry.client import RegistryClient
from builders.render import render_template
from builders.results import Figure, LoadWatch, Result, unsaved_because
from builders.trust import find_ca_bundle

ROOT = Path(__file__).resolve().parents[1]
Edit = Callable[[Path], None]


def _append(rel: str, line: str) -> Edit:
    def edit(tree: Path) -> None:
        path = tree / rel
        path.write_text(path.read_text() + line + "\n")

    return edit


def _nothing(_tree: Path) -> None:
    return None


# A value of this run's own for the C++ edit: Redis outlives a run (that is what --resume needs), so a line a run
# before this one compiled would be a hit here, and the row would not measure the one file's compile it is for.
RUN_VALUE = secrets.randbelow(2**31 - 1)

# (step, edit) per subject; code edits change code, not a comment (a comment is a preprocessed-mode hit).
EDITS: dict[str, tuple[tuple[str, Edit], ...]] = {
    "vllm": (
        ("runner-a", _nothing),
        ("same-inputs", _nothing),
        ("python-edit", _append("vllm/logger.py", "_FORGE_BENCH_CI_CACHE = 1")),
        (
            "cpp-edit",
            _append(
                "csrc/cpu/activation.cpp", f"[[maybe_unused]] static const int forge_bench_ci_cache = {RUN_VALUE};"
            ),
        ),
        ("requirements", _append("requirements/cpu.txt", "# forge bench-ci-cache: the environment's key changes")),
    ),
    "demo": (
        ("runner-a", _nothing),
        ("same-inputs", _nothing),
        ("python-edit", _append("demo/__init__.py", "_FORGE_BENCH_CI_CACHE = 1")),
        ("cpp-edit", _append("csrc/ops.cpp", f"[[maybe_unused]] static const int forge_bench_ci_cache = {RUN_VALUE};")),
        ("requirements", _append("requirements/runtime.txt", "# forge bench-ci-cache")),
    ),
}
STEPS = tuple(step for step, _ in EDITS["vllm"])
assert tuple(step for step, _ in EDITS["demo"]) == STEPS
# Issue 52's goals for a fresh runner on 2 cores, vLLM's tree (seconds); the cold and requirements steps have none.
GOALS = {"same-inputs": 600, "python-edit": 180, "cpp-edit": 480}


def figures_of(rows: list[dict[str, Any]]) -> dict[str, Figure]:
    """A run's rows as named figures: each step's wall time, its goal and by how much it missed, and the compiler
    cache's counters per backend (a step that compiled nothing has none)."""
    figures: dict[str, Figure] = {}
    for row in rows:
        step = row["step"]
        if row.get("result") != "succeeded" or row.get("wall_s") is None:
            continue
        figures[f"{step}.wall"] = Figure(value=row["wall_s"], unit="s")
        if step in GOALS:
            figures[f"{step}.goal"] = Figure(value=GOALS[step], unit="s")
            if row["wall_s"] > GOALS[step]:
                figures[f"{step}.over_goal"] = Figure(value=round(row["wall_s"] - GOALS[step], 1), unit="s")
        for backend, counts in (row.get("compiler_cache") or {}).items():
            for key in ("hits", "misses"):
                figures[f"{step}.{backend}_{key}"] = Figure(value=int(counts[key]), unit="count")
    return figures


# --- services: a registry and a Redis whose data outlive the steps --------------------------------------------


def _free_port() -> int:
    return local.free_port()


@contextlib.contextmanager
def services(work: Path) -> Iterator[tuple[str, int, str]]:
    """(registry host:port, Redis port, Redis password); Redis persists to work/redis so --resume finds its objects."""
    password_file = work / "redis-password"
    if not password_file.exists():
        password_file.write_text(secrets.token_hex(16))
        password_file.chmod(0o600)
    password = password_file.read_text().strip()
    port = _free_port()
    (work / "redis").mkdir(parents=True, exist_ok=True)
    redis = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--requirepass",
            password,
            "--dir",
            str(work / "redis"),
            "--appendonly",
            "yes",
            "--save",
            "60 1",
        ],
        stdout=(work / "redis" / "redis.log").open("ab"),
        stderr=subprocess.STDOUT,
    )
    registry_port = _free_port()
    registry = local.start(work / "registry", registry_port)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            if time.monotonic() > deadline or redis.poll() is not None:
                raise SystemExit("redis-server did not start: see " + str(work / "redis" / "redis.log"))
            time.sleep(0.2)
        yield f"127.0.0.1:{registry_port}", port, password
    finally:
        local.stop(registry)
        redis.terminate()
        redis.wait(timeout=30)


# --- fresh runners ------------------------------------------------------------------------------------------


def _mounts_under(root: Path) -> list[str]:
    points = {line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines() if len(line.split()) > 1}
    return sorted((p for p in points if p == str(root) or p.startswith(f"{root}/")), key=len, reverse=True)


@contextlib.contextmanager
def fresh_runner(kind: str, root: Path) -> Iterator[Engine]:
    """An engine with empty storage, for one step; its environment variable points Forge and the engine's CLI at it
    while the step runs, and everything under root is removed after it."""
    # A run killed outright (SIGKILL, a machine taken away) cannot clean up after itself: its dockerd's mounts stay
    # under root and would make this runner's storage neither empty nor removable, so they go first.
    _remove_root(root)
    root.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in ("DOCKER_HOST", "CONTAINERS_STORAGE_CONF")}
    proc: subprocess.Popen[bytes] | None = None
    try:
        if kind == "docker":
            sock = root / "docker.sock"
            proc = subprocess.Popen(
                [
                    "dockerd",
                    "--bridge=none",
                    "--iptables=false",
                    f"--data-root={root / 'data'}",
                    f"--exec-root={root / 'exec'}",
                    f"--pidfile={root / 'dockerd.pid'}",
                    f"--host=unix://{sock}",
                    f"--containerd-namespace=forge-bench-{root.name}",
                    f"--containerd-plugins-namespace=forge-bench-{root.name}-plugins",
                ],
                stdout=(root / "dockerd.log").open("wb"),
                stderr=subprocess.STDOUT,
            )
            os.environ["DOCKER_HOST"] = f"unix://{sock}"
        else:
            conf = root / "storage.conf"
            conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{root}/graph"\nrunroot = "{root}/run"\n')
            os.environ["CONTAINERS_STORAGE_CONF"] = str(conf)
        deadline = time.monotonic() + 60
        while True:
            try:
                engine = connect(kind)  # type: ignore[arg-type]
                break
            except ForgeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        yield engine
    finally:
        if kind == "podman":
            subprocess.run(["podman", "rmi", "--all", "--force"], capture_output=True, check=False)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        _remove_root(root)


def _remove_root(root: Path) -> None:
    for point in _mounts_under(root):
        subprocess.run(["umount", "-l", point], check=False)
    shutil.rmtree(root, ignore_errors=True)


def publish_base(source: Engine, ref: str, registry: str) -> str:
    """The base in the benchmark's registry, where each fresh runner pulls it as a CI runner would: a pull keeps
    its id (a save and load through a docker-archive gives Podman's image a new config, and buildah's step keys a
    new parent)."""
    remote = f"{registry}/forge-bench-base:{ref.rsplit(':', 1)[-1]}"
    source.tag(source.image_info(ref).id, remote)
    source.push(remote)
    source.untag(remote)
    return remote


def pull_base(target: Engine, remote: str, ref: str) -> None:
    target.tag(target.pull(remote), ref)
    target.untag(remote)


# --- one step, per subject ----------------------------------------------------------------------------------


def _row(step: str, seconds: float, reuse: dict[str, Any], result: str) -> dict[str, Any]:
    """A table row from a report's reuse section as JSON (the build report's, or the demo's own)."""
    compiler = reuse.get("compiler_cache") or {}
    layer = reuse.get("layer_cache") or {}
    return {
        "step": step,
        "result": result,
        "wall_s": round(seconds, 1),
        "environment": (reuse.get("environment") or {}).get("verdict"),
        "extension": (reuse.get("extension") or {}).get("verdict"),
        "package": (reuse.get("package") or {}).get("verdict"),
        "imported": layer.get("imported"),
        "compiler_cache": compiler.get("backends"),
        "fallback": compiler.get("fallback"),
        "warnings": reuse.get("cache_warnings"),
    }


def run_vllm(
    project: Project, args: argparse.Namespace, tree: Path, step: str, out: Path, env: dict[str, str]
) -> dict[str, Any]:
    """forge build on the fresh runner: the same path a CI job takes."""
    from builders.build import BuildOptions, build

    start = time.monotonic()
    with _environ(env):
        report = build(
            project,
            project.distro(args.distro),
            project.recipe_for("cpu"),
            BuildOptions(
                source_overrides={"vllm": tree},
                reports_dir=out,
                no_cache=step == "runner-a",
                skip_tests=True,
                max_jobs=args.max_jobs,
                torch_index=args.torch_index,
                engine=args.engine,
            ),
            lambda line: print(line, flush=True),
        )
    return _row(step, time.monotonic() - start, report.reuse.as_json() if report.reuse else {}, report.result)


DEMO_LAYOUT = TreeLayout(
    requirements=("requirements/**",),
    compiler_inputs=("csrc/**", "CMakeLists.txt", "setup.py", "pyproject.toml"),
    package=("demo/**",),
)
DEMO_FOLDERS = {"requirements": "requirements", "compiler_inputs": "compiler-inputs", "package": "package"}


def run_demo(
    project: Project, args: argparse.Namespace, tree: Path, step: str, out: Path, env: dict[str, str]
) -> dict[str, Any]:
    """The small project through the dev loop's template, built by the runner's builder with the caches wired as
    builders/cache/phase.py wires them."""
    engine = connect(args.engine)
    builder = choose_builder(engine, "auto")
    base = ensure_base(project.distro("debian-12"), engine)
    ca_bundle = find_ca_bundle()[0]
    cache = parse_compiler_cache(env["FORGE_COMPILER_CACHE"], env)
    secret = write_secret(cache, require=False, scratch=out)
    text = render_template(
        project.containers_dir,
        "devtree-test.Containerfile.j2",
        base_ref=base.ref,
        tree="tree",
        workdir="/src/demo",
        cache_mount=True,
        cache_id="forge-bench-ci-cache",
        compiler_cache=TemplateLauncher(ca_bundle=ca_bundle is not None),
    )
    context = out / "context"
    shutil.rmtree(context, ignore_errors=True)
    split = split_tree(tree, DEMO_LAYOUT)
    stage_parts(split, {part: context / "tree" / DEMO_FOLDERS[part] for part in PARTS})
    (context / "scripts").mkdir(parents=True)
    shutil.copy2(project.containers_dir / "scripts" / "compiler_cache.py", context / "scripts")
    (context / "Containerfile").write_text(text)
    base_id = str(engine.image_info(base.ref).id)
    keys = layers.stage_keys(
        text,
        build_args={},
        base_id=base_id,
        parts={
            "requirements": split.requirements_hash,
            "compiler_inputs": split.compiler_input_hash({}, base_id),
            "package": split.package_hash,
        },
    )
    repo_ref = parse_registry(env["FORGE_CACHE_REGISTRY"])
    repo = layers.repository(repo_ref, "debian-12", "demo")
    export = step == "runner-a"
    if builder.layer_cache == "registry":
        fields: dict[str, Any] = {"cache_from": (repo.repository,), "cache_to": repo.repository if export else None}
        imported: list[str] = []
    else:
        found = layers.find_inline(RegistryClient(repo), repo, keys)
        fields = {"cache_from": tuple(c.ref for c in found.found), "cache_to": "inline" if export else None}
        imported = layers.summary(found.found)
    request = BuildRequest(
        context_dir=context,
        containerfile=context / "Containerfile",
        target="runtime",
        secrets={SECRET_ID: secret, **({"ca_bundle": ca_bundle} if ca_bundle else {})},
        log_path=out / "build.log",
        no_cache=export,
        **fields,
    )
    start = time.monotonic()
    result, retried = layers.build_or_retry(builder, request, lambda line: print(line, flush=True), repo.repository)
    exported: list[str] = []
    if result.ok and export and builder.layer_cache == "inline":
        exported, _problems = layers.export_inline(builder, engine, request, repo, keys)
    seconds = time.monotonic() - start
    log = (out / "build.log").read_text(errors="replace")
    if builder.layer_cache == "registry":
        imported = [line.split("remote ", 1)[-1] for line in log.splitlines() if "Cache pulled from remote" in line]
    reuse = {
        "environment": {"verdict": verdict(log, "env")},
        "extension": {"verdict": verdict(log, "extension")},
        "package": {"verdict": verdict(log, "runtime")},
        "layer_cache": {"imported": imported, "exported": exported},
        "compiler_cache": record_from_log(log) or {},
        "cache_warnings": [retried] if retried else [],
    }
    (out / "report.json").write_text(
        json.dumps({"result": "succeeded" if result.ok else "failed", "reuse": reuse, "wall_s": seconds}, indent=1)
    )
    shutil.rmtree(secret.parent, ignore_errors=True)
    return _row(step, seconds, reuse, "succeeded" if result.ok else "failed")


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _tree(args: argparse.Namespace, scratch: Path) -> Path:
    tree = scratch / "tree"
    if args.subject == "demo":
        shutil.copytree(ROOT / "tests" / "rebuild" / "project", tree)
        return tree
    if args.source is not None:
        shutil.copytree(args.source, tree, symlinks=True, ignore=shutil.ignore_patterns(".git", "build", "__pycache__"))
        return tree
    from builders.sources import resolve_sdist

    project = Project.load()
    sdist = resolve_sdist(project.recipe_for("cpu"), project.root, {}).path
    with tarfile.open(sdist) as archive:
        archive.extractall(scratch / "unpacked", filter="data")
    (unpacked,) = (scratch / "unpacked").iterdir()
    unpacked.rename(tree)
    return tree


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--subject", choices=sorted(EDITS), default="vllm")
    parser.add_argument("--engine", choices=("docker", "podman"), default="docker")
    parser.add_argument("--source", type=Path, help="a vLLM checkout or unpacked sdist (default: the pinned sdist)")
    parser.add_argument("--distro", default="debian-13")
    parser.add_argument("--max-jobs", type=int, default=None)
    parser.add_argument("--torch-index", choices=get_args(TorchIndex), default=None)
    parser.add_argument("--resume", choices=STEPS[1:], default=None)
    parser.add_argument(
        "--work", type=Path, default=None, help="the runners' roots (default: /var/tmp/forge-bench-ci-cache)"
    )
    parser.add_argument(
        "--save", action="store_true", help="also write results/ci-cache-SUBJECT-ENGINE.json, the summary docs quote"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    watch = LoadWatch.start()
    # Loaded once: a run of hours reads the distros and recipes it started with, not a tree edited meanwhile (a
    # recipe key added to the tree during a run made its next step a config error in the code it had loaded).
    project = Project.load()
    out = project.root / "reports" / "bench-ci-cache" / f"{args.subject}-{args.engine}"
    work = args.work or Path("/var/tmp/forge-bench-ci-cache")
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    first = STEPS.index(args.resume) if args.resume else 0
    if first == 0:
        # A run from the start: no earlier layers or objects may answer for the cold runner.
        for old in ("registry", "redis"):
            shutil.rmtree(out / old, ignore_errors=True)
    main_engine = connect(args.engine)
    base_ref = ensure_base(project.distro("debian-12" if args.subject == "demo" else args.distro), main_engine).ref
    run = run_demo if args.subject == "demo" else run_vllm
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="forge-bench-ci-cache-") as scratch, services(out) as (registry, port, pw):
        tree = _tree(args, Path(scratch))
        remote_base = publish_base(main_engine, base_ref, registry)
        env = {
            "FORGE_COMPILER_CACHE": f"redis://127.0.0.1:{port}",
            "SCCACHE_REDIS_PASSWORD": pw,
            "FORGE_CACHE_REGISTRY": f"{registry}/forge-cache",
        }
        for index, (step, edit) in enumerate(EDITS[args.subject]):
            edit(tree)
            if index < first:
                earlier = json.loads((out / step / "report.json").read_text())
                wall = earlier.get("wall_s") or sum((earlier.get("phases") or {}).values())
                rows.append(
                    _row(step, wall, earlier.get("reuse") or {}, earlier.get("result", "?")) | {"from_report": True}
                )
                continue
            (out / step).mkdir(parents=True, exist_ok=True)
            step_env = {**env, "FORGE_CACHE_EXPORT": "1" if step == "runner-a" else "0"}
            if args.subject == "vllm":
                # The runner's own Forge cache: nothing fetched by an earlier step is there.
                step_env["FORGE_CACHE"] = str(work / f"forge-cache-{step}")
                shutil.rmtree(work / f"forge-cache-{step}", ignore_errors=True)  # a killed run's, if any
            try:
                with fresh_runner(args.engine, work / f"runner-{step}") as runner:
                    pull_base(runner, remote_base, base_ref)
                    rows.append(run(project, args, tree, step, out / step, step_env))
            except ForgeError as exc:
                rows.append({"step": step, "result": "blocked", "error": exc.message})
            finally:
                shutil.rmtree(work / f"forge-cache-{step}", ignore_errors=True)
            if rows[-1]["result"] != "succeeded":
                break
    (out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    if args.save and (why := unsaved_because(rows)):
        print(f"results/ci-cache-{args.subject}-{args.engine}.json left as it was (this run: {why})")
    elif args.save:
        saved = Result.capture(
            f"ci-cache-{args.subject}-{args.engine}",
            command="nox -s bench-ci-cache -- " + " ".join(sys.argv[1:] if argv is None else argv),
            figures=figures_of(rows),
            versions={"engine": main_engine.facts.describe(), "distro": args.distro, "python": sys.version.split()[0]},
            load=watch,
            source=f"reports/bench-ci-cache/{args.subject}-{args.engine}/results.json",
            note="; ".join(f"{row['step']}: {row['result']}" for row in rows),
        ).save(project.root)
        print(f"wrote {saved}")
    print(f"{'step':<14}{'wall s':>8}  {'env':<10}{'extension':<11}{'package':<10}compiler cache")
    for row in rows:
        backends = row.get("compiler_cache") or {}
        stats = "; ".join(f"{name} {c['hits']} hits {c['misses']} misses" for name, c in backends.items())
        print(
            f"{row['step']:<14}{row.get('wall_s', '-')!s:>8}  {row.get('environment')!s:<10}"
            f"{row.get('extension')!s:<11}{row.get('package')!s:<10}{stats or row.get('error', '')}"
        )
    return 0 if all(row["result"] == "succeeded" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
