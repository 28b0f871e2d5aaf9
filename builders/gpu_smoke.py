"""`nox -s gpu-smoke`: Forge's router stack on GPU replicas, where the GPU hosts within reach allow it.

Those hosts have a GPU, nvcc, CMake and Python with torch, but no container engine, no network and none of
pydantic, httptools, docker or gguf, so a GPU image cannot run there. This brings the stack another way, in one
command of at most 10 minutes that carries at most 64 MiB:

1. `prepare` (here, with PyPI): the llama.cpp tree vendored in the llama-cpp recipe's pinned sdist, less what a
   server build never reads (docs, models, tests, other GPU backends), and the wheels Forge needs that those hosts
   lack, into a bundle folder (default .gpu-smoke/, ignored by git; the device tool carries it by name).
2. `run` (on the GPU host): first `forge gpu probe` (builders/gpu_probe.py) on the local GPUs, the driver's word
   on the GPU gate (OUT/probe/probe.json; --no-probe skips it); the wheels into a private folder; llama-server built
   with CUDA for the local GPU's arch, with the recipe's CMake options (builders/engines/llama_cpp/image.py) plus
   GGML_CUDA; then `forge smoke` of the ci-llama profile with its two pools on the GPU (every layer offloaded)
   through Forge's router: the six request classes and their gates. Results: OUT/results.json, results.md,
   log.txt, the smoke report and logs. It is the one command a GPU session runs.

Without a GPU, `run` says so and exits 9 (nothing evaluated). `run --dry-run` takes the same path on a CPU with the
CPU build of the same tree (the offload flag reaches a llama-server with no GPU), to test the plumbing; it reuses its
build folder between runs.
Exit codes: 0 the smoke passed and the probe agreed; 7 the build failed; 8 the smoke failed; 9 no GPU; else, with
the smoke passed, the probe's own (23: the driver and the gate disagree; 9: a variant not run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TextIO, TypedDict

if TYPE_CHECKING:
    from builders.results import LoadWatch

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / ".gpu-smoke"
LIMIT_BYTES = 64 * 2**20
"""What one device command may carry, the working tree included."""
VENDORED = "vendor/llama.cpp/"
# What a llama-server build never reads: left out of the bundle to keep it small.
_SKIP_TOP = {
    "docs", "models", "benches", "tests", "examples", "pocs", "gguf-py", "media", ".github", ".devops", "ci",
    "conversion", "skills", "requirements", "app", "grammars",
}  # fmt: skip
_SKIP_PARTS = ("tools/ui/src/", "tools/ui/tests/", "tools/ui/package-lock.json")
_GGML_BACKENDS_KEPT = {"ggml-cpu", "ggml-cuda", "ggml-blas"}
# Forge's dependencies the GPU hosts lack (their Python has the rest: numpy, requests, rich, PyYAML, tokenizers...).
CARRIED = ("pydantic", "pydantic_core", "annotated_types", "typing_inspection", "httptools", "gguf", "docker")
EXIT_BUILD, EXIT_SMOKE, EXIT_NO_GPU = 7, 8, 9
# The probe's archs: the gpu-wheel recipe's list, plus an `a` and an `f` arch, whose rules differ from a plain one's.
PROBE_ARCHS = "7.5 8.0 8.6 8.9 9.0 9.0a 10.0 10.0f 12.0"
PROBE_TIMEOUT_S = 150.0

# results.json's shape. TypedDicts, not pydantic models: the run starts where pydantic is not installed yet.


class GpuRow(TypedDict):
    """One GPU as nvidia-smi lists it."""

    name: str
    capability: str
    driver: str
    memory: str


class HostRecord(TypedDict):
    machine: str
    cpus: int | None
    python: str


class BundleManifest(TypedDict):
    """The bundle's manifest.json: what `prepare` packed."""

    sdist: str
    sdist_sha256: str
    tree_files: int
    wheels: list[str]
    bytes: int


class BuildRecord(TypedDict):
    seconds: float
    cuda_arch: str | None
    binary: str | None
    timed_out: NotRequired[bool]


class ClassRow(TypedDict):
    """One request class of the smoke's main traffic run, from its typed report."""

    pool: str
    requests: int
    errors: int
    ttft_p99_ms: float | None
    itl_p99_ms: float | None
    passed: bool


class ProbeRecord(TypedDict):
    """`forge gpu probe`, run first: its exit code and probe.json's verdict (None where it wrote none)."""

    exit: int
    verdict: str | None
    seconds: float
    json: str | None


