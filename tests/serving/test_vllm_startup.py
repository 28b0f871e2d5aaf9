"""Where a vLLM replica's start went, read from its log: printed durations where vLLM prints one, stamp
differences otherwise, and None, never 0, for a part the log does not show (issue 41)."""

from __future__ import annotations

from pathlib import Path

from builders.engines import serving_engine

LOGS = Path(__file__).parents[1] / "logs" / "startup"
LOG = (LOGS / "vllm-cpu-tiny-llama.log").read_text()
# A real replica's whole log as `forge smoke` read it: vLLM 0.32.0 on the host, the ci profile's tiny Llama with
# --load-format dummy and --enforce-eager, one core, while a CI run used the other (2026-12-03).
REAL = (LOGS / "vllm-0.32-cpu-dummy-eager.log").read_text()
VLLM = serving_engine("vllm")


def test_each_part_of_a_start_is_read_from_the_log() -> None:
    parts = VLLM.startup_parts(LOG, healthy_after_s=64.0)
    # 23:40:02 (first line) to 23:41:00 (the API server's last stamped line) is 58 s of the 64 measured.
    assert parts["before_first_line_s"] == 6.0
    assert parts["api_server_s"] == 14.0  # to the engine core's "Initializing a V1 LLM engine" at 23:40:16
    assert parts["engine_core_s"] == 1.0  # to "Starting to load model" at 23:40:17
    assert parts["model_load_s"] == 2.0  # to "Loading weights took" at 23:40:19
    assert parts["weights_s"] == 1.62
    assert parts["compile_s"] == 27.41
    assert parts["engine_init_s"] == 38.12
    assert parts["api_ready_s"] == 2.0  # init engine's line at 23:40:58 to the API server's at 23:41:00
    assert parts["healthy_after_s"] == 64.0


def test_an_eager_replica_has_no_compile_part_rather_than_a_free_one() -> None:
    eager = "\n".join(line for line in LOG.splitlines() if "torch.compile" not in line)
    parts = VLLM.startup_parts(eager, healthy_after_s=64.0)
    assert parts["compile_s"] is None
    assert parts["engine_init_s"] == 38.12


def test_a_log_cut_before_the_server_started_leaves_the_later_parts_unknown() -> None:
    cut = LOG.split("(EngineCore_DP0 pid=212) INFO 11-29 23:40:20")[0]
    parts = VLLM.startup_parts(cut, healthy_after_s=64.0)
    assert parts["model_load_s"] == 2.0
    assert parts["engine_init_s"] is None and parts["api_ready_s"] is None
    # Without the last marker the log's span is unknown, so nothing is attributed to before its first line.
    assert parts["before_first_line_s"] is None


def test_no_health_time_or_a_log_longer_than_it_gives_no_before_first_line_part() -> None:
    assert VLLM.startup_parts(LOG, healthy_after_s=None)["before_first_line_s"] is None
    assert VLLM.startup_parts(LOG, healthy_after_s=30.0)["before_first_line_s"] is None


def test_a_log_with_no_stamps_says_nothing() -> None:
    parts = VLLM.startup_parts(
        "Traceback (most recent call last):\nINFO 02-30 10:00:00 not a date\n", healthy_after_s=9
    )
    assert all(value is None for key, value in parts.items() if key != "healthy_after_s")


def test_an_engine_whose_log_carries_no_stamps_reports_no_parts() -> None:
    # llama-server prints no timestamps unless started with --log-timestamps: its parts are not guessed.
    assert serving_engine("llama-cpp").startup_parts(LOG, healthy_after_s=64.0) == {}


def test_the_shorter_wording_of_the_engine_init_line_is_read_too() -> None:
    short = LOG.replace("init engine (profile, create kv cache, warmup model) took", "init engine took")
    assert VLLM.startup_parts(short, healthy_after_s=64.0)["engine_init_s"] == 38.12


def test_a_real_vllm_0_32_start_is_read_part_by_part() -> None:
    parts = VLLM.startup_parts(REAL, healthy_after_s=75.0)
    # Stamps: first line 08:14:58, engine core 08:15:43, model load 08:16:05, init engine 08:16:07, server 08:16:08.
    assert parts["api_server_s"] == 45.0
    # "non-default args" at 08:14:58 to "Resolved architecture" at 08:15:23: the config read and the registry's
    # inspection of the model class, in a subprocess of its own when VLLM_CACHE_ROOT holds no record of it.
    assert parts["model_inspect_s"] == 25.0
    assert parts["engine_core_s"] == 22.0
    assert parts["model_load_s"] == 0.0  # dummy weights: "Initializing model took 0.179622 seconds"
    assert parts["weights_s"] == 0.179622
    assert parts["engine_init_s"] == 0.2  # "init engine (profile, create kv cache, warmup model) took 0.20 s"
    assert parts["compile_s"] is None  # eager
    assert parts["api_ready_s"] == 1.0
    assert parts["before_first_line_s"] == 5.0  # 75 s to health, 70 s of log
