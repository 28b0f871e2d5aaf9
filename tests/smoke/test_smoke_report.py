"""The smoke report as a model: a whole run on this host (the stand-in `vllm` of fake_vllm.py and the real router,
both host processes, seconds in all) writes it, its model reads the file back unchanged, and a file edited by
hand is refused naming the field that is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_vllm import install
from rich.console import Console
from smoke_helpers import ROOT, free_base_port

from builders.records import ReportInvalid
from builders.smoke.profile import load_profile, profile_from_mapping
from builders.smoke.report import SmokeReport
from builders.smoke.runtimes import LocalReplicas, LocalRouter, ReplicaRuntime, RouterRuntime
from builders.smoke.stack import SmokeOptions, SmokeRun

# Every class once (agent: one two-turn conversation), answers of 4 tokens: the stand-in sends one every 50 ms.
CLASSES = ("interactive", "rag", "agent", "long_prefill", "batch", "slow_stream")


def _report_of_a_run(tmp_path: Path) -> Path:
    ci, path = load_profile("ci", root=ROOT)
    data = ci.model_dump(mode="json", exclude={"name"})
    for name in CLASSES:
        data["traffic"][name].update(count=1, max_tokens=4)
    data["traffic"]["slow_stream"]["concurrency"] = 1
    data["traffic"]["max_total_requests"] = 12
    profile = profile_from_mapping(data, source="test: ci, one request per class", name="ci-one-each")
    binary = install(tmp_path)

    def replicas(kind: str, pool_image: str | None, model_dir: Path, logs_dir: Path) -> ReplicaRuntime:
        return LocalReplicas(binary, model_dir=model_dir, log_dir=logs_dir)

    def router(logs_dir: Path) -> RouterRuntime:
        return LocalRouter(log_dir=logs_dir)

    run = SmokeRun(
        options=SmokeOptions(
            profile=profile,
            profile_path=path,
            report_dir=tmp_path / "reports",
            base_port=free_base_port(profile.replica_count),
            check_slow_clients=True,
        ),
        replicas_runtime_factory=replicas,
        router_runtime_factory=router,
        console=Console(stderr=True, width=160),
    )
    report = run.execute()
    assert report.result == "passed" and report.report_file is not None
    return Path(report.report_file)


@pytest.mark.timeout(300)
def test_a_run_writes_a_report_its_model_reads_back_and_an_edited_one_is_refused_by_field(tmp_path: Path) -> None:
    path = _report_of_a_run(tmp_path)
    written = json.loads(path.read_text(encoding="utf-8"))
    report = SmokeReport.read(path)
    assert report.as_json() == written
    # Every section of a passed run with the slow-client check is there, and nothing the model does not name.
    assert list(written) == [
        "run_id",
        "profile",
        "profile_file",
        "started_at",
        "checks_requested",
        "dtype",
        "replicas_from",
        "router_from",
        "servers",
        "phases",
        "startup",
        "traffic",
        "checks",
        "gates",
        "result",
        "teardown",
        "duration_s",
        "report_file",
    ]
    assert list(written["phases"]) == ["probe", "start", "traffic", "teardown"]
    assert set(written["traffic"]) == {"main", "baseline_fast_readers"}
    assert set(written["traffic"]["main"]["classes"]) == set(CLASSES)
    assert written["teardown"]["clean"] is True

    written["gates"]["passed"] = "yes, mostly"
    written["traffic"]["main"]["classes"]["rag"]["goodput_typo"] = 1.0
    path.write_text(json.dumps(written), encoding="utf-8")
    with pytest.raises(ReportInvalid) as caught:
        SmokeReport.read(path)
    message = caught.value.message
    assert f"{path}: gates.passed: Input should be a valid boolean" in message
    assert f"{path}: traffic.main.classes.rag.goodput_typo: Extra inputs are not permitted" in message