class SmokeRecord(TypedDict):
    exit: int
    tail: list[str]
    report: NotRequired[str]
    classes: NotRequired[dict[str, ClassRow]]


class GpuSmokeResult(TypedDict):
    when: str
    host: HostRecord
    dry_run: bool
    verdict: str
    gpus: list[GpuRow]
    seconds: NotRequired[float]
    why_not_evaluated: NotRequired[str]
    bundle: NotRequired[BundleManifest]
    probe: NotRequired[ProbeRecord]
    wheels_installed: NotRequired[list[str]]
    router_relay: NotRequired[str]
    build: NotRequired[BuildRecord]
    smoke: NotRequired[SmokeRecord]
    offload: NotRequired[dict[str, list[str]]]
    gpu_processes: NotRequired[dict[str, int]]


class Log:
    """Each line to stdout and to log.txt as it comes: a run stopped by its time limit keeps what it said."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file: TextIO = path.open("w", encoding="utf-8")
        self.start = time.monotonic()
        self.lock = threading.Lock()

    def __call__(self, line: str) -> None:
        text = f"[{time.monotonic() - self.start:6.1f} s] {line}"
        with self.lock:
            print(text, flush=True)
            self.file.write(text + "\n")
            self.file.flush()


def run_logged(
    cmd: Sequence[str], say: Log, *, timeout: float, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> tuple[int, list[str]]:
    """The command's output line by line into the log; its exit code (124 when it ran past `timeout`).

    The process itself is waited on, never a reader of its pipe: a process that hands its pipe to a child which
    outlives it would otherwise hold the wait forever (the `wait` after `exec > >(tee ...)` trap, in Python)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
    lines: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            say("  " + line.rstrip())

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = 124
    reader.join(timeout=2)
    return code, lines


# --- prepare ------------------------------------------------------------------------------------------------


def _keep(relative: str) -> bool:
    top = relative.split("/", 1)[0]
    if top in _SKIP_TOP or top.startswith("."):
        return False
    if any(relative.startswith(p) for p in _SKIP_PARTS):
        return False
    m = re.match(r"ggml/src/(ggml-[a-z0-9]+)/", relative)
    return not (m and m[1] not in _GGML_BACKENDS_KEPT)


def pack_tree(sdist: Path, dest: Path) -> int:
    """The vendored llama.cpp tree of the sdist, pruned, as dest (a .tar.gz); returns the files kept."""
    kept = 0
    with tarfile.open(sdist) as src, tarfile.open(dest, "w:gz", compresslevel=9) as out:
        for member in src:
            _, _, inside = member.name.partition("/")
            if not inside.startswith(VENDORED) or not (member.isfile() or member.isdir()):
                continue
            relative = inside[len(VENDORED) :]
            if not relative or not _keep(relative):
                continue
            member.name = f"llama.cpp/{relative}"
            data = src.extractfile(member) if member.isfile() else None
            out.addfile(member, data)
            kept += member.isfile()
    return kept


def llama_sdist() -> Path:
    """The llama-cpp recipe's pinned sdist, from the Forge cache or PyPI, its sha256 checked (builders/sources)."""
    from builders.project import Project
    from builders.sources import fetch_sdist

    return fetch_sdist(Project.load(ROOT).recipe_for("llama-cpp"), ROOT).path


def download_wheels(dest: Path) -> list[str]:
    """The CARRIED packages at the versions this Forge runs with, as wheels for the GPU hosts' CPython 3.12."""
    from importlib.metadata import version

    pins = [f"{name}=={version(name)}" for name in CARRIED]
    platforms = [f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version=3.12",
           "--implementation=cp", *platforms, "-d", str(dest), *pins]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return pins


def prepare(bundle: Path) -> BundleManifest:
    if bundle.exists():
        shutil.rmtree(bundle)
    (bundle / "wheels").mkdir(parents=True)
    sdist = llama_sdist()
    files = pack_tree(sdist, bundle / "llama.cpp.tar.gz")
    pins = download_wheels(bundle / "wheels")
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    manifest: BundleManifest = {
        "sdist": sdist.name,
        "sdist_sha256": hashlib.sha256(sdist.read_bytes()).hexdigest(),
        "tree_files": files,
        "wheels": pins,
        "bytes": size,
    }
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    if size > LIMIT_BYTES // 2:
        raise SystemExit(f"the bundle is {size / 2**20:.1f} MiB: more than half of what a device command may carry")
    return manifest


