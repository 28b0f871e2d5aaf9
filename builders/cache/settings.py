"""What the user asked of the caches, decided once: `--compiler-cache URL` (FORGE_COMPILER_CACHE),
`--cache-registry HOST/REPO` (FORGE_CACHE_REGISTRY), `--cache-export/--no-cache-export` (FORGE_CACHE_EXPORT) and
`--require-cache` (FORGE_REQUIRE_CACHE=1).

A compiler-cache URL names the backend and where it is; credentials come from the URL's user part or from the
variables sccache itself reads (SCCACHE_REDIS_PASSWORD, AWS_SECRET_ACCESS_KEY, …), and are kept apart from
everything else: `CompilerCache.secrets` reaches the compile step as a build secret and nothing else
(secret.py). Every value is checked here, where it enters: one line, no control characters.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from builders.errors import UsageError
from builders.registry.reference import Reference, parse_reference

Backend = Literal["local", "redis", "s3", "webdav", "gha"]
BACKENDS: tuple[Backend, ...] = ("local", "redis", "s3", "webdav", "gha")

ENV_COMPILER = "FORGE_COMPILER_CACHE"
ENV_REGISTRY = "FORGE_CACHE_REGISTRY"
ENV_EXPORT = "FORGE_CACHE_EXPORT"
ENV_REQUIRE = "FORGE_REQUIRE_CACHE"

# The credentials each backend reads, by sccache's own names (and AWS's, GitHub's): taken from the environment
# Forge runs in, never from a file it writes into the context.
CREDENTIALS: dict[Backend, tuple[str, ...]] = {
    "local": (),
    "redis": ("SCCACHE_REDIS_USERNAME", "SCCACHE_REDIS_PASSWORD"),
    "s3": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
    "webdav": ("SCCACHE_WEBDAV_USERNAME", "SCCACHE_WEBDAV_PASSWORD", "SCCACHE_WEBDAV_TOKEN"),
    "gha": ("ACTIONS_RESULTS_URL", "ACTIONS_CACHE_URL", "ACTIONS_RUNTIME_TOKEN"),
}

_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])(?::\d{1,5})?")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_PATH = re.compile(r"[A-Za-z0-9._~/-]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _one_line(value: str, where: str) -> str:
    if _CONTROL.search(value):
        raise UsageError(f"{where}: a control character or line break in a cache setting", hint="one line, no tabs")
    return value


@dataclass(frozen=True, kw_only=True)
class CompilerCache:
    """The compiler launcher and its backend. local: ccache on the engine's cache mount, as Forge always did;
    any other backend: sccache, whose cache outlives the runner."""

    backend: Backend = "local"
    endpoint: str = ""  # where the cache is, without credentials: safe for the log and the report
    settings: dict[str, str] = field(default_factory=dict)  # what sccache reads besides credentials
    secrets: dict[str, str] = field(default_factory=dict)  # credentials: the compile step's build secret only

    @property
    def launcher(self) -> Literal["ccache", "sccache"]:
        return "ccache" if self.backend == "local" else "sccache"

    @property
    def shared(self) -> bool:
        return self.backend != "local"

    def describe(self) -> str:
        return (
            "local ccache (the engine's cache mount)"
            if not self.shared
            else f"sccache on {self.backend} {self.endpoint}"
        )


LOCAL = CompilerCache()


def _credentials(backend: Backend, environ: Mapping[str, str], where: str) -> dict[str, str]:
    return {name: _one_line(environ[name], f"{where}: ${name}") for name in CREDENTIALS[backend] if environ.get(name)}


def parse_compiler_cache(text: str, environ: Mapping[str, str], *, where: str = "--compiler-cache") -> CompilerCache:
    """`local`; `redis://[USER[:PASSWORD]@]HOST[:PORT][/DB]` (rediss:// for TLS);
    `s3://BUCKET[/PREFIX]?endpoint=URL&region=NAME`; `webdav+https://HOST/PATH` (webdav+http on loopback); `gha`."""
    text = _one_line(text.strip(), where)
    if text in ("", "local"):
        return LOCAL
    if text == "gha":
        secrets = _credentials("gha", environ, where)
        if "ACTIONS_RUNTIME_TOKEN" not in secrets or not (
            {"ACTIONS_RESULTS_URL", "ACTIONS_CACHE_URL"} & secrets.keys()
        ):
            raise UsageError(
                f"{where} gha: ACTIONS_RUNTIME_TOKEN and ACTIONS_RESULTS_URL are not in the environment",
                hint="GitHub sets them for actions only: expose them to the build step (forge ci's rendered "
                "workflow does, with actions/github-script), or use another backend",
            )
        return CompilerCache(
            backend="gha", endpoint="GitHub Actions cache", settings={"SCCACHE_GHA_ENABLED": "on"}, secrets=secrets
        )
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme in ("redis", "rediss"):
        backend: Backend = "redis"
    elif scheme == "s3":
        backend = "s3"
    elif scheme in ("webdav+http", "webdav+https"):
        backend = "webdav"
    else:
        raise UsageError(
            f"{where} {_masked(text)!r}: not a compiler cache",
            hint="use local, redis://HOST:PORT, s3://BUCKET?endpoint=URL, webdav+https://HOST/PATH or gha",
        )
    host = parts.hostname or ""
    netloc_host = parts.netloc.rpartition("@")[2]
    if not netloc_host or not _HOST.fullmatch(netloc_host):
        raise UsageError(f"{where} {_masked(text)!r}: {netloc_host!r} is not a host[:port]")
    if not _PATH.fullmatch(parts.path):
        raise UsageError(f"{where} {_masked(text)!r}: {parts.path!r} is not a path (letters, digits, . _ ~ / -)")
    secrets = _credentials(backend, environ, where)
    query = dict(parse_qsl(parts.query))
    if backend == "redis":
        if parts.username:
            secrets["SCCACHE_REDIS_USERNAME"] = unquote(parts.username)
        if parts.password:
            secrets["SCCACHE_REDIS_PASSWORD"] = unquote(parts.password)
        settings = {"SCCACHE_REDIS_ENDPOINT": f"{scheme}://{netloc_host}"}
        db = parts.path.strip("/")
        if db:
            if not db.isdigit():
                raise UsageError(f"{where} {_masked(text)!r}: the database {db!r} is not a number")
            settings["SCCACHE_REDIS_DB"] = db
        return CompilerCache(
            backend="redis", endpoint=f"{scheme}://{netloc_host}/{db or 0}", settings=settings, secrets=secrets
        )
    if backend == "s3":
        if not _BUCKET.fullmatch(host):
            raise UsageError(f"{where} {_masked(text)!r}: {host!r} is not an S3 bucket name")
        unknown = sorted(query.keys() - {"endpoint", "region"})
        if unknown:
            raise UsageError(
                f"{where}: unknown parameter {unknown[0]!r}", hint="s3://BUCKET/PREFIX?endpoint=URL&region=NAME"
            )
        settings = {"SCCACHE_BUCKET": host, "SCCACHE_REGION": _one_line(query.get("region", "us-east-1"), where)}
        if parts.path.strip("/"):
            settings["SCCACHE_S3_KEY_PREFIX"] = parts.path.strip("/")
        endpoint = query.get("endpoint", "")
        if endpoint:
            ep = urlsplit(_one_line(endpoint, where))
            if ep.scheme not in ("http", "https") or not _HOST.fullmatch(ep.netloc) or ep.username:
                raise UsageError(f"{where}: endpoint {endpoint!r} is not http(s)://HOST[:PORT]")
            settings["SCCACHE_ENDPOINT"] = ep.netloc
            settings["SCCACHE_S3_USE_SSL"] = "true" if ep.scheme == "https" else "false"
        if not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= secrets.keys():
            raise UsageError(
                f"{where} s3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not in the environment",
                hint="export both (a CI secret): the compile step gets them as a build secret, nothing else does",
            )
        shown = f"s3://{host}/{settings.get('SCCACHE_S3_KEY_PREFIX', '')}" + (f" at {endpoint}" if endpoint else "")
        return CompilerCache(backend="s3", endpoint=shown, settings=settings, secrets=secrets)
    http = scheme.removeprefix("webdav+")
    if parts.username:
        secrets["SCCACHE_WEBDAV_USERNAME"] = unquote(parts.username)
    if parts.password:
        secrets["SCCACHE_WEBDAV_PASSWORD"] = unquote(parts.password)
    url = f"{http}://{netloc_host}{parts.path}"
    return CompilerCache(backend="webdav", endpoint=url, settings={"SCCACHE_WEBDAV_ENDPOINT": url}, secrets=secrets)


def _masked(text: str) -> str:
    """A URL as it may be shown: its password replaced."""
    parts = urlsplit(text)
    if parts.password:
        return text.replace(f":{parts.password}@", ":***@", 1)
    return text


@dataclass(frozen=True, kw_only=True)
class CacheSettings:
    compiler: CompilerCache = LOCAL
    registry: Reference | None = None  # a repository prefix: each distro × target caches under it
    export: bool = True  # push this build's layers to the registry (a pull request's job only imports)
    require: bool = False  # every cache failure is an error

    @property
    def configured(self) -> bool:
        return self.compiler.shared or self.registry is not None


def _flag(value: str, where: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise UsageError(f"{where}={value!r}: not a yes/no value", hint="use 1 or 0")


def parse_registry(text: str, *, where: str = "--cache-registry") -> Reference:
    """HOST[:PORT]/REPO with no tag: Forge names each cache image by the hash of its inputs, never by a tag
    that another build could move."""
    ref = parse_reference(_one_line(text.strip(), where), what=where)
    if ref.tag or ref.digest:
        raise UsageError(
            f"{where} {text!r}: a repository, not an image",
            hint="drop the tag: Forge tags each cache image with the hash of the inputs it was built from",
        )
    return ref


def resolve(
    *,
    compiler_cache: str | None,
    cache_registry: str | None,
    cache_export: bool | None,
    require_cache: bool,
    environ: Mapping[str, str],
) -> CacheSettings:
    """The flags, else the FORGE_* variables; the flag's name or the variable's in every error."""
    compiler_text = compiler_cache if compiler_cache is not None else environ.get(ENV_COMPILER, "")
    compiler = parse_compiler_cache(
        compiler_text, environ, where="--compiler-cache" if compiler_cache is not None else ENV_COMPILER
    )
    registry_text = cache_registry if cache_registry is not None else environ.get(ENV_REGISTRY, "")
    registry = (
        parse_registry(registry_text, where="--cache-registry" if cache_registry is not None else ENV_REGISTRY)
        if registry_text.strip()
        else None
    )
    export = cache_export if cache_export is not None else _flag(environ.get(ENV_EXPORT, "1"), ENV_EXPORT)
    require = require_cache or _flag(environ.get(ENV_REQUIRE, ""), ENV_REQUIRE)
    return CacheSettings(compiler=compiler, registry=registry, export=export, require=require)
