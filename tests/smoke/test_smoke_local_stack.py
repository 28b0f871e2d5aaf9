"""The whole smoke run against real vLLM servers on this host (`--local-vllm`), teardown included."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from smoke_helpers import ROOT, free_base_port, interrupt_forge_smoke, local_vllm, processes_mentioning
from smoke_runs import local_run

from builders.cli import main
from builders.errors import SmokeFailed
from builders.smoke.profile import load_profile, profile_from_mapping
from builders.smoke.report import SmokeReport
from builders.smoke.stack import SmokeOptions

pytestmark = [pytest.mark.server]


# No rerun: each pool's replica runs on its own core (profiles/ci.yaml pools.*.cpus), so the slow readers'
# replica cannot take CPU from the interactive pool's; a failure here is a finding, not scheduling luck.
# The kill check is left to the container stacks (Docker's vLLM and ci-llama's llama.cpp smoke tests), where a
# replica is killed from outside as an operator would; here it would add a third traffic run to CI for a path
# those two already prove.
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ci_profile_passes_with_the_slow_client_check_and_leaves_nothing(tmp_path: Path) -> None:
    binary = local_vllm()
    profile, path = load_profile("ci", root=ROOT)
    options = SmokeOptions(
        profile=profile,
        profile_path=path,
        report_dir=tmp_path,
        base_port=free_base_port(profile.replica_count),
        check_slow_clients=True,
    )
    run = local_run(options, binary)
    report = json.loads(run.execute().to_json())

    assert report["gates"] == {"passed": True, "failures": []}
    assert report["checks"]["slow_clients"]["passed"]
    assert "kill_replica" not in report["checks"]
    assert report["teardown"]["clean"] is True and report["teardown"]["leftovers"] == []
    written = json.loads(Path(report["report_file"]).read_text(encoding="utf-8"))
    assert SmokeReport.read(Path(report["report_file"])).as_json() == written
    assert set(written["traffic"]) == {"main", "baseline_fast_readers"}
    assert set(written["traffic"]["main"]["classes"]) == {c.value for c in profile.classes}
    assert processes_mentioning(f"forge-smoke-{run.run_id}") == []
    # Each replica's start, read from its real vLLM log: the model load and the engine's init are found, and
    # the parts the log's stamps place in sequence fit inside the measured time to health.
    for label, replica in written["startup"]["replicas"].items():
        parts = replica["parts"]
        assert parts["healthy_after_s"] == replica["healthy_after_s"], label
        assert parts["model_load_s"] is not None and parts["engine_init_s"] is not None, (label, parts)
        assert parts["before_first_line_s"] is not None, (label, parts)
        sequence = ("before_first_line_s", "api_server_s", "engine_core_s", "model_load_s", "api_ready_s")
        assert sum(parts[k] or 0 for k in sequence) <= replica["healthy_after_s"] + 1, (label, parts)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_slow_client_check_fails_when_slow_readers_hold_the_router_s_shared_connections(tmp_path: Path) -> None:
    """Isolation broken on purpose, in the router: 2 upstream connections for all pools together, and a
    router that holds only 4 KiB per stream. The slow readers push back (a 4 KiB receive window) and ask for
    top-20 logprobs, so each 32-token answer (~60 KB) is far larger than every buffer between the replica and
    the reader: a slow reader keeps its upstream connection for as long as it reads (~10 s at 5 KB/s), and two
    of them hold both, so interactive requests wait for a connection. With fast readers the same requests
    hold a connection only while the replica generates (a fraction of a second). Only interactive and
    slow_stream traffic runs, so nothing else competes for the two connections in either run."""
    binary = local_vllm()
    ci, path = load_profile("ci", root=ROOT)
    data = ci.model_dump(mode="json", exclude={"name"})
    data["router"].update(
        upstream_connection_limit=2, stream_buffer_bytes=4096, client_sndbuf_bytes=4096, connect_timeout_s=60
    )
    for idle in ("rag", "agent", "long_prefill", "batch"):
        data["traffic"][idle]["count"] = 0
    # Open-loop interactive arrivals over ~20 s: a closed loop would send its 20 requests back to back in the
    # first second and win the connections before the slow readers have them.
    data["traffic"]["interactive"]["rate_per_s"] = 1.0
    data["traffic"]["slow_stream"].update(
        count=4,
        concurrency=2,
        max_tokens=32,
        top_logprobs=20,
        read_bytes=256,
        read_delay_s=0.05,
        receive_buffer_bytes=4096,
    )
    profile = profile_from_mapping(data, source="test: ci with 2 shared upstream connections", name="ci-starved")
    options = SmokeOptions(
        profile=profile,
        profile_path=path,
        report_dir=tmp_path,
        base_port=free_base_port(profile.replica_count),
        check_slow_clients=True,
    )
    run = local_run(options, binary)
    with pytest.raises(SmokeFailed):
        run.execute()
    check = json.loads(run.report.to_json())["checks"]["slow_clients"]
    assert not check["passed"]
    row = check["classes"]["interactive"]["ttft_p99_ms"]
    # Waiting for a connection a slow reader holds (1.8 and 2.4 s in two runs here), against ~20-35 ms.
    assert row["with_slow"] > row["bound"], check
    assert any(line.startswith("interactive ttft_p99_ms") for line in check["failures"]), check["failures"]
    assert json.loads(run.report.to_json())["teardown"]["clean"] is True


@pytest.mark.timeout(300)
def test_a_replica_that_dies_at_startup_fails_the_run_with_its_log(tmp_path: Path) -> None:
    binary = local_vllm()
    ci, _ = load_profile("ci", root=ROOT)
    # Accepted by Forge's argument check (the flag exists and takes an integer), refused by vLLM's scheduler
    # config, which wants at least one sequence. vLLM refuses it while building its config (~35 s here); a KV
    # cache too small, the earlier choice, was refused only after the model load and compile (~130 s of CI for
    # the same path).
    data = ci.model_dump(mode="json", exclude={"name"})
    data["pools"]["interactive"]["extra_args"] = ["--max-num-seqs", "0"]
    data["pools"]["interactive"]["max_num_seqs"] = None
    profile = profile_from_mapping(data, source="test", name="no-sequences")
    options = SmokeOptions(
        profile=profile, profile_path=tmp_path / "no-sequences.yaml", report_dir=tmp_path, base_port=free_base_port(3)
    )
    run = local_run(options, binary)
    with pytest.raises(SmokeFailed) as caught:
        run.execute()
    assert "exited before it answered" in caught.value.message
    assert "last log lines" in caught.value.message
    assert json.loads(run.report.to_json())["teardown"]["clean"] is True
    logs = Path(json.loads(run.report.to_json())["logs_dir"])
    assert any(p.read_text(encoding="utf-8") for p in logs.glob("*.log"))
    assert processes_mentioning(f"forge-smoke-{run.run_id}") == []


def test_a_retired_flag_stops_the_run_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = local_vllm()
    ci, _ = load_profile("ci", root=ROOT)
    data = ci.model_dump(mode="json", exclude={"name"})
    data["pools"]["bulk"]["extra_args"] = ["--max-num-partial-prefills", "2"]
    profile_file = tmp_path / "retired.yaml"
    profile_file.write_text(json.dumps(data), encoding="utf-8")
    code = main(["smoke", "--local-vllm", str(binary), "--profile", str(profile_file), "--validate-only"])
    err = capsys.readouterr().err
    assert code == 2
    assert "pool 'bulk', pools.bulk.extra_args[0]: --max-num-partial-prefills" in err
    assert "--long-prefill-token-threshold" in err


@pytest.mark.slow
@pytest.mark.timeout(400)
# SIGTERM only: Ctrl-C takes the same path (builders/interrupt.py) and is sent to the image stack
# (test_smoke_engine_stack.py); each real vLLM start here costs CI its start-up time.
@pytest.mark.parametrize("sig", [signal.SIGTERM], ids=["sigterm"])
def test_an_interrupted_run_stops_every_server(sig: signal.Signals, tmp_path: Path) -> None:
    binary = local_vllm()
    base = free_base_port(3)
    code, run_id, output = interrupt_forge_smoke(
        ["--local-vllm", str(binary), "--profile", "ci", "--base-port", str(base), "--report", str(tmp_path)],
        sig,
        after_s=8,
    )
    assert code == 128 + sig, output  # 130 for Ctrl-C, 143 for SIGTERM (docs/commands.md: exit codes)
    assert "stopping 2 server(s)" in output
    assert processes_mentioning(f"forge-smoke-{run_id}") == []
    [report_file] = tmp_path.glob(f"smoke-ci-{run_id}.json")
    report = json.loads(report_file.read_text(encoding="utf-8"))
    assert report["teardown"]["clean"] is True
    assert report["result"] == "interrupted" and report["signal"] == sig.name
