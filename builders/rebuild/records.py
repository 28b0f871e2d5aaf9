"""What a build reused, as its report records it: for a source tree each layer's verdict, the parts' hashes and the
files changed (builders/engines/vllm/devloop.py), and for any build the compiler cache's counters per backend and the registry
layer cache (builders/cache/). Here, below the build and the caches, so that both fill the section they own."""

from __future__ import annotations

from pydantic import Field

from builders.records import Record, absent


class EnvironmentReuse(Record):
    verdict: str = Field(description="reused or rebuilt")
    requirements_hash: str = Field(description="the hash that keys the layer")
    changed_files: list[str] | None = Field(description="files changed since the last build; null without one")


class ExtensionReuse(Record):
    verdict: str = Field(description="reused or rebuilt")
    compiler_input_hash: str = Field(description="the hash that keys the layer")
    changed_files: list[str] | None = Field(description="files changed since the last build; null without one")


class PackageReuse(Record):
    verdict: str = Field(description="reused or rebuilt")
    package_hash: str = Field(description="the hash that keys the layer")
    changed_files: list[str] | None = Field(description="files changed since the last build; null without one")


class CcacheRecord(Record):
    hits: int | None = Field(description="direct and preprocessed hits")
    direct_hits: int | None = Field(description="direct hits")
    preprocessed_hits: int | None = Field(description="preprocessed hits")
    misses: int | None = Field(description="misses")
    uncacheable: int | None = Field(description="calls ccache could not cache")
    errors: int | None = Field(description="errors")
    hit_rate: float | None = Field(description="hits / (hits + misses)")


class BackendCounters(Record):
    """One compiler-cache backend's counters over the compile (builders/cache/sccache_stats.py)."""

    hits: int | None = Field(description="compilations answered from the cache")
    misses: int | None = Field(description="compilations the cache did not have")
    errors: int | None = Field(description="cache reads or writes that failed")
    hit_rate: float | None = Field(description="hits / (hits + misses); null without either")
    requests: int | None = absent("compile requests the launcher saw (sccache)")
    writes: int | None = absent("objects written to the backend (sccache)")
    not_cacheable: int | None = absent("calls the launcher could not cache (sccache)")


class CompilerCacheRecord(Record):
    """The compiler launcher of the compile step and what each backend it used gave."""

    launcher: str = Field(description="sccache or ccache")
    backend: str = Field(description="the backend configured (local, redis, s3, webdav, gha)")
    endpoint: str = Field(description="where the backend lives, user-info masked; empty for the local folder")
    backends: dict[str, BackendCounters] = Field(description="counters per backend used (a fallback adds local)")
    fallback: list[str] = Field(description="each failure that sent the compile to the local folder")


class LayerCacheRecord(Record):
    """The registry layer cache (--cache-registry): what was imported and exported, and how."""

    registry: str | None = Field(description="the registry repository the user named")
    repository: str | None = Field(description="the repository the cache images live in")
    mode: str = Field(description="how the engine reads and writes it (registry, inline, off)")
    imported: list[str] = Field(description="cache references the build took layers from")
    exported: list[str] = Field(description="cache references pushed after the build")
    export: bool = Field(description="whether this build was asked to export")
    retried_without_registry: bool = Field(description="the build ran again without the registry after it failed")


class ReuseRecord(Record):
    """What a build reused: for a source tree each layer's verdict, the parts' hashes, the files changed and
    ccache's counters; for any build, the caches that outlive the runner (builders/cache/)."""

    environment: EnvironmentReuse | None = absent("the requirements layer (a source-tree build)")
    extension: ExtensionReuse | None = absent("the compiled extension (a source-tree build)")
    package: PackageReuse | None = absent("the Python package (a source-tree build)")
    ccache: CcacheRecord | str | None = absent("ccache's counters, or why there are none (a source-tree build)")
    previous_build: str | None = Field(default=None, description="when the build compared with started")
    compiler_cache: CompilerCacheRecord | None = absent("the compiler launcher's counters per backend")
    layer_cache: LayerCacheRecord | None = absent("the registry layer cache, when one is configured")
    cache_warnings: list[str] | None = absent("every warning a cache gave (what failed, what it cost)")
