"""Forge's sessions. Build, smoke and render sessions are generated from distros/ × recipes/: no second list.

Every session is a thin wrapper over the `forge` CLI in the current environment (`pip install -e '.[dev]'`),
so `nox -s build-fedora-cpu` and `forge build fedora-44 cpu` are the same thing.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import nox

ROOT = Path(__file__).parent
sys.path.insert(0, str(ROOT))

from builders.project import Project  # noqa: E402
from builders.results import Figure, LoadWatch, Result  # noqa: E402
from builders.target import Target  # noqa: E402

# `nox` alone is the quick run: no root, no apt, no engine, minutes. `nox -s suite` is the full one CI runs.
nox.options.sessions = ["lint", "render", "tests-fast", "docs"]
nox.options.default_venv_backend = "none"

PROJECT = Project.load(ROOT)


def _build_session(distro: str, target: str, aliases: list[str]) -> None:
    def session_fn(session: nox.Session) -> None:
        session.run("forge", "build", distro, target, *session.posargs, external=True)

    session_fn.__doc__ = f"Build {target} on {distro}: preflight, build, test stage, tag, report."
    nox.session(name=f"build-{distro}-{target}", python=False, default=False)(session_fn)
    for alias in aliases:
        alias_fn = _alias(distro, target)
        alias_fn.__doc__ = f"Build {target} on {distro}, the {alias.split('-')[1]} family's default release."
        nox.session(name=alias, python=False, default=False)(alias_fn)


def _alias(distro: str, target: str):  # type: ignore[no-untyped-def]
    def alias_fn(session: nox.Session) -> None:
        session.run("forge", "build", distro, target, *session.posargs, external=True)

    return alias_fn


def _smoke_session(distro: str, target: str) -> None:
    def session_fn(session: nox.Session) -> None:
        session.run(
            "forge", "smoke", f"forge/{distro}-{target}:latest", "--profile", "ci", *session.posargs, external=True
        )

    session_fn.__doc__ = f"Bring up the router stack on the {distro} {target} image and judge each class's gates."
    nox.session(name=f"smoke-{distro}-{target}", python=False, default=False)(session_fn)


def _sweep_result(report_dir: Path, name: str, image: str, command: str, watch: LoadWatch) -> Path:
    """A finished sweep's report as results/NAME.json: per profile the medians over the valid repetitions (class
    gates passed, mean goodput, each class's TTFT/ITL p99 and goodput) and the replicas' time to health."""
    report = json.loads((report_dir / "sweep.json").read_text(encoding="utf-8"))
    units = {"ttft_p99_ms": "ms", "itl_p99_ms": "ms", "goodput": "ratio"}
    figures: dict[str, Figure | tuple[int | float, str]] = {}
    for profile, agg in (report.get("aggregate") or {}).items():
        for key, unit in (("gates_passed", "count"), ("mean_goodput", "ratio")):
            if agg[key]["median"] is not None:
                figures[f"{profile}.{key}"] = (agg[key]["median"], unit)
        for cls, metrics in agg["classes"].items():
            for metric, unit in units.items():
                if metrics[metric]["median"] is not None:
                    figures[f"{profile}.{cls}.{metric}"] = (metrics[metric]["median"], unit)
            figures[f"{profile}.{cls}.gate_passes"] = (metrics["gate_passes"], "count")
    healthy = sorted(
        replica["healthy_after_s"]
        for repetition in report.get("repetitions") or []
        for run in (repetition.get("profiles") or {}).values()
        for replica in ((run.get("startup") or {}).get("replicas") or {}).values()
        if replica.get("healthy_after_s") is not None
    )
    if healthy:
        figures |= {
            "startup.healthy_median": (round(statistics.median(healthy), 1), "s"),
            "startup.healthy_min": (round(healthy[0], 1), "s"),
            "startup.healthy_max": (round(healthy[-1], 1), "s"),
            "startup.replica_starts": (len(healthy), "count"),
        }
    figures["valid_repetitions"] = (sum(bool(r.get("valid", True)) for r in report.get("repetitions") or []), "count")
    return Result.capture(
        name,
        command=command,
        figures=figures,
        versions={"image": image, "dtype": str((report.get("dtype") or {}).get("dtype", ""))},
        load=watch,
        source=str((report_dir / "sweep.json").relative_to(ROOT)),
    ).save(ROOT)


def _sweep_session(distro: str, target: str) -> None:
    def session_fn(session: nox.Session) -> None:
        watch = LoadWatch.start()
        session.run(
            "forge",
            "sweep",
            f"forge/{distro}-{target}:latest",
            "--report",
            str(ROOT / "reports" / f"sweep-{distro}-{target}"),
            # Three repetitions, each with its own seed and the profiles' order rotated: the seed's claims are
            # judged against the spread over repetitions, and one run cannot tell a difference from noise
            # (issue 41). A later --repeat in the session's arguments wins.
            "--repeat",
            "3",
            *session.posargs,
            external=True,
        )
        command = f"nox -s sweep-{distro}-{target} " + " ".join(["--", *session.posargs] if session.posargs else [])
        saved = _sweep_result(
            ROOT / "reports" / f"sweep-{distro}-{target}",
            f"sweep-{distro}-{target}",
            f"forge/{distro}-{target}:latest",
            command.strip(),
            watch,
        )
        session.log(f"wrote {saved}")

    session_fn.__doc__ = (
        f"Run the serving sweep (profiles/sweep/) on the {distro} {target} image, three times: medians, spreads, "
        f"the claims; the figures go to results/sweep-{distro}-{target}.json."
    )
    nox.session(name=f"sweep-{distro}-{target}", python=False, default=False)(session_fn)


for _distro, _recipe in PROJECT.pairs():
    _aliases = [f"build-{_distro.family}-{_recipe.target}"] if _distro.default_for_family else []
    _build_session(_distro.name, _recipe.target, _aliases)
    if Target.resolve(_distro, _recipe).smokes:
        _smoke_session(_distro.name, _recipe.target)
        _sweep_session(_distro.name, _recipe.target)


@nox.session(python=False)
def engines(session: nox.Session) -> None:
    """Set up the engines the tests use (Docker, rootful and rootless Podman) for this host: .ci/engines."""
    session.run("bash", str(ROOT / ".ci" / "engines"), external=True)


@nox.session(python=False)
def render(session: nox.Session) -> None:
    """Render every distro × target Containerfile into rendered/ and lint each with hadolint."""
    out = ROOT / "rendered"
    session.run("forge", "render", "-o", str(out), *session.posargs, external=True)
    session.run("hadolint", *sorted(str(p) for p in out.glob("*.Containerfile")), external=True)


LINTED = ("builders", "tests", "benchmarks", "containers/scripts", "noxfile.py")
"""What ruff checks; mypy's list is pyproject.toml's [tool.mypy] files, the same folders."""


@nox.session(python=False)
def lint(session: nox.Session) -> None:
    """ruff and mypy --strict over the package, the tests, the benchmarks, the scripts builds run and this file."""
    session.run("ruff", "check", *LINTED, external=True)
    session.run("ruff", "format", "--check", *LINTED, external=True)
    session.run("mypy", external=True)


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """All tests, engine- and server-backed ones included (they need the engines: `nox -s engines` first)."""
    # The engine-free tests run beside the engine-backed ones (tests/run_split.py says why): the same tests, less clock.
    session.run("python", str(ROOT / "tests" / "run_split.py"), *session.posargs, external=True)
    # No test leaves a Podman container behind, Forge's or anyone's, buildah's working containers of a stopped
    # build included (--external): `podman ps -a` is empty after the suite.
    session.run(
        "bash",
        "-c",
        'left=$(podman ps --all --external --format "{{.Names}}"); test -z "$left" || { echo "left: $left"; exit 1; }',
        external=True,
    )


@nox.session(python=False, name="tests-fast")
def tests_fast(session: nox.Session) -> None:
    """Every test that needs no engine and no vLLM server (and so no root): the quick run's tests."""
    session.run("pytest", "-m", "not engine and not server", *session.posargs, external=True)


