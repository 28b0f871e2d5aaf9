"""The registry layer cache: a build's stages exported to a registry the user names, imported by the next runner.

Each builder does what it can, and what it cannot is said, not hidden:

- buildah (`podman build`) pushes every step's layer as it builds (`--cache-to REPO`) and looks each step up before
  running it (`--cache-from REPO`). Its tags are the hash of the step's own inputs (parent layer, instruction,
  the content of what it copies): a cache image from other inputs has another tag and is never looked at.
- BuildKit behind Debian's docker.io 20.10 has no buildx, so no `--cache-to type=registry`: it can only embed an
  inline cache in the image it builds (`BUILDKIT_INLINE_CACHE=1`) and import such images (`--cache-from`). Forge
  therefore builds each named stage as its own image with the inline cache, names it `REPO:STAGE-KEY` by the hash
  of that stage's inputs (`stage_keys`), labels it with the same key, and pushes it; the next runner imports the
  ones whose label carries the key it computed, by digest. What is lost against a buildx registry cache: one push
  per stage (the env stage's build-only layers are stored as an image), and steps are matched only within the
  stages Forge exports. BuildKit still checks each step's own cache key, and each layer's digest as it pulls it:
  a tampered layer is refused and that step runs instead.
- The legacy builder imports and exports nothing: the build goes on without the registry, and says so.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from builders.container.base import Builder, BuildRequest, BuildResult, Engine, LineSink
from builders.errors import ForgeError
from builders.registry.client import RegistryClient
from builders.registry.reference import Reference

Mode = Literal["registry", "inline", "none"]
KEY_LABEL = "dev.forge.cache.key"
_STAGE = re.compile(r"^FROM\s+\S+\s+AS\s+([\w.-]+)\s*$", re.IGNORECASE | re.MULTILINE)


def stage_names(containerfile: str) -> list[str]:
    return _STAGE.findall(containerfile)


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def stage_keys(
    containerfile: str,
    *,
    build_args: Mapping[str, str],
    base_id: str,
    parts: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A key per named stage: the Containerfile, the build arguments and the base, and for a source tree the
    hashes of the parts each stage copies (`parts`: requirements, compiler_inputs, package → hash). A stage's key
    folds in only the parts it or its parents read, so a Python edit keeps the env's and the extension's keys."""
    common = _digest(containerfile, json.dumps(dict(build_args), sort_keys=True), base_id)
    parts = dict(parts or {})
    # The dev loop's stages (containers/_devloop.j2) and the parts each reads; any other stage reads every part.
    reads: dict[str, tuple[str, ...]] = {
        "toolchain": (),
        "env": ("requirements",),
        "extension": ("requirements", "compiler_inputs"),
        "venv": ("requirements",),
        "runtime-venv": ("requirements",),
    }
    every = tuple(sorted(parts))
    keys = {}
    for stage in stage_names(containerfile):
        wanted = reads.get(stage, every) if parts else ()
        keys[stage] = _digest(common, stage, *(f"{p}={parts[p]}" for p in wanted if p in parts))
    return keys


def tag_for(stage: str, key: str) -> str:
    return f"{stage}-{key[:40]}"


def repository(registry: Reference, distro: str, target: str) -> Reference:
    """The cache's repository for one distro × target under the registry the user named."""
    return Reference(host=registry.host, name=f"{registry.name}/{distro}-{target}")


@dataclass(frozen=True, kw_only=True)
class Candidate:
    stage: str
    ref: str  # REPO@sha256:… for BuildKit's --cache-from
    key: str


@dataclass(frozen=True, kw_only=True)
class Lookup:
    found: list[Candidate] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # stages with no image for their key yet
    refused: list[str] = field(default_factory=list)  # an image under the key's tag whose label is another key


def find_inline(client: RegistryClient, repo: Reference, keys: Mapping[str, str]) -> Lookup:
    """The stage images a BuildKit build can import: those whose tag and label carry the key this build computed.
    A RegistryError (unreachable, refused) propagates: the caller turns it into a warning."""
    found: list[Candidate] = []
    missing: list[str] = []
    refused: list[str] = []
    for stage, key in keys.items():
        head = client.head_manifest(repo.name, tag_for(stage, key))
        if head is None:
            missing.append(stage)
            continue
        manifest, _media, digest = client.get_manifest(repo.name, head[0])
        config_digest = str((manifest.get("config") or {}).get("digest") or "")
        labels = _config_labels(client, repo, config_digest)
        if labels.get(KEY_LABEL) != key:
            refused.append(stage)
            continue
        found.append(Candidate(stage=stage, ref=f"{repo.repository}@{digest}", key=key))
    return Lookup(found=found, missing=missing, refused=refused)


