"""report.json as a model: what build() writes reads back unchanged through BuildReport, a section a build never
reached is still `{}` or null, and a report edited by hand is refused naming the field, by `forge push` too.

The build here is the real executor over one stand-in phase that fills sections the way the real phases do
(tests/pipeline/test_engine_build.py reads back a real router build's report the same way, on an engine)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from builders import build as build_module
from builders.build import BuildOptions, build
from builders.container.image_builders import BuildKitCliBuilder, LegacySdkBuilder, describe
from builders.context import Context
from builders.diagnose.diagnosis import diagnose_text
from builders.engines.checks import CheckDataEntry, CheckResult
from builders.gates.findings import PreflightReport, passed, warning
from builders.project import Project
from builders.publish import PushRefused, load_report
from builders.records import ReportInvalid
from builders.report import BuilderRecord, BuildReport, CheckRecord

LOG = "error: the compiler is older than this source needs\ngcc-12: fatal error: -march=x86-64-v4 unknown\n"


def _fill(ctx: Context) -> None:
    ctx.report.preflight = PreflightReport.from_findings(
        [
            passed("gcc", "GCC 12.2", ">= 12.3", "cmake/cpu_extension.cmake:136"),
            warning("disk-scratch", "40 GB", ">= 60 GB", "host /tmp", "free space or pass --scratch-dir"),
        ],
        distro="debian-12",
        target="cpu",
        recipe="vllm-cpu",
        mode="declared",
        seconds=0.25,
    )
    archs: CheckDataEntry = {"cuda_archs": {"vllm/_C.abi3.so": {"sass": ["sm_80", "sm_90"], "ptx": ["compute_90"]}}}
    checks = [
        CheckResult(name="import-vllm", ok=True, detail="0.33.0 2.9.0+cpu", seconds=3.21),
        CheckResult(name="cuda-archs", ok=True, detail="covered", seconds=1.0, data=archs),
        CheckResult(name="serve-gpu", ok=True, skipped=True, detail="skipped: no GPU", seconds=0.0),
    ]
    ctx.report.tests = [CheckRecord.model_validate(c.as_report()) for c in checks]
    ctx.report.diagnosis = diagnose_text(LOG)
    ctx.report.versions.update({"vllm": "0.33.0", "torch": "2.9.0+cpu"})


def _built(project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, phase: Callable[[Context], None]) -> Path:
    monkeypatch.setattr(build_module, "PHASES", (("fill", phase, lambda o: True),))
    reports = tmp_path / "report"
    build(project, project.distro("debian-12"), project.recipe_for("cpu"), BuildOptions(reports_dir=reports), print)
    return reports / "report.json"


def test_the_report_a_build_writes_reads_back_through_its_model(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _built(project, tmp_path, monkeypatch, _fill)
    written = json.loads(path.read_text())
    report = BuildReport.read(path)
    assert report.as_json() == written
    assert report.result == "succeeded" and report.tests[1].data is not None
    assert report.tests[1].data.cuda_archs is not None and report.tests[1].data.ops is None
    assert report.tests[1].data.cuda_archs["vllm/_C.abi3.so"].sass == ["sm_80", "sm_90"]
    assert [t.status_text() for t in report.tests] == ["ok 0.33.0 2.9.0+cpu", "ok covered", "skipped: no GPU"]
    # What the build never reached keeps the shape it always had.
    assert (written["engine"], written["base"], written["image"], written["source"]) == ({}, {}, {}, {})
    assert (written["lock"], written["sbom"], written["reuse"], written["push"]) == (None, None, None, None)
    assert written["platform"]["name"] == "linux/amd64" and "stand_in" not in written["platform"]
    assert written["preflight"]["verdict"] == "clear" and written["preflight"]["findings"][0]["gate"] == "disk-scratch"
    assert "data" not in written["tests"][0] and written["tests"][2]["status"] == "skipped"


def test_an_edited_report_is_refused_naming_its_fields_and_push_trusts_none_of_it(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _built(project, tmp_path, monkeypatch, _fill)
    data = json.loads(path.read_text())
    data["tests"][0]["status"] = "fine"
    data["image"] = {"id": "sha256:" + "a" * 64, "tags": ["forge/x:1"], "size": "big"}
    data["mood"] = "optimistic"
    path.write_text(json.dumps(data))
    with pytest.raises(ReportInvalid) as caught:
        BuildReport.read(path)
    message = caught.value.message
    assert f"{path}: tests.0.status: Input should be 'passed', 'failed' or 'skipped'" in message
    assert f"{path}: image.size: Input should be a valid integer" in message
    assert f"{path}: mood: Extra inputs are not permitted" in message
    with pytest.raises(PushRefused) as refused:
        load_report(path.parent)
    assert "not a build report Forge wrote" in refused.value.message and "tests.0.status" in refused.value.message
    path.write_text("{cut short")
    with pytest.raises(ReportInvalid, match=r"report.json: \(the whole file\): Invalid JSON"):
        BuildReport.read(path)


def test_a_report_from_before_test_statuses_reads_its_status_from_ok(tmp_path: Path) -> None:
    report = BuildReport(distro="debian-12", target="router", recipe="router")
    folder = tmp_path / "r"
    report.write(folder)
    data = json.loads((folder / "report.json").read_text())
    data["tests"] = [{"name": "import", "ok": False, "detail": "ImportError", "seconds": 1.0}]
    (folder / "report.json").write_text(json.dumps(data))
    (entry,) = BuildReport.read(folder / "report.json").tests
    assert entry.status == "failed" and entry.status_text() == "FAILED ImportError"


def test_the_report_takes_what_each_image_builder_says_of_itself() -> None:
    # The engine phase records describe(builder) as the report's `builder`: a key the description gains and the
    # record lacks fails every build at its first phase, which no engine-free test would otherwise run.
    for builder in (BuildKitCliBuilder("/usr/bin/docker"), LegacySdkBuilder(engine=object())):  # type: ignore[arg-type]
        record = BuilderRecord.model_validate(describe(builder))
        assert record.as_json() == describe(builder)
    assert BuilderRecord.model_validate(describe(BuildKitCliBuilder("/usr/bin/docker"))).layer_cache == "inline"