# --- run ----------------------------------------------------------------------------------------------------


def local_gpus() -> list[GpuRow]:
    """nvidia-smi's GPUs (name, capability, driver, memory), or none."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    query = "--query-gpu=name,compute_cap,driver_version,memory.total"
    proc = subprocess.run([smi, query, "--format=csv,noheader"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return []
    gpus: list[GpuRow] = []
    for line in proc.stdout.strip().splitlines():
        name, cap, driver, memory = (p.strip() for p in line.rsplit(",", 3))
        gpus.append({"name": name, "capability": cap, "driver": driver, "memory": memory})
    return gpus


def install_wheels(bundle: Path, site: Path, say: Log) -> list[str]:
    """The bundle's wheels into `site`, for those packages this Python cannot import already."""
    from importlib.metadata import PackageNotFoundError, version

    wanted = []
    for wheel in sorted((bundle / "wheels").glob("*.whl")):
        name = wheel.name.split("-", 1)[0]
        try:
            version(name)
        except PackageNotFoundError:
            wanted.append(wheel)
    if wanted:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--target", str(site), *map(str, wanted)]  # fmt: skip
        subprocess.run(cmd, check=True)
    say(f"wheels installed into {site}: {', '.join(w.name.split('-', 1)[0] for w in wanted) or 'none needed'}")
    return [w.name for w in wanted]


def forge_env(site: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def cmake_options(env: dict[str, str]) -> dict[str, str]:
    """The llama-cpp recipe's CMake options and ISA, as Forge's image build passes them."""
    code = (
        "import json, yaml; from builders.engines.llama_cpp.image import CMAKE_DEFINES;"
        "isa = yaml.safe_load(open('recipes/llama-cpp.yaml'))['isa'];"
        "print(json.dumps({**CMAKE_DEFINES, **isa}))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


def build_server(
    bundle: Path, work: Path, *, arch: str | None, jobs: int, timeout: float, env: dict[str, str], say: Log
) -> tuple[Path | None, float, int]:
    """llama-server from the bundle's tree: with CUDA for `arch` (90 for 9.0), or the CPU build when arch is None.
    The build folder is kept: a second run only relinks."""
    src = work / "src"
    if not (src / "llama.cpp" / "CMakeLists.txt").is_file():
        src.mkdir(parents=True, exist_ok=True)
        with tarfile.open(bundle / "llama.cpp.tar.gz") as tar:
            tar.extractall(src, filter="data")
    build = work / ("build-cuda" if arch else "build-cpu")
    options = cmake_options(env)
    if arch:
        # One real arch: the local GPU's, the least nvcc work. FlashAttention's many template kernels and NCCL
        # (not on these hosts) are left out; llama.cpp falls back to its plain attention path.
        options |= {"GGML_CUDA": "ON", "CMAKE_CUDA_ARCHITECTURES": f"{arch}-real", "GGML_CUDA_FA": "OFF",
                    "GGML_CUDA_NCCL": "OFF"}  # fmt: skip
    cmd = ["cmake", "-S", str(src / "llama.cpp"), "-B", str(build), *(f"-D{k}={v}" for k, v in options.items())]
    if shutil.which("ninja"):
        cmd[1:1] = ["-G", "Ninja"]
    started = time.monotonic()
    say("configure: " + " ".join(cmd))
    code, _ = run_logged(cmd, say, timeout=timeout)
    if code == 0:
        left = timeout - (time.monotonic() - started)
        code, _ = run_logged(
            ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)], say, timeout=left
        )
    seconds = time.monotonic() - started
    binary = build / "bin" / "llama-server"
    return (binary if code == 0 and binary.is_file() else None), seconds, code