def _config_labels(client: RegistryClient, repo: Reference, digest: str) -> dict[str, str]:
    blob = client.get_blob(repo.name, digest) if digest.startswith("sha256:") else None
    if blob is None:
        return {}  # missing, or not hashing to its digest: no evidence of anything
    try:
        config = json.loads(blob)
    except ValueError:
        return {}
    labels = (config.get("config") or {}).get("Labels") or {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


# What a failed build's log says when the registry cache, not the build, failed: buildah 1.28 fails the whole
# build when a --cache-to push fails (a registry that went away mid-build).
CACHE_FAILURE = re.compile(r"failed (?:pushing|pulling) cache (?:to|from)|Error: .*cache.*(?:registry|manifest)", re.I)


def cache_failure(log: str, repo: str) -> str | None:
    """The log line that blames the layer cache for a failed build, or None when the build failed on its own.
    buildah 1.28 may not say so in its last words: a --cache-to push that failed in one stage can leave another
    stage to panic (a nil pointer in intermediateImageExists), so any failed request to the cache's registry
    host counts."""
    host = repo.split("/", 1)[0]
    for line in reversed(log.splitlines()[-400:]):
        if CACHE_FAILURE.search(line) or (host in line and re.search(r"\berror\b|failed|refused", line, re.I)):
            return line.strip()[:300]
    return None


def probe_registry(registry: Reference) -> str | None:
    """None when the registry answers /v2/ (with or without asking for a login), else why not."""
    try:
        status = RegistryClient(registry).ping()
    except ForgeError as exc:
        return exc.message
    return f"HTTP {status}" if status >= 500 else None


def summary(found: Sequence[Candidate]) -> list[str]:
    return [f"{c.stage} ({c.ref.rsplit('@', 1)[-1][:19]})" for c in found]


def build_or_retry(
    builder: Builder, request: BuildRequest, sink: LineSink, repo: str
) -> tuple[BuildResult, str | None]:
    """The build; when it failed on the layer cache, once more without it (its finished steps come from the
    engine's own cache). The second value is the log line that blamed the cache, when there was a retry."""
    result = builder.build(request, sink)
    if result.ok or not (request.cache_from or request.cache_to):
        return result, None
    log_path = request.log_path
    log = log_path.read_text(errors="replace") if log_path and log_path.exists() else ""
    line = cache_failure(log, repo)
    if line is None:
        return result, None
    if log_path is not None:
        shutil.copy2(log_path, log_path.with_name(log_path.stem + "-cache-attempt.log"))
    return builder.build(replace(request, cache_from=(), cache_to=None), sink), line


def export_inline(
    builder: Builder, engine: Engine, request: BuildRequest, repo: Reference, keys: Mapping[str, str]
) -> tuple[list[str], list[str]]:
    """BuildKit's export: each stage built as its own image with the inline cache (every step cached: seconds),
    labelled and tagged with its key, pushed, and its tag removed again. (stages exported, problems)."""
    exported: list[str] = []
    problems: list[str] = []
    for stage, key in keys.items():
        ref = f"{repo.repository}:{tag_for(stage, key)}"
        log = request.log_path.with_name("cache-export.log") if request.log_path else None
        result = builder.build(
            replace(
                request,
                target=stage,
                labels={KEY_LABEL: key},
                cache_from=(),
                cache_to="inline",
                no_cache=False,
                log_path=log,  # the build's own log stays as it was
            ),
            lambda _line: None,
        )
        if not result.ok or result.image_id is None:
            problems.append(f"stage {stage} could not be built again for export; it is not exported")
            continue
        try:
            engine.tag(result.image_id, ref)
            engine.push(ref)
            exported.append(stage)
        except ForgeError as exc:
            problems.append(f"the push of stage {stage} failed ({exc.message}); the next runner builds it")
        finally:
            engine.untag(ref)
    return exported, problems