@nox.session(python=False)
def docs(session: nox.Session) -> None:
    """The docs site (docs/, mkdocs.yml) built with --strict: a broken link or a page missing from nav fails."""
    session.run(
        "mkdocs",
        "build",
        "--strict",
        "--site-dir",
        str(ROOT / ".nox" / "site"),
        # Material's banner about MkDocs 2 is advice for the maintainers, not a finding about these pages.
        env={"NO_MKDOCS_2_WARNING": "1"},
        external=True,
    )


@nox.session(python=False, default=False)
def suite(session: nox.Session) -> None:
    """The full suite, what CI runs: the engines (.ci/engines, as root), lint, render + hadolint, the docs, every
    test. One session, so a failed step stops the ones after it: no test starts before the engines are up and the
    linters, the renders and the docs have passed.

    Two things run in the background, because they wait on the network and on one core while the steps beside
    them need the other: the engines' setup (apt-get and daemons on a fresh machine) beside lint, render and docs,
    which need no engine; and the host-process replicas' vLLM venv (tests/smoke/prepare_host_vllm.py says why),
    from the start until the tests that need it, which wait for it under a lock."""
    logs = ROOT / ".nox"
    logs.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()

    def log(what: str) -> None:
        # Seconds since the suite began on every step's line: a CI log then says where its minutes went.
        session.log(f"suite [{time.monotonic() - start:.0f} s]: {what}")

    prepare = _background(
        [sys.executable, str(ROOT / "tests" / "smoke" / "prepare_host_vllm.py")], logs / "prepare-host-vllm.log"
    )
    try:
        log("engines (in the background, beside lint, render and docs)")
        setup = _background(["bash", str(ROOT / ".ci" / "engines")], logs / "engines.log")
        try:
            for step in (lint, render, docs):
                log(str(step.name or step.func.__name__))
                step(session)
        finally:
            # Never cut apt-get off half-way: a failed linter still waits for the engines' setup to end.
            code = setup.wait()
            log("engines: setup ended\n" + (logs / "engines.log").read_text(encoding="utf-8", errors="replace"))
        if code != 0:
            session.error(f".ci/engines exited {code} (its output is above)")
        log("tests")
        tests(session)
        log("tests passed")
    finally:
        # A failed step leaves nothing running; after the tests it has long finished.
        if prepare.poll() is None:
            # The whole group: the script's own pip (download or install) outlived a terminate of the script
            # alone, and went on writing into the wheelhouse folder after its lock was released.
            os.killpg(prepare.pid, signal.SIGTERM)
        prepare.wait()
        said = (logs / "prepare-host-vllm.log").read_text(encoding="utf-8", errors="replace").strip().splitlines()
        log(said[-1] if said else "prepare-host-vllm said nothing")