def write_profile(work: Path, *, gpus: int) -> Path:
    """ci-llama with its two pools on the GPU(s): every layer offloaded, one GPU per pool where there are two."""
    import yaml

    data = yaml.safe_load((ROOT / "profiles" / "ci-llama.yaml").read_text(encoding="utf-8"))
    data["description"] = "ci-llama's two pools with every layer on the GPU (nox -s gpu-smoke)"
    for index, pool in enumerate(data["pools"].values()):
        pool.pop("cpus", None)
        pool["extra_args"] = ["--n-gpu-layers", "999"] if gpus else []
        if gpus:
            pool["env"] = {"CUDA_VISIBLE_DEVICES": str(index % gpus)}
    work.mkdir(parents=True, exist_ok=True)
    path = work / "gpu-llama.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def class_rows(report: Mapping[str, object]) -> dict[str, ClassRow]:
    """Each class of the smoke report's main traffic run (requests, errors, p99s, its gate), each read through the
    smoke report's own model: a report of another shape is an error, not a table of blanks. Called once the carried
    wheels are importable (pydantic)."""
    from builders.smoke.report import ClassRecord

    traffic = report.get("traffic")
    main = traffic.get("main") if isinstance(traffic, dict) else None
    classes = main.get("classes") if isinstance(main, dict) else None
    rows: dict[str, ClassRow] = {}
    for name, data in (classes or {}).items():
        c = ClassRecord.model_validate(data)
        rows[name] = {
            "pool": c.pool,
            "requests": c.requests,
            "errors": c.errors,
            "ttft_p99_ms": c.ttft_ms.p99,
            "itl_p99_ms": c.itl_ms.p99,
            "passed": c.gate_passed,
        }
    return rows


class GpuProcesses:
    """nvidia-smi's compute processes, sampled each second until stopped: the largest GPU memory each held."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        query = ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"]
        while not self.done.wait(1.0):
            try:
                out = subprocess.run(query, capture_output=True, text=True, timeout=10, check=False).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            for line in out.strip().splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) == 3 and parts[2].isdigit():
                    key = f"{parts[0]} {Path(parts[1]).name}"
                    self.seen[key] = max(self.seen.get(key, 0), int(parts[2]))

    def stop(self) -> dict[str, int]:
        self.done.set()
        self.thread.join(timeout=15)
        return {key: mib for key, mib in sorted(self.seen.items())}


def probe_step(
    out: Path,
    work: Path,
    *,
    archs: str,
    say: Log,
    env: Mapping[str, str] | None = None,
    timeout: float = PROBE_TIMEOUT_S,
) -> ProbeRecord:
    """`python3 -m builders.gpu_probe` on this host's GPUs, in the same command as the smoke: a GPU session starts
    once. The probe needs nothing the wheels bring, so it runs before they are installed."""
    started = time.monotonic()
    cmd = [sys.executable, "-m", "builders.gpu_probe", "--out", str(out), "--work", str(work), "--image-archs", archs]
    say("probe: " + " ".join(cmd))
    code, _ = run_logged(cmd, say, timeout=timeout, env=env, cwd=ROOT)
    path = out / "probe.json"
    verdict = None
    if path.is_file():
        data = json.loads(path.read_text(encoding="utf-8"))
        verdict = str(data["verdict"]) if isinstance(data, dict) and "verdict" in data else None
    return {
        "exit": code,
        "verdict": verdict,
        "seconds": round(time.monotonic() - started, 1),
        "json": str(path) if path.is_file() else None,
    }


def final_code(smoke_code: int, probe: ProbeRecord | None, *, dry_run: bool) -> int:
    """The run's exit code: the smoke's where it did not pass; else the probe's, save its "no GPU" in a dry run."""
    if smoke_code != 0 or probe is None or probe["exit"] == 0:
        return smoke_code
    if dry_run and probe["exit"] == EXIT_NO_GPU:
        return smoke_code
    return probe["exit"]


