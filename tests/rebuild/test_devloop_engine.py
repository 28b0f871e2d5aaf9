"""Engine-backed: the dev loop's layers (containers/_devloop.j2) on the small C++/Python project, built three
times. Cold: both C++ files compile. A Python-only edit: the environment, the extension, the venv and the
runtime's copy of it come from the engine's cache and nothing compiles. A one-line edit of one .cpp file: the
extension is rebuilt, and ccache compiles that file alone (one miss) and takes the other from its cache (one hit).

Each run edits with a value of its own and mounts a ccache of its own, so no earlier run's layers or cache
entries can answer for this one's. It runs on Docker (BuildKit's cache mount) and on Podman (buildah's), each
as .ci/engines sets it up: the two print their stages differently, and buildah interleaves them. Run it alone
with `pytest -m engine tests/rebuild/test_devloop_engine.py` (`-k podman` for one engine).
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

import pytest
from devtree_project import PROJECT, render, stage_context

from builders.bootstrap import ensure_base
from builders.container import BuildRequest, Engine, RunSpec, choose_builder, connect
from builders.errors import EngineError
from builders.project import Project
from builders.rebuild.ccache_stats import CcacheStats, stats_from_log
from builders.rebuild.reuse import verdict

pytestmark = pytest.mark.engine


@pytest.fixture(params=["docker", "podman"])
def loop_engine(request: pytest.FixtureRequest) -> Engine:
    try:
        return connect(request.param)
    except EngineError as exc:
        pytest.fail(f"{request.param} does not answer: {exc.message} (run .ci/engines as root)")


def _build(engine: Engine, project: Project, tree: Path, work: Path, name: str, cache_id: str) -> tuple[str, str]:
    """Stage the tree into a fresh context, build it to the runtime stage; the image id and the build's log."""
    builder = choose_builder(engine, "auto")
    if not builder.supports_cache_mounts:
        pytest.skip(f"{builder.name} has no cache mounts: ccache cannot outlive a stage there")
    base = ensure_base(project.distro("debian-12"), engine)
    context = work / f"context-{name}"
    text = render(project.containers_dir, base_ref=base.ref, cache_mount=True, cache_id=cache_id)
    stage_context(tree, context, text)
    log_path = work / f"{name}.log"
    result = builder.build(
        BuildRequest(context_dir=context, containerfile=context / "Containerfile", target="runtime", log_path=log_path),
        lambda _line: None,
    )
    log = log_path.read_text(errors="replace")
    assert result.ok and result.image_id, f"{name} build failed:\n{log[-3000:]}"
    return result.image_id, log


def _answer(engine: Engine, image: str) -> str:
    rc, out = engine.run_once(
        RunSpec(image=image, command=["-c", "import demo; print(demo.answer())"], entrypoint=["/opt/venv/bin/python"]),
        timeout=120,
    )
    assert rc == 0, out
    return out.strip().splitlines()[-1]


def _stats(log: str) -> CcacheStats:
    stats = stats_from_log(log)
    assert stats is not None, "the extension stage printed no ccache counters"
    return stats


def test_a_python_edit_compiles_nothing_and_a_cpp_edit_compiles_one_file(
    project: Project, loop_engine: Engine, tmp_path: Path
) -> None:
    engine = loop_engine
    token = secrets.token_hex(4)
    factor = 3 + int(token, 16) % 1000  # this run's own edit: no earlier run built this .cpp
    tree = tmp_path / "tree"
    shutil.copytree(PROJECT, tree)
    # A unique greeting from the start: the cold build's package layer is this run's own too.
    init = tree / "demo" / "__init__.py"
    init.write_text(init.read_text().replace('GREETING = "hello"', f'GREETING = "cold-{token}"'))
    cache_id = f"forge-devtree-test-{token}"
    images: list[str] = []
    try:
        # Cold, with a ccache of this run's own: both translation units miss.
        image, log = _build(engine, project, tree, tmp_path, "cold", cache_id)
        images.append(image)
        cold = _stats(log)
        assert (cold.misses, cold.hits) == (2, 0), cold
        assert _answer(engine, image) == f"cold-{token} 42"

        # A Python-only edit: env and extension reused, nothing compiled, the new Python in the image.
        init.write_text(init.read_text().replace(f"cold-{token}", f"python-{token}"))
        cold_layers = engine.rootfs_layers(images[0])
        image, log = _build(engine, project, tree, tmp_path, "python-edit", cache_id)
        images.append(image)
        assert verdict(log, "env") == "reused", log[-3000:]
        assert verdict(log, "extension") == "reused", log[-3000:]
        # The warm loop's cut: the venv and the runtime's copy of it are reused, the package layers alone redone,
        # so the image keeps the cold build's layers up to the venv's copy, layer for layer.
        assert verdict(log, "venv") == "reused" and verdict(log, "runtime-venv") == "reused", log[-3000:]
        assert verdict(log, "runtime") == "rebuilt"
        assert engine.rootfs_layers(image)[:-4] == cold_layers[:-4]
        assert stats_from_log(log) is None  # the compile did not run: no counters printed
        assert _answer(engine, image) == f"python-{token} 42"

        # One line of one .cpp file: the extension rebuilt; ccache compiles ops.cpp, takes module.cpp from cache.
        ops = tree / "csrc" / "ops.cpp"
        ops.write_text(ops.read_text().replace("value * 2", f"value * {factor}"))
        image, log = _build(engine, project, tree, tmp_path, "cpp-edit", cache_id)
        images.append(image)
        assert verdict(log, "env") == "reused", log[-3000:]
        assert verdict(log, "extension") == "rebuilt"
        edit = _stats(log)
        assert (edit.misses, edit.hits) == (1, 1), edit
        assert _answer(engine, image) == f"python-{token} {21 * factor}"
    finally:
        for image in reversed(images):
            engine.remove_image(image)