def _background(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start `command` with its output to `log` (printed by the caller when it ends, so no log interleaves)."""
    with log.open("wb") as out:
        # Its own process group, so that stopping it stops what it started too (os.killpg on its pid).
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


@nox.session(python=False, name="pull-smoke", default=False)
def pull_smoke(session: nox.Session) -> None:
    """Push the Debian 12 cpu-wheel image to a registry; smoke it by digest on an engine that has no images."""
    session.run("python", "-m", "tests.publish.pull_smoke", *session.posargs, external=True)


@nox.session(python=False, name="publish-multiplatform", default=False)
def publish_multiplatform(session: nox.Session) -> None:
    """The multi-platform publish (a long proof, not in `tests`): arm64 router under emulation, one index, by digest."""
    session.run("pytest", "tests/publish/test_multiplatform.py", *session.posargs, external=True)


@nox.session(python=False, name="build-arm64", default=False)
def build_arm64(session: nox.Session) -> None:
    """Build the Debian 12 router and cpu-wheel images for linux/arm64 under qemu-user-static (minutes to hours)."""
    for target in ("router", "cpu-wheel"):
        session.run("forge", "fetch", "debian-12", target, "--platform", "linux/arm64", external=True)
        session.run("forge", "build", "debian-12", target, "--platform", "linux/arm64", *session.posargs, external=True)


@nox.session(python=False, name="ci-matrix")
def ci_matrix(session: nox.Session) -> None:
    """Print the CI matrix as JSON: one entry per distro × target, from the pairs these sessions come from."""
    session.run("forge", "ci", "--format", "matrix", *session.posargs, external=True)


@nox.session(python=False, name="bench-diagnose", default=False)
def bench_diagnose(session: nox.Session) -> None:
    """Diagnosis on tests/logs: per-category precision and recall, leave-one-source-out and leave-one-year-out;
    the figures go to results/diagnosis.json."""
    session.run("python", str(ROOT / "benchmarks" / "bench_diagnose.py"), "--save", *session.posargs, external=True)


@nox.session(python=False, name="bench-diagnose-size", default=False)
def bench_diagnose_size(session: nox.Session) -> None:
    """forge diagnose on real logs padded to 5, 50 and 500 MB: seconds, MB/s and the time ratio between sizes."""
    session.run("python", str(ROOT / "benchmarks" / "bench_diagnose_size.py"), *session.posargs, external=True)


@nox.session(python=False, name="bench-preflight", default=False)
def bench_preflight(session: nox.Session) -> None:
    """Seconds until preflight blocks Debian 12 vs until a plain build reaches vLLM's gate, as a ratio."""
    session.run("python", str(ROOT / "benchmarks" / "bench_preflight.py"), *session.posargs, external=True)


@nox.session(python=False, name="bench-router", default=False)
def bench_router(session: nox.Session) -> None:
    """CPU per request and added TTFT of Forge's router, vllm-router and sglang-router vs a direct connection;
    the figures go to results/router-bench.json (`-- --save NAME` for another name)."""
    session.run("python", str(ROOT / "benchmarks" / "bench_router.py"), "--save", *session.posargs, external=True)


@nox.session(python=False, name="bench-router-instructions", default=False)
def bench_router_instructions(session: nox.Session) -> None:
    """Instructions per streamed request of the router (callgrind), this checkout beside --forge-ref REF."""
    session.run("python", str(ROOT / "benchmarks" / "router_instructions.py"), *session.posargs, external=True)


@nox.session(python=False, name="bench-rebuild", default=False)
def bench_rebuild(session: nox.Session) -> None:
    """The dev loop on a real vLLM tree: cold, no change, a Python line, a csrc/cpu/ line, a requirement edit
    (an hour or more: the cold build compiles all of vLLM's CPU kernels)."""
    session.run("python", str(ROOT / "benchmarks" / "bench_rebuild.py"), "--save", *session.posargs, external=True)


def _rank_result(report_dir: Path, command: str, watch: LoadWatch) -> Path:
    """`forge kvlab rank`'s rank.json as results/kvlab-rank.json: each layout's place, score and criteria (bytes
    and indirections, the same on any machine) and its CPU ms per step at the longest context (not)."""
    rank = json.loads((report_dir / "rank.json").read_text(encoding="utf-8"))
    units = {"metadata": ("B", 1), "kv_read": ("MiB", 2**20), "indirections": ("count", 1)}
    figures: dict[str, Figure | tuple[int | float, str]] = {}
    for row in rank["rank"]:
        layout = row["layout"]
        figures[f"{layout}.place"] = (row["place"] or 0, "count")
        figures[f"{layout}.score"] = (row["score"], "count")
        figures[f"{layout}.ms_at_longest"] = (round(row["ms_at_longest"], 2), "ms")
        for key, value in row["values"].items():
            unit, scale = units.get(key, ("", 1))
            figures[f"{layout}.{key}"] = (round(value / scale, 2), unit or "count")
    return Result.capture(
        "kvlab-rank",
        command=command,
        figures=figures,
        versions={"host": rank.get("host", "")},
        load=watch,
        source=str((report_dir / "rank.json").relative_to(ROOT)),
        note="ms are the process's CPU time of the fastest decode step (NumPy): they move with the host and its load; "
        "bytes, indirections, ranks and places do not",
    ).save(ROOT)


@nox.session(python=False, name="bench-ci-cache", default=False)
def bench_ci_cache(session: nox.Session) -> None:
    """The CI pipeline on fresh runners: cold with export, then the same tree, a Python line, a C++ line and a
    requirement edit, each on empty storage with only the registry and Redis (`-- --subject demo`: minutes)."""
    session.run("python", str(ROOT / "benchmarks" / "bench_ci_cache.py"), *session.posargs, external=True)


@nox.session(python=False, default=False)
def kvlab(session: nox.Session) -> None:
    """The Hybrid KV lab: every oracle case and planted bug, then the layouts' bytes and indirections ranked (a CPU
    count, not a speed: kvlab-gpu times the kernels) into reports/kvlab; the ranking goes to results/kvlab-rank.json."""
    session.run("forge", "kvlab", "check", "--mutants", external=True)
    watch = LoadWatch.start()
    session.run("forge", "kvlab", "rank", "--report", str(ROOT / "reports" / "kvlab"), *session.posargs, external=True)
    if "--quick" not in session.posargs and "cuda" not in session.posargs:
        command = "nox -s kvlab" + (" -- " + " ".join(session.posargs) if session.posargs else "")
        session.log(f"wrote {_rank_result(ROOT / 'reports' / 'kvlab', command, watch)}")


@nox.session(python=False, name="kvlab-kernels", default=False)
def kvlab_kernels(session: nox.Session) -> None:
    """The Triton kernel of every KV layout on the kernel cases, each planted kernel bug too (Triton's interpreter on
    a CPU; `-- --device cuda` compiles them on a GPU). Needs `pip install -e '.[kernels]'`."""
    session.run("forge", "kvlab", "kernels", "--mutants", *session.posargs, external=True)


@nox.session(python=False, name="kvlab-gpu", default=False)
def kvlab_gpu(session: nox.Session) -> None:
    """The KV lab's one prepared GPU run (about 5 minutes, installs nothing): the Triton kernels timed against the
    GPU's memory bandwidth beside SDPA and FlashInfer, the kernel cases and planted bugs compiled; results in
    reports/kvlab-gpu (results.json, results.md). Posargs: --dry-run (interpreter, CPU), --budget S, --out DIR."""
    out = ROOT / "reports" / "kvlab-gpu"
    session.run("python", "-m", "builders.kvlab.gpu_check", "--out", str(out), *session.posargs, external=True)


@nox.session(python=False, name="gpu-probe", default=False)
def gpu_probe(session: nox.Session) -> None:
    """On a GPU host: a tiny kernel per arch of the image's list, SASS-only and PTX-only, run by the driver and
    compared with the GPU gate (reports/gpu-probe); exit 9 without a GPU. Posargs: forge gpu probe's options."""
    session.run("forge", "gpu", "probe", "--out", str(ROOT / "reports" / "gpu-probe"), *session.posargs, external=True)


@nox.session(python=False, name="gpu-smoke", default=False)
def gpu_smoke(session: nox.Session) -> None:
    """On a GPU host: forge gpu probe, then llama-server built with CUDA for the local arch from the vendored tree and
    the six-class smoke through Forge's router on two GPU replicas (one 10-minute command; reports/gpu-smoke); exit 9
    without a GPU. Prepares the bundle first where it is missing (needs PyPI). Posargs: run's options (--dry-run,
    --budget S, --no-probe)."""
    if not (ROOT / ".gpu-smoke" / "manifest.json").is_file():
        session.run("python", "-m", "builders.gpu_smoke", "prepare", external=True)
    session.run("python", "-m", "builders.gpu_smoke", "run", *session.posargs, external=True)


@nox.session(python=False, name="kvlab-mutation", default=False)
def kvlab_mutation(session: nox.Session) -> None:
    """mutmut over the KV lab's pool, kernels, layouts and store, a module at a time under a time limit: killed
    share and survivors (reports/kvlab-mutation, and results/kvlab-mutation.json when every module ran); fails
    below 90 % killed. Posargs: modules, --timeout, --children."""
    save = [] if set(session.posargs) & {"store", "kernel", "pool", "layouts", "--report-only"} else ["--save"]
    session.run("python", "-m", "builders.kvlab.mutation", *save, *session.posargs, external=True)


@nox.session(python=False, name="podman-smoke", default=False)
def podman_smoke(session: nox.Session) -> None:
    """Only the Podman smoke of the suite: the router built with Podman, Docker's cpu-wheel build loaded into
    Podman, the ci profile smoked on them (minutes)."""
    session.run("pytest", "tests/smoke/test_podman_stack.py", "-k", "smoke_on_podman", *session.posargs, external=True)


@nox.session(python=False, name="kube-play", default=False)
def kube_play(session: nox.Session) -> None:
    """Only the kube-play test of the default suite: the ci profile rendered, played with podman kube play, smoked
    through --endpoint, torn down (minutes)."""
    session.run("pytest", "tests/deploy/test_deploy_kube_play.py", "-s", *session.posargs, external=True)


@nox.session(python=False, name="smoke-sglang", default=False)
def smoke_sglang(session: nox.Session) -> None:
    """The ci-sglang profile behind the router on the Debian 13 sglang image (`nox -s build-debian-13-sglang --
    --source sgl-kernel=PATH` first; a CPU with AVX-512 BF16 and AMX)."""
    session.run(
        "forge",
        "smoke",
        "--sglang-image",
        "forge/debian-13-sglang:latest",
        "--profile",
        "ci-sglang",
        *session.posargs,
        external=True,
    )


@nox.session(python=False, name="sweep-engines", default=False)
def sweep_engines(session: nox.Session) -> None:
    """The engine axis of the serving sweep: the shared and class-aware profiles on vLLM (the Debian 12 cpu-wheel
    image), llama.cpp (the Debian 14 llama-cpp image) and SGLang (the Debian 13 sglang image, which needs AVX-512 BF16
    and AMX: left out, saying why, on a CPU without them), the same seeded traffic, each engine calibrated on its own
    replica, one engine × profile table."""
    from builders.engines import serving_engine
    from builders.serving_dtype import this_host

    engines = ["vllm", "llama-cpp"]
    images = ["forge/debian-12-cpu-wheel:latest", "--llama-image", "forge/debian-14-llama-cpp:latest"]
    if (why := serving_engine("sglang").host_problem(this_host())) is None:
        engines.append("sglang")
        images += ["--sglang-image", "forge/debian-13-sglang:latest"]
    else:
        session.log(f"SGLang left out of this sweep: {why}")
    session.run(
        "forge",
        "sweep",
        *images,
        "--engines",
        ",".join(engines),
        "--profiles",
        "shared,class-aware",
        "--report",
        str(ROOT / "reports" / "sweep-engines"),
        *session.posargs,
        external=True,
    )