def offload_evidence(report_dir: Path) -> dict[str, list[str]]:
    """Per replica log, the lines where llama.cpp says what went to the GPU."""
    found: dict[str, list[str]] = {}
    pattern = re.compile(r"offloaded \d+/\d+ layers to GPU|CUDA\d+ (?:model|KV|compute) buffer size|using device CUDA")
    for log in sorted(report_dir.rglob("*.log")):
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if pattern.search(ln)]
        found[log.name] = lines[:6]
    return found


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    say = Log(out / "log.txt")
    started = time.monotonic()
    gpus = [] if args.dry_run else local_gpus()
    result: GpuSmokeResult = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "dry_run": args.dry_run,
        "verdict": "not evaluated",
        "gpus": gpus,
    }

    watch = None
    if args.save:
        from builders.results import LoadWatch

        watch = LoadWatch.start(root=ROOT)

    def finish(code: int) -> int:
        code = final_code(code, result.get("probe"), dry_run=args.dry_run)
        result["seconds"] = round(time.monotonic() - started, 1)
        (out / "results.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        (out / "results.md").write_text(results_md(result), encoding="utf-8")
        say(f"{result['verdict']} in {result['seconds']} s: {out / 'results.json'}")
        if args.save and code == 0:
            say(f"saved {save_result(args.save, result, watch, argv=sys.argv[1:])}")
        return code

    if not gpus and not args.dry_run:
        result["why_not_evaluated"] = "no GPU: nvidia-smi is missing or lists none"
        say("forge: cannot evaluate without a GPU: nvidia-smi is missing or lists no GPU (--dry-run runs on a CPU)")
        return finish(EXIT_NO_GPU)
    for gpu in gpus:
        say(f"GPU: {gpu['name']}, compute capability {gpu['capability']}, driver {gpu['driver']}, {gpu['memory']}")
    bundle: Path = args.bundle
    if not (bundle / "llama.cpp.tar.gz").is_file():
        result["verdict"] = "no bundle"
        say(f"forge: {bundle} holds no bundle: run `python3 -m builders.gpu_smoke prepare` where PyPI is reachable")
        return finish(2)
    manifest: BundleManifest = json.loads((bundle / "manifest.json").read_text())
    result["bundle"] = manifest
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    if args.probe:
        result["probe"] = probe_step(out / "probe", work / "probe", archs=args.probe_archs, say=say)
    site = work / "site"
    result["wheels_installed"] = install_wheels(bundle, site, say)
    sys.path.insert(0, str(site))  # what --save needs (pydantic), where this Python lacks it
    env = forge_env(site)
    # The router's C relay for this Python where a compiler and its headers are there; else the Python relay.
    relay = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    result["router_relay"] = "C (built here)" if relay.returncode == 0 else "Python (the C relay did not build)"
    say(f"router relay: {result['router_relay']}")
    arch = None if args.dry_run else gpus[0]["capability"].replace(".", "")
    build_budget = args.budget - (time.monotonic() - started) - args.smoke_reserve
    binary, build_s, build_code = build_server(
        bundle, work, arch=arch, jobs=args.jobs, timeout=build_budget, env=env, say=say
    )
    build: BuildRecord = {"seconds": round(build_s, 1), "cuda_arch": arch, "binary": str(binary) if binary else None}
    result["build"] = build
    if binary is None:
        # Past its share of the budget the build stops; its folder stays, and a run started again at once (while
        # the machine is still the same) goes on from where it stopped.
        timed_out = build_code == 124
        build["timed_out"] = timed_out
        result["verdict"] = "build ran out of time: run again to go on" if timed_out else "build failed"
        return finish(EXIT_BUILD)
    # The dry run takes the GPU profile too: its offload flag goes through Forge's check against the CPU build's
    # --help and reaches llama-server, which has no GPU to put layers on.
    profile = write_profile(work, gpus=len(gpus) or 1)
    report = out / "smoke"
    cmd = [sys.executable, "-m", "builders.cli", "smoke", "--profile", str(profile), "--local-llama-server",
           str(binary), "--report", str(report)]  # fmt: skip
    left = args.budget - (time.monotonic() - started) - 10
    say("smoke: " + " ".join(cmd))
    # What the driver says runs on the GPUs meanwhile: the replicas' own evidence that they were offloaded.
    sampler = GpuProcesses() if gpus else None
    code, lines = run_logged(cmd, say, timeout=left, env=env, cwd=ROOT)
    smoke: SmokeRecord = {"exit": code, "tail": lines[-40:]}
    result["smoke"] = smoke
    reports = sorted(report.glob("*.json"))
    if reports:
        smoke["report"] = str(reports[-1])
        smoke["classes"] = class_rows(json.loads(reports[-1].read_text()))
    result["offload"] = offload_evidence(report)
    if sampler is not None:
        result["gpu_processes"] = sampler.stop()
    result["verdict"] = "passed" if code == 0 else "smoke failed"
    return finish(0 if code == 0 else EXIT_SMOKE)


def save_result(name: str, result: GpuSmokeResult, watch: LoadWatch | None, *, argv: list[str]) -> Path:
    """results/NAME.json (builders/results.py): the run's times, with the machine and its load."""
    from builders.results import Figure, Result

    # Called for a run that passed: it has its bundle, its build and its time.
    build, bundle = result["build"], result["bundle"]
    figures = {
        "total": Figure(value=result.get("seconds", 0.0), unit="s", note="the whole run, the build included"),
        "build": Figure(value=build["seconds"], unit="s", note="configure and build of llama-server"),
        "bundle": Figure(value=round(bundle["bytes"] / 2**20, 1), unit="MiB", note="what the run carries"),
    }
    gpus = result["gpus"]
    versions = {"llama.cpp sdist": bundle["sdist"], "python": platform.python_version()}
    if gpus:
        versions |= {"gpu": gpus[0]["name"], "driver": gpus[0]["driver"]}
    return Result.capture(
        name,
        command="python3 -m builders.gpu_smoke " + " ".join(argv),
        figures=figures,
        versions=versions,
        load=watch,
        source=result["smoke"].get("report", "") if "smoke" in result else "",
        note="dry run: the CPU build, no GPU" if result.get("dry_run") else "",
        root=ROOT,
    ).save(ROOT)


def results_md(result: GpuSmokeResult) -> str:
    gpus = result["gpus"]
    lines = [
        f"# gpu-smoke, {result['when']}",
        "",
        f"- verdict: **{result['verdict']}**" + (" (dry run on a CPU)" if result.get("dry_run") else ""),
        "- GPUs: " + ("; ".join(f"{g['name']} ({g['capability']}, driver {g['driver']})" for g in gpus) or "none"),
        f"- host: {result['host']['cpus']} CPUs, Python {result['host']['python']}",
    ]
    if "probe" in result:
        probe = result["probe"]
        lines.append(
            f"- forge gpu probe: {probe['verdict'] or 'no probe.json'} (exit {probe['exit']}, {probe['seconds']} s)"
        )
    if "build" in result:
        lines.append(f"- llama-server build: {result['build']['seconds']} s, CUDA arch {result['build']['cuda_arch']}")
    classes = result["smoke"].get("classes") if "smoke" in result else None
    if classes:
        lines += [
            "",
            "| class | pool | requests | errors | TTFT p99 ms | ITL p99 ms | gate |",
            "| --- | --- | ---: | ---: | ---: | ---: | --- |",
        ]
        for name, c in classes.items():
            gate = "pass" if c["passed"] else "FAIL"
            lines.append(
                f"| {name} | {c['pool']} | {c['requests']} | {c['errors']} | {c['ttft_p99_ms']} | {c['itl_p99_ms']} "
                f"| {gate} |"
            )
    processes = result.get("gpu_processes")
    if processes is not None:
        shown = "; ".join(f"{k}: {v} MiB" for k, v in processes.items()) or "none seen"
        lines += ["", f"Processes on the GPU during the smoke (nvidia-smi, peak memory): {shown}"]
    offload = result.get("offload") or {}
    if offload:
        lines += ["", "Offload, from the replicas' logs:"]
        lines += [f"- {log}: {'; '.join(found) or 'no offload line found'}" for log, found in offload.items()]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m builders.gpu_smoke", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    prep = sub.add_parser("prepare", help="pack the llama.cpp tree and the wheels a GPU host lacks (needs PyPI)")
    prep.add_argument("--bundle", type=Path, default=BUNDLE)
    go = sub.add_parser("run", help="build llama-server with CUDA and smoke the router stack on the GPU")
    go.add_argument("--bundle", type=Path, default=BUNDLE)
    go.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "reports" / "gpu-smoke"))
    go.add_argument("--work", type=Path, default=Path(os.environ.get("FORGE_CACHE") or "/tmp") / "gpu-smoke-work")
    go.add_argument("--budget", type=float, default=570.0, help="seconds for the whole run (default 570)")
    go.add_argument("--smoke-reserve", type=float, default=100.0, help="seconds kept from the build for the smoke")
    go.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    go.add_argument("--dry-run", action="store_true", help="on a CPU: the CPU build of the same tree, no GPU")
    go.add_argument(
        "--probe",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run `forge gpu probe` on the GPUs first, into OUT/probe (default: yes)",
    )
    go.add_argument("--probe-archs", default=PROBE_ARCHS, metavar="LIST", help=f"the probe's archs ({PROBE_ARCHS})")
    go.add_argument("--save", default=None, metavar="NAME", help="also write results/NAME.json when the run passes")
    args = parser.parse_args(argv)
    if args.action == "prepare":
        manifest = prepare(args.bundle)
        print(f"forge: {args.bundle}: {manifest['bytes'] / 2**20:.1f} MiB ({manifest['tree_files']} files, wheels "
              f"{', '.join(manifest['wheels'])})")  # fmt: skip
        return 0
    if args.budget <= args.smoke_reserve or args.jobs < 1:
        parser.error("--budget must exceed --smoke-reserve, and --jobs be 1 or more")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
