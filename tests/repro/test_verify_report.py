"""verify-repro's repro.json as models: the verdict of a real comparison (layer tars written here) reads back
unchanged, a run stopped in one of its steps writes what stopped it and where before its teardown, and an edited
file is refused naming the field. tests/repro/test_engine_repro.py reads back a real verify-repro's the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pytest
from test_compare import _image, _layer_tar

from builders.container import Engine
from builders.project import Project
from builders.records import ReportInvalid
from builders.repro.compare import compare_images
from builders.runs import Phase, run_phases
from builders.verify.report import ReproStopped, ReproVerdict, read_repro
from builders.verify.repro import PHASES, VerifyOptions, VerifyRun, verdict_of

BASE = ("sha256:base",)


def test_a_comparison_s_verdict_reads_back_through_its_model(tmp_path: Path) -> None:
    first = _image("a", _layer_tar({"opt/a.py": b"x = 1\n", "opt/b": b"same"}, mtime=1))
    second = _image("bb", _layer_tar({"opt/a.py": b"x = 2\n", "opt/b": b"same"}, mtime=1))
    comparison = compare_images(first, second, BASE)
    path = verdict_of("debian-12", "router", "1735689600", (first, second), comparison, None).save(
        tmp_path / "repro.json"
    )
    written = json.loads(path.read_text())
    verdict = read_repro(path)
    assert isinstance(verdict, ReproVerdict) and verdict.as_json() == written
    assert not verdict.reproducible and verdict.images.second == "sha256:bb"
    (difference,) = verdict.layers[0].differences
    assert (difference.path, difference.what) == ("/opt/a.py", "content")
    # The keys verify-repro always wrote, nulls included.
    assert set(written) == {
        "distro",
        "target",
        "source_date_epoch",
        "images",
        "diffoscope",
        "first",
        "second",
        "base_layers",
        "strict_mtimes",
        "structure",
        "config_differences",
        "layers",
        "reproducible",
        "bit_identical",
    }
    assert written["diffoscope"] is None

    written["layers"][0]["identical"] = "mostly"
    path.write_text(json.dumps(written))
    with pytest.raises(ReportInvalid) as caught:
        read_repro(path)
    assert f"{path}: layers.0.identical: Input should be a valid boolean" in caught.value.message


@pytest.mark.parametrize(
    ("error", "result", "signal"),
    [(KeyboardInterrupt(), "interrupted", "SIGINT"), (RuntimeError("the build failed"), "failed", None)],
    ids=["ctrl-c", "failed"],
)
def test_a_run_stopped_in_a_step_says_what_stopped_it_and_where(
    project: Project, tmp_path: Path, error: BaseException, result: str, signal: str | None
) -> None:
    lines: list[str] = []

    def second_build(ctx: VerifyRun) -> None:
        lines.append("second build")
        raise error

    ctx = VerifyRun(
        project=project,
        distro=project.distro("debian-12"),
        recipe=project.recipe_for("router"),
        # keep_images: the teardown leaves the engine alone, so none is needed here.
        options=VerifyOptions(keep_images=True),
        sink=lines.append,
        engine=cast(Engine, None),
        out=tmp_path,
    )
    # verify-repro's own table, its builds stood in for: the names the report gives the steps are its.
    first, second, _compare = PHASES
    with pytest.raises(type(error)):
        run_phases(ctx, [Phase(first.name, lambda c: lines.append("first build")), Phase(second.name, second_build)])
    assert lines == ["first build", "second build"]
    stopped = read_repro(tmp_path / "repro.json")
    assert isinstance(stopped, ReproStopped)
    assert (stopped.result, stopped.signal, stopped.ended_in) == (result, signal, "second build")
    written = json.loads((tmp_path / "repro.json").read_text())
    assert list(written) == ["distro", "target", "result", *(["signal"] if signal else []), "ended_in"]
    assert (
        tmp_path / "repro.txt"
    ).read_text() == f"verify-repro debian-12 router: {result.upper()} during second build\n"
