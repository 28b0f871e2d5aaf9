"""vLLM's part of the dev loop (`--source vllm=DIR`, docs/rebuild.md): its tree split into its parts
(builders/rebuild/devtree.py, with vLLM's globs in devtree.py here), the parts staged where its templates COPY
them, and after the build, what each of its layers reused, read from the build's own log, with the files that
changed since the last build in the same reports folder and ccache's counters from the compile. The build's
reuse phase (builders/build.py) asks vLLM's engine for these, and keeps the manifest a next build compares with.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from builders.engines.vllm.devtree import VLLM_LAYOUT
from builders.engines.vllm.plan import TREE_DIR, TREE_PARTS
from builders.rebuild.ccache_stats import stats_from_log
from builders.rebuild.devtree import PARTS, Part, TreeManifest, TreeSplit, changed_files, split_tree, stage_parts
from builders.rebuild.records import CcacheRecord, EnvironmentReuse, ExtensionReuse, PackageReuse, ReuseRecord
from builders.rebuild.reuse import verdict


def split_source(path: Path) -> TreeSplit:
    return split_tree(path, VLLM_LAYOUT)


def stage_tree(split: TreeSplit, context_dir: Path) -> None:
    stage_parts(split, {part: context_dir / TREE_DIR / TREE_PARTS[part] for part in PARTS})


def toolchain_identity(base_image_id: str, build_packages: tuple[str, ...]) -> str:
    """What the compile's toolchain is made of, as far as the build knows before it runs: the base image and the
    packages the toolchain stage installs on it."""
    return f"base {base_image_id}; packages {' '.join(build_packages)}"


def reuse_section(
    split: TreeSplit,
    *,
    log: str,
    compile_env: Mapping[str, str],
    toolchain: str,
    cache_mounted: bool,
    previous: TreeManifest | None,
) -> ReuseRecord:
    """The report's `reuse` section: per layer whether the engine reused it, the hash that keys it and the files
    changed since the previous build; ccache's counters when the compile ran with its cache mounted."""
    old_files: dict[str, dict[str, str]] = previous["files"] if previous else {}

    def changed(part: Part) -> list[str] | None:
        return changed_files(old_files.get(part, {}), split.files(part)) if previous else None

    extension = verdict(log, "extension")
    ccache: CcacheRecord | str
    if not cache_mounted:
        ccache = "not mounted (the builder has no cache mounts: every compile starts from an empty cache)"
    elif extension == "reused":
        ccache = "not run (the extension stage came from the engine's cache: nothing was compiled)"
    else:
        stats = stats_from_log(log)
        ccache = (
            CcacheRecord.model_validate(stats.as_report())
            if stats
            else "no counters in the log (the compile did not finish)"
        )
    return ReuseRecord(
        environment=EnvironmentReuse(
            verdict=verdict(log, "env"),
            requirements_hash=split.requirements_hash,
            changed_files=changed("requirements"),
        ),
        extension=ExtensionReuse(
            verdict=extension,
            compiler_input_hash=split.compiler_input_hash(compile_env, toolchain),
            changed_files=changed("compiler_inputs"),
        ),
        package=PackageReuse(
            # The wheel and the package go over the venv's copy in the runtime stage (containers/_devloop.j2).
            verdict=verdict(log, "runtime"),
            package_hash=split.package_hash,
            changed_files=changed("package"),
        ),
        ccache=ccache,
        previous_build=previous["started"] if previous else None,
    )
