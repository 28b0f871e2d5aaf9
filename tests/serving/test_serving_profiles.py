"""A pool names its serving engine: each engine's knobs, command line and model, and the errors for mixing them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from builders.engines import serving_engine
from builders.errors import ConfigError
from builders.router.classes import ALL_CLASSES
from builders.smoke.plan import plan_stack
from builders.smoke.profile import load_profile, profile_from_mapping

ROOT = Path(__file__).resolve().parents[2]


def profile(pools: dict[str, Any], **extra: Any) -> dict[str, Any]:
    first = next(iter(pools))
    return {"pools": pools, "classes": {c.value: first for c in ALL_CLASSES}, **extra}


def load(data: dict[str, Any]) -> Any:
    return profile_from_mapping(data, source="p.yaml", name="p")


def test_a_pool_runs_vllm_unless_it_says_otherwise() -> None:
    loaded = load(profile({"a": {"max_num_seqs": 4}}))
    assert loaded.pools["a"].engine == "vllm"
    plan = plan_stack(loaded, run_id="t", base_port=25500)
    assert plan.replicas[0].engine == "vllm"
    assert "--max-num-seqs" in plan.replicas[0].args


@pytest.mark.parametrize(
    ("pool", "field", "owner"),
    [
        ({"engine": "llama-cpp", "max_num_seqs": 4}, "max_num_seqs", "vLLM"),
        ({"engine": "llama-cpp", "enable_prefix_caching": True}, "enable_prefix_caching", "vLLM"),
        ({"llama_cpp": {"slots": 2}}, "llama_cpp", "llama.cpp"),
        ({"sglang": {"max_running_requests": 4}}, "sglang", "SGLang"),
        ({"engine": "sglang", "max_num_seqs": 4}, "max_num_seqs", "vLLM"),
    ],
)
def test_a_pool_refuses_the_other_engines_knobs_naming_the_field(pool: dict[str, Any], field: str, owner: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(profile({"a": pool}))
    assert f"pools.a.{field}: a {owner} setting" in err.value.message
    assert "p.yaml" in err.value.message


def test_an_unknown_engine_and_an_unknown_llama_knob_are_named() -> None:
    with pytest.raises(ConfigError) as err:
        load(profile({"a": {"engine": "tgi"}}))
    assert "pools.a.engine" in err.value.message and "llama-cpp" in err.value.message
    assert "sglang" in err.value.message
    with pytest.raises(ConfigError) as err:
        load(profile({"a": {"engine": "llama-cpp", "llama_cpp": {"sltos": 2}}}))
    assert "pools.a.llama_cpp.sltos: unknown key (did you mean 'slots'?)" in err.value.message


def test_a_context_too_small_for_its_slots_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        load(profile({"a": {"engine": "llama-cpp", "max_model_len": 1024, "llama_cpp": {"slots": 4, "context": 2048}}}))
    assert "pools.a.llama_cpp.context: 2048 tokens over 4 slot(s) leave 512 per request" in err.value.message


def test_llama_knobs_become_llama_server_flags_with_their_keys() -> None:
    loaded = load(
        profile(
            {
                "a": {
                    "engine": "llama-cpp",
                    "max_model_len": 512,
                    "replicas": 2,
                    "cpus": ["0-1", "2"],
                    "llama_cpp": {"slots": 3, "batch": 256, "ubatch": 64},
                    "extra_args": ["--cache-reuse", "16"],
                }
            }
        )
    )
    plan = plan_stack(loaded, run_id="t", base_port=25500)
    first, second = plan.replicas
    args = dict(zip(first.args[::2], first.args[1::2], strict=False))
    flags = list(first.args)
    # The per-slot context is the pool's max_model_len: -c is the total over slots.
    assert flags[flags.index("--ctx-size") + 1] == "1536"
    assert flags[flags.index("--parallel") + 1] == "3"
    assert flags[flags.index("--threads") + 1] == "2"
    assert flags[flags.index("--cpu-range") + 1] == "0-1"
    assert args["--host"] == "127.0.0.1"
    assert flags[-2:] == ["--cache-reuse", "16"]
    assert first.keys[flags.index("--ubatch-size")] == "pools.a.llama_cpp.ubatch"
    assert first.keys[flags.index("--ctx-size")] == "pools.a.max_model_len"
    # The second replica has its own core: one thread, pinned there.
    second_flags = list(second.args)
    assert second_flags[second_flags.index("--threads") + 1] == "1"
    assert second_flags[second_flags.index("--cpu-range") + 1] == "2-2"
    # ggml's threads are set by flags; nothing of vLLM's OpenMP binding leaks into its environment.
    assert not any(k.startswith("VLLM_") for k in first.env)


def test_a_mixed_profile_groups_pools_by_engine_and_image() -> None:
    loaded = load(
        {
            "pools": {
                "fast": {"engine": "llama-cpp"},
                "bulk": {"max_num_seqs": 8},
                "pinned": {"engine": "llama-cpp", "image": "forge/other:1"},
            },
            "classes": {
                "interactive": "fast",
                "rag": "fast",
                "agent": "fast",
                "long_prefill": "bulk",
                "batch": "bulk",
                "slow_stream": "pinned",
            },
        }
    )
    plan = plan_stack(loaded, run_id="t", base_port=25500)
    groups = [(g.engine, g.image, g.pools) for g in plan.runtime_groups()]
    assert groups == [
        ("llama-cpp", None, ("fast",)),
        ("vllm", None, ("bulk",)),
        ("llama-cpp", "forge/other:1", ("pinned",)),
    ]
    assert [p.pool for p in plan.pool_argvs(pools=("bulk",))] == ["bulk"]


def test_each_engine_names_its_key_env_and_model_file() -> None:
    vllm, llama = serving_engine("vllm"), serving_engine("llama-cpp")
    assert vllm.api_key_env("k") == {"VLLM_API_KEY": "k"}
    assert llama.api_key_env("k") == {"LLAMA_API_KEY": "k"}
    assert vllm.model_argument("/m") == "/m"
    assert llama.model_argument("/m") == "/m/model.gguf"
    assert llama.busy("llamacpp:requests_processing 1\n") and not llama.busy("llamacpp:requests_processing 0\n")
    assert not vllm.busy("llamacpp:requests_processing 1\n")


def test_the_llama_model_is_the_gguf_the_server_loads(tmp_path: Path) -> None:
    loaded, _ = load_profile("ci-llama", root=ROOT)
    serving_engine("llama-cpp").write_model(tmp_path, loaded, dtype="float32")
    written = tmp_path / "model.gguf"
    assert written.read_bytes()[:4] == b"GGUF"


def test_the_shipped_llama_profile_validates() -> None:
    loaded, _ = load_profile("ci-llama", root=ROOT)
    assert {p.engine for p in loaded.pools.values()} == {"llama-cpp"}


def test_deploy_refuses_a_llama_pool_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from builders.cli import main

    code = main(["deploy", "render", "--profile", "ci-llama", "--image", "x:1", "-o", str(tmp_path / "out")])
    assert code == 2
    assert "pools.interactive: forge deploy renders vLLM pools only" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


HELP = Path(__file__).parent / "fixtures" / "llama-server-help.txt"


def test_llama_server_help_parses_into_its_flags() -> None:
    from builders.engines.llama_cpp.serve import parse_server_help

    spec = parse_server_help(HELP.read_text(encoding="utf-8"), source="fixture")
    for flag in ("--parallel", "-np", "--ctx-size", "-c", "--batch-size", "-ub", "--threads", "--cpu-range"):
        assert spec.lookup(flag) is not None, flag
    assert spec.lookup("--parallel") is spec.lookup("-np")
    assert spec.options["--metrics"].takes_value is False
    assert spec.options["--threads"].takes_value is True
    assert "--help" not in spec.options


def test_the_shipped_llama_profile_is_accepted_by_that_llama_server_and_a_typo_is_not() -> None:
    from builders.engines.args import PoolArgv
    from builders.engines.llama_cpp.serve import parse_server_help
    from builders.engines.serving import ServerProbe

    probe = ServerProbe(spec=parse_server_help(HELP.read_text(encoding="utf-8"), source="fixture"), entry=("x",))
    loaded, _ = load_profile("ci-llama", root=ROOT)
    plan = plan_stack(loaded, run_id="t", base_port=25500)
    llama = serving_engine("llama-cpp")
    assert llama.check(plan.pool_argvs(), probe) == []
    bad = llama.check([PoolArgv(pool="a", argv=("--paralel", "2"), keys=("pools.a.extra_args[0]",) * 2)], probe)
    assert [p.render() for p in bad] == [
        "pool 'a', pools.a.extra_args[0]: --paralel: not an option of this llama-server (fixture) "
        "(did you mean --parallel or --poll?)"
    ]
