"""`forge smoke` stopped from outside during its traffic (SIGTERM: a CI job cancelled, `timeout` expiring): the
report says interrupted in the traffic phase, every server is gone, and it exits 143.

The replicas are a stand-in `vllm` (fake_vllm.py) and the router a container of Forge's router image, so the
run's own machinery (start, traffic, teardown, the engine's containers) is what is tested, in seconds.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from fake_vllm import install
from smoke_helpers import free_base_port, interrupt_forge_smoke, processes_mentioning, router_image

from builders.container import Engine
from builders.smoke.plan import RUN_LABEL
from builders.smoke.report import SmokeReport

# The replicas are stand-ins, not vLLM servers: only the router container needs the engine.
pytestmark = pytest.mark.engine


@pytest.mark.timeout(600)
def test_sigterm_during_traffic_leaves_an_interrupted_report_and_no_server(engine: Engine, tmp_path: Path) -> None:
    vllm = install(tmp_path)
    reports = tmp_path / "reports"
    code, run_id, output = interrupt_forge_smoke(
        [
            "--local-vllm",
            str(vllm),
            "--router-image",
            router_image(),
            "--profile",
            "ci",
            "--base-port",
            str(free_base_port(3)),
            "--report",
            str(reports),
        ],
        signal.SIGTERM,
        after_s=1,
        once=r"traffic run 'main'",
    )
    assert code == 143, output
    assert "forge: interrupted by SIGTERM (exit 143)" in output
    report = json.loads((reports / f"smoke-ci-{run_id}.json").read_text(encoding="utf-8"))
    assert SmokeReport.read(reports / f"smoke-ci-{run_id}.json").as_json() == report
    assert report["result"] == "interrupted" and report["signal"] == "SIGTERM", report
    assert report["ended_in"] == "traffic"
    assert {"probe", "start", "traffic", "teardown"} <= report["phases"].keys()
    assert report["teardown"]["clean"] is True and report["teardown"]["leftovers"] == []
    assert "gates" not in report  # no verdict on traffic that was cut short
    assert engine.containers_with_label(RUN_LABEL, run_id) == []
    assert processes_mentioning(f"forge-smoke-{run_id}") == []
