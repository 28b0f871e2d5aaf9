"""Every build leaves a report: what was built from what, how long each phase took, what was found."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from builders import interrupt
from builders.errors import ForgeError, PreflightBlocked


@dataclass
class BuildReport:
    distro: str
    target: str
    recipe: str
    result: str = "running"  # running | succeeded | failed | blocked | interrupted
    error: str | None = None
    ended_in: str | None = None  # the phase that was running when the build failed, was blocked or interrupted
    signal: str | None = None  # what interrupted it: SIGINT (Ctrl-C), SIGTERM or SIGHUP
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    engine: dict[str, Any] = field(default_factory=dict)
    builder: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    fetched_sources: list[dict[str, Any]] = field(default_factory=list)
    base: dict[str, Any] = field(default_factory=dict)
    build_args: dict[str, str] = field(default_factory=dict)
    compile_env: dict[str, str] = field(default_factory=dict)
    torch: dict[str, Any] = field(default_factory=dict)
    ca_bundle: str | None = None
    phases: dict[str, float] = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    image: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    tests: list[dict[str, Any]] = field(default_factory=list)
    preflight: dict[str, Any] | None = None
    diagnosis: dict[str, Any] | None = None
    log: str | None = None
    containerfile: str | None = None
    lock: dict[str, Any] | None = None  # forge.lock entries this build used, and any drift from them
    sbom: dict[str, Any] | None = None  # the image's CycloneDX SBOM: path, sha256, counts
    platform: dict[str, Any] = field(default_factory=dict)  # built for (linux/arm64), and whether under emulation
    # a source-tree build: what each layer reused, the parts' hashes, the files changed since the last build, ccache
    reuse: dict[str, Any] | None = None
    push: dict[str, Any] | None = None  # where `forge push` published the image: ref, registry digest, SBOM, index

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = round(time.monotonic() - start, 2)

    def record_end(self, exc: BaseException, running: str | None) -> None:
        """What stopped the build, during which phase (None: before the first)."""
        self.ended_in = running
        if isinstance(exc, PreflightBlocked):
            self.result, self.error = "blocked", exc.render()
        elif isinstance(exc, KeyboardInterrupt):
            # SIGTERM and SIGHUP arrive as this too (builders/interrupt.py): one path for every way a build stops.
            self.result, self.signal = "interrupted", interrupt.signal_of(exc)
            self.error = f"interrupted by {self.signal} during {running or 'the start'}"
        elif isinstance(exc, ForgeError):
            self.result, self.error = "failed", exc.render()
        else:  # a defect in Forge: the report must not go on saying "running"
            self.result, self.error = "failed", f"{type(exc).__name__}: {exc}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False)

    def summary(self) -> str:
        lines = [f"forge build {self.distro} {self.target}: {self.result.upper()}"]
        if self.error:
            lines.append(f"  error: {self.error.splitlines()[0]}")
        if self.ended_in:
            lines.append(f"  ended in: {self.ended_in} ({self.phases.get(self.ended_in, 0.0):.1f}s)")
        if self.source:
            lines.append(f"  source: {self.source.get('origin')} sha256={self.source.get('sha256')}")
        if self.base:
            lines.append(
                f"  base: {self.base.get('ref')} ({self.base.get('how')}) {self.base.get('image_id', '')[:19]}"
            )
        if self.preflight:
            lines.append(f"  preflight: {preflight_line(self.preflight)}")
        if self.engine:
            mode = "rootless" if self.engine.get("rootless") else "rootful"
            lines.append(f"  engine: {self.engine.get('kind')} {self.engine.get('version')} ({mode})")
        if self.platform.get("name", "linux/amd64") != "linux/amd64":
            emulated = " under emulation (qemu-user-static)" if self.platform.get("emulated") else ""
            lines.append(f"  platform: {self.platform['name']}{emulated}")
            if self.platform.get("stand_in"):
                lines.append(f"    {self.platform['stand_in']}")
        if self.builder:
            version = f" {self.builder['version']}" if self.builder.get("version") else ""
            lines.append(f"  builder: {self.builder.get('name')}{version} ({self.builder.get('cli') or 'engine API'})")
        if self.image:
            size = self.image.get("size", 0) / 1e9
            lines.append(
                f"  image: {', '.join(self.image.get('tags', []))} {self.image.get('id', '')[:19]} {size:.2f} GB"
            )
        elif self.result != "running":
            lines.append("  image: none (nothing was tagged)")
        if self.versions:
            lines.append("  versions: " + ", ".join(f"{k} {v}" for k, v in self.versions.items()))
        if self.phases:
            lines.append("  phases: " + ", ".join(f"{k} {v:.1f}s" for k, v in self.phases.items()))
        from builders.engines.checks import status_text

        for test in self.tests:
            lines.append(f"  test {test['name']}: {status_text(test)}")
        if self.diagnosis:
            lines.append(
                f"  diagnosis: {self.diagnosis.get('category')} at line {self.diagnosis.get('line_number')}: "
                f"{(self.diagnosis.get('line') or '')[:100]}"
            )
            lines.append(f"  remedy: {self.diagnosis.get('remedy')}")
        if self.reuse:
            lines.extend(reuse_lines(self.reuse))
        if self.lock:
            if self.lock.get("matches"):
                state = "matches forge.lock"
            elif self.lock.get("in_lock"):
                state = f"{len(self.lock.get('drift', []))} input(s) differ from forge.lock"
            else:
                state = str(self.lock.get("error", "not in forge.lock"))
            lines.append(f"  lock: {state}")
        if self.sbom:
            lines.append(f"  sbom: {self.sbom.get('path', self.sbom.get('error'))}")
        if self.push:
            lines.append(f"  pushed: {self.push.get('pull')} (registry digest, verified by HEAD)")
            if self.push.get("sbom"):
                lines.append(f"  sbom in registry: {self.push['sbom'].get('ref')}")
            if self.push.get("index"):
                index = self.push["index"]
                lines.append(f"  index: {index.get('ref')} {index.get('digest')} ({', '.join(index['platforms'])})")
        if self.log:
            lines.append(f"  log: {self.log}")
        return "\n".join(lines)

    def write(self, folder: Path) -> Path:
        """Both files staged beside their final names, then renamed in place: a reader, or a signal that ends the
        process, never finds a half-written report or a summary of another write."""
        folder.mkdir(parents=True, exist_ok=True)
        staged = []
        for name, text in (("report.json", self.to_json()), ("summary.txt", self.summary())):
            tmp = folder / f".{name}.new"
            tmp.write_text(text + "\n")
            staged.append((tmp, folder / name))
        for tmp, final in staged:
            tmp.replace(final)
        return folder / "report.json"


def preflight_line(preflight: dict[str, Any]) -> str:
    """The verdict as the summary states it: never clear for a gate that was not evaluated."""
    verdict = str(preflight.get("verdict", "?"))
    if verdict == "skipped":
        return f"SKIPPED ({preflight.get('why', '')})"
    blocking = [f["gate"] for f in preflight.get("findings", []) if f.get("blocking")]
    skipped = list(preflight.get("not_evaluated", []))
    parts = [f"blocking: {', '.join(blocking)}"] if blocking else []
    parts += [f"not evaluated: {', '.join(skipped)}"] if skipped else []
    passed = len(preflight.get("passed", []))
    return f"{verdict.upper() if verdict != 'clear' else verdict} ({'; '.join([*parts, f'{passed} passed'])})"


def reuse_lines(reuse: dict[str, Any]) -> list[str]:
    """A source-tree build's reuse section in the summary: one line per layer, then ccache's counters."""
    if "environment" not in reuse:  # a build from an sdist: only the caches' lines
        return cache_lines(reuse)
    env, ext, pkg = reuse.get("environment", {}), reuse.get("extension", {}), reuse.get("package", {})
    lines = [
        f"  environment: {env.get('verdict')} (requirements {str(env.get('requirements_hash'))[:12]})",
        f"  extension: {ext.get('verdict')} (compiler inputs {str(ext.get('compiler_input_hash'))[:12]})",
    ]
    for label, part in (("extension", ext), ("package", pkg)):
        changed = part.get("changed_files")
        if changed:
            more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
            lines.append(f"    {label} files changed since the last build: {', '.join(changed[:5])}{more}")
    ccache = reuse.get("ccache")
    if isinstance(ccache, dict):
        rate = ccache.get("hit_rate")
        lines.append(
            f"  ccache: {ccache.get('hits')} hits, {ccache.get('misses')} misses, "
            f"{ccache.get('uncacheable')} uncacheable, hit rate {'n/a' if rate is None else f'{rate:.0%}'}"
        )
    elif ccache:
        lines.append(f"  ccache: {ccache}")
    lines += cache_lines(reuse)
    return lines


def cache_lines(reuse: dict[str, Any]) -> list[str]:
    """The caches that outlive the runner (builders/cache/): hits and misses per backend, layers imported and
    exported, and every warning a cache gave."""
    lines = []
    compiler = reuse.get("compiler_cache")
    if isinstance(compiler, dict):
        for name, counters in (compiler.get("backends") or {}).items():
            lines.append(
                f"  {compiler.get('launcher')} on {name}: {counters.get('hits')} hits, {counters.get('misses')} misses, "
                f"{counters.get('errors')} errors"
            )
    layer = reuse.get("layer_cache")
    if isinstance(layer, dict) and layer.get("repository"):
        lines.append(
            f"  layer cache {layer['repository']}: imported {', '.join(layer.get('imported') or []) or 'nothing'}; "
            f"exported {', '.join(layer.get('exported') or []) or 'nothing'}"
        )
    lines += [f"  cache warning: {w}" for w in reuse.get("cache_warnings") or []]
    return lines
