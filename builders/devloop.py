"""The phases a source-tree build (`--source vllm=DIR`) adds to builders/build.py's: the tree split into its
parts (builders/rebuild/devtree.py), the parts staged into the context, and after the build, what each layer
reused, read from the build's own log, with the files that changed since the last build in the same reports
folder and ccache's counters from the compile."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builders.engines.vllm.devtree import VLLM_LAYOUT
from builders.engines.vllm.plan import TREE_DIR, TREE_PARTS
from builders.rebuild.ccache_stats import stats_from_log
from builders.rebuild.devtree import PARTS, TreeSplit, changed_files, split_tree, stage_parts
from builders.rebuild.reuse import verdict

if TYPE_CHECKING:
    from builders.context import Context

# Per-file digests of the last source-tree build in a reports folder. Not one of build.REPORT_FILES: a new build
# must read it before it writes its own, to name the files that changed.
MANIFEST = "tree-manifest.json"


def split_source(path: Path) -> TreeSplit:
    return split_tree(path, VLLM_LAYOUT)


def stage_tree(split: TreeSplit, context_dir: Path) -> None:
    stage_parts(split, {part: context_dir / TREE_DIR / TREE_PARTS[part] for part in PARTS})


def toolchain_identity(base_image_id: str, build_packages: tuple[str, ...]) -> str:
    """What the compile's toolchain is made of, as far as the build knows before it runs: the base image and the
    packages the toolchain stage installs on it."""
    return f"base {base_image_id}; packages {' '.join(build_packages)}"


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The previous build's manifest, or None where there is none or it cannot be read (a build from an older
    Forge, a file cut short): the report then names no changed files, never wrong ones."""
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else None


def reuse_section(
    split: TreeSplit,
    *,
    log: str,
    compile_env: Mapping[str, str],
    toolchain: str,
    cache_mounted: bool,
    previous: dict[str, Any] | None,
) -> dict[str, Any]:
    """The report's `reuse` section: per layer whether the engine reused it, the hash that keys it and the files
    changed since the previous build; ccache's counters when the compile ran with its cache mounted."""
    old_files: dict[str, dict[str, str]] = previous["files"] if previous else {}

    def changed(part: str) -> list[str] | None:
        return changed_files(old_files.get(part, {}), split.files(part)) if previous else None  # type: ignore[arg-type]

    extension = verdict(log, "extension")
    ccache: dict[str, Any] | str
    if not cache_mounted:
        ccache = "not mounted (the builder has no cache mounts: every compile starts from an empty cache)"
    elif extension == "reused":
        ccache = "not run (the extension stage came from the engine's cache: nothing was compiled)"
    else:
        stats = stats_from_log(log)
        ccache = stats.as_report() if stats else "no counters in the log (the compile did not finish)"
    return {
        "environment": {
            "verdict": verdict(log, "env"),
            "requirements_hash": split.requirements_hash,
            "changed_files": changed("requirements"),
        },
        "extension": {
            "verdict": extension,
            "compiler_input_hash": split.compiler_input_hash(compile_env, toolchain),
            "changed_files": changed("compiler_inputs"),
        },
        "package": {
            "verdict": verdict(log, "venv"),
            "package_hash": split.package_hash,
            "changed_files": changed("package"),
        },
        "ccache": ccache,
        "previous_build": previous.get("started") if previous else None,
    }


def record_reuse(ctx: Context) -> None:
    """The reuse phase: the report's section, then this build's manifest for the next one to compare with."""
    split = ctx.tree
    if split is None:
        return
    plan = ctx.plan
    toolchain = toolchain_identity(str(ctx.report.base.get("image_id", "")), plan.build_packages)
    log = ctx.log_path.read_text(errors="replace") if ctx.log_path.exists() else ""
    ctx.report.reuse = section = reuse_section(
        split,
        log=log,
        compile_env=plan.compile_env,
        toolchain=toolchain,
        cache_mounted=plan.buildkit and ctx.builder.supports_cache_mounts,
        previous=read_manifest(ctx.reports_dir),
    )
    for layer in ("environment", "extension", "package"):
        ctx.log.info(f"{layer}: {section[layer]['verdict']}")
    manifest = {"started": ctx.report.started, "files": split.manifest()}
    tmp = ctx.reports_dir / f".{MANIFEST}.new"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    tmp.replace(ctx.reports_dir / MANIFEST)
