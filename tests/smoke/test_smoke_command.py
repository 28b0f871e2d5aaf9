"""`forge smoke` (and `forge sweep`, which starts the same stacks) refuses bad invocations with a usage error before touching an engine or a vLLM."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders.cli import main


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("command", ["smoke", "sweep"])
def test_an_image_or_a_local_vllm_is_required(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run([command], capsys)
    assert code == 2
    assert "give an IMAGE to test, or --local-vllm PATH" in err


@pytest.mark.parametrize("command", ["smoke", "sweep"])
def test_image_and_local_vllm_exclude_each_other(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run([command, "some/image:tag", "--local-vllm", "/usr/bin/true"], capsys)
    assert code == 2
    assert "not both" in err


def test_an_unknown_profile_suggests_the_shipped_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["smoke", "--local-vllm", "/usr/bin/true", "--profile", "spilt"], capsys)
    assert code == 2
    assert "did you mean 'split'?" in err


def test_a_local_vllm_that_is_not_executable_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "bin" / "vllm"
    code, err = run(["smoke", "--local-vllm", str(missing), "--profile", "ci", "--validate-only"], capsys)
    assert code == 2
    assert f"--local-vllm {missing}: not an executable file" in err


def test_a_base_port_out_of_range_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["smoke", "--local-vllm", "/usr/bin/true", "--base-port", "80"], capsys)
    assert code == 2
    assert "--base-port 80" in err


def test_a_llama_server_that_is_not_executable_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = run(
        ["smoke", "--profile", "ci-llama", "--local-llama-server", str(tmp_path / "none"), "--validate-only"], capsys
    )
    assert code == 2
    assert f"--local-llama-server {tmp_path / 'none'}: not an executable file" in err


def test_llama_pools_without_a_llama_server_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["smoke", "some/image:tag", "--profile", "ci-llama", "--validate-only"], capsys)
    assert code == 2
    assert "the profile has llama.cpp pools, and no image or host binary was given for them" in err
    assert "--llama-image IMAGE or --local-llama-server PATH" in err
