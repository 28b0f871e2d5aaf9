"""A shortened sweep against real vLLM on this host: two profiles, seconds each; the report's structure only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from builders.router.classes import ALL_CLASSES
from builders.smoke.runtimes import LocalReplicas, LocalRouter, ReplicaRuntime, RouterRuntime
from builders.sweep.definition import SweepSettings, load_sweep
from builders.sweep.report import ROW_KEYS
from builders.sweep.report_model import SweepReport
from builders.sweep.run import SweepOptions, run_sweep

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "smoke"))
from smoke_helpers import ROOT, free_base_port, local_vllm

pytestmark = [pytest.mark.server, pytest.mark.slow]

# The smoke model and context instead of the sweep's large ones, and 4 s of traffic: this proves the sweep
# runs end to end and writes its report, not which profile wins (timing is not asserted).
SHORT = {
    "model": {
        "max_model_len": 1024,
        "max_position_embeddings": 2048,
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "kv_cache_memory": "64M",
    },
    "router": {"long_prefill_tokens": 600},
    # Every class arrives at least a few times within the 4 s.
    "traffic": {
        "deadline_s": 4,
        "request_timeout_s": 10,
        **{c.value: {"rate_per_s": 2.0} for c in ALL_CLASSES},
        "batch": {"rate_per_s": 2.0, "max_tokens": 32},
    },
    "timeouts": {"traffic_s": 60},
}


@pytest.mark.timeout(600)
def test_a_short_sweep_writes_table_json_and_plots_for_each_profile(tmp_path: Path) -> None:
    binary = local_vllm()
    profiles = load_sweep(["shared", "work-conserving"], root=ROOT, changes=SHORT)
    # One start-up cache for every replica of the sweep, as `forge sweep` gives them.
    cache = tmp_path / "replica-cache"
    cache.mkdir()

    def replicas(kind: str, pool_image: str | None, model_dir: Path, logs_dir: Path) -> ReplicaRuntime:
        return LocalReplicas(binary, model_dir=model_dir, log_dir=logs_dir, cache_dir=cache)

    def router(logs_dir: Path) -> RouterRuntime:
        return LocalRouter(log_dir=logs_dir)

    report = run_sweep(
        # Calibration runs as in a full sweep; the tiny model is fast enough that it would raise the rates,
        # which only costs CI time here, so the factor is capped at 1, and the window may stretch to 8 s at
        # most to keep 4 arrivals per class.
        SweepOptions(
            profiles=profiles,
            report_dir=tmp_path,
            base_port=free_base_port(3),
            settings=SweepSettings(max_scale=1.0, min_arrivals=4, max_window_s=8.0),
        ),
        replicas=replicas,
        router=router,
        console=Console(stderr=True, width=160),
    )
    assert report.failed_profiles == {}
    # vLLM kept what its registry learnt of the model class where every later replica looks for it, instead of
    # in each replica's own home.
    assert list((cache / "modelinfos").glob("*.json")), sorted(str(p) for p in cache.rglob("*"))
    written = json.loads((tmp_path / "sweep.json").read_text(encoding="utf-8"))
    assert SweepReport.read(tmp_path / "sweep.json").as_json() == written
    assert list(written["profiles"]) == ["shared", "work-conserving"]
    assert written["cpu_budget"] == 2 and written["load"].endswith("2 CPUs per profile")
    calibration = written["calibration"]
    assert calibration["calibrated"] and calibration["capacity"]["replica"] == "shared/0"
    assert calibration["capacity"]["prefill_tokens_per_s"] > 0
    assert set(calibration["capacity"]["decode_tokens_per_s"]) == {"1", "16"}
    assert 0 < calibration["applied_factor"] <= 1.0
    # The model stays (the tiny one has room to spare) and every class keeps its minimum: what the runner
    # sent is what the seeded plan the sizing counted holds.
    assert written["model"] == {"hidden_size": 128, "num_hidden_layers": 2} and "resized" not in calibration
    arrivals = calibration["sizing"]["arrivals"]
    assert min(arrivals.values()) >= 4 and 4 <= calibration["window_s"] <= 9
    assert written["validity"]["valid"] and written["validity"]["reference"] == "shared"
    assert written["dtype"]["dtype"] in ("float32", "bfloat16") and written["dtype"]["source"]
    for profile in written["profiles"].values():
        assert set(profile["classes"]) == {c.value for c in ALL_CLASSES}
        for name, row in profile["classes"].items():
            assert set(row) == set(ROW_KEYS)
            if name == "agent":
                assert row["requests"] >= arrivals[name]
            else:
                assert row["requests"] == arrivals[name]
    assert set(written["goal"]) == {"interactive_ttft_p99_ratio", "long_prefill_good_ratio", "batch_good_ratio"}
    served = written["profiles"]["shared"]["classes"]["batch"]["served_by"]
    assert sum(served.values()) == written["profiles"]["shared"]["classes"]["batch"]["requests"]
    table = (tmp_path / "sweep.md").read_text(encoding="utf-8").split("\n\n")[0].splitlines()
    assert len(table) == 2 + 2 * len(ALL_CLASSES)
    for name in ("ttft-cdf.png", "goodput.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
