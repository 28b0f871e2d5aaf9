"""The small C++/Python project in tests/rebuild/project, split and rendered the way a vLLM tree is: the engine
test builds it, the engine-free tests check what each layer copies."""

from __future__ import annotations

import shutil
from pathlib import Path

from builders.rebuild.devtree import PARTS, TreeLayout, TreeSplit, split_tree, stage_parts
from builders.render import render_template

PROJECT = Path(__file__).parent / "project"
SCRIPTS = Path(__file__).resolve().parents[2] / "containers" / "scripts"
TEMPLATE = "devtree-test.Containerfile.j2"
TREE = "tree"
WORKDIR = "/src/demo"
FOLDERS = {"requirements": "requirements", "compiler_inputs": "compiler-inputs", "package": "package"}

LAYOUT = TreeLayout(
    requirements=("requirements/**",),
    compiler_inputs=("csrc/**", "CMakeLists.txt", "setup.py", "pyproject.toml"),
    package=("demo/**",),
)


def render(
    containers_dir: Path, *, base_ref: str, cache_mount: bool, cache_id: str, compiler_cache: object = None
) -> str:
    return render_template(
        containers_dir,
        TEMPLATE,
        base_ref=base_ref,
        tree=TREE,
        workdir=WORKDIR,
        cache_mount=cache_mount,
        cache_id=cache_id,
        compiler_cache=compiler_cache,
    )


def stage_context(tree: Path, context: Path, containerfile: str) -> TreeSplit:
    """Split the tree and stage its parts beside the Containerfile, as builders/engines/vllm/devloop.py does for vLLM."""
    split = split_tree(tree, LAYOUT)
    stage_parts(split, {part: context / TREE / FOLDERS[part] for part in PARTS})
    # What the compile step runs with a shared compiler cache, as builders/build.py stages containers/scripts/.
    (context / "scripts").mkdir(parents=True, exist_ok=True)
    shutil.copy2(SCRIPTS / "compiler_cache.py", context / "scripts" / "compiler_cache.py")
    (context / "Containerfile").write_text(containerfile)
    return split
