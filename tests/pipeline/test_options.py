"""Build options come from one table (builders/options.py): the flags, their choices and the option objects."""

from __future__ import annotations

import argparse
import contextlib
import io
from dataclasses import fields
from pathlib import Path
from typing import get_args

import pytest

from builders.cli import build_parser
from builders.config.models import CudaBuild, TorchChoice
from builders.container.base import BuilderChoice
from builders.container.select import chosen
from builders.options import BuildOptions, cli_options, plan_options
from builders.plan import PlanOptions
from builders.smoke.runtimes import Runtimes

# What the planner learns from the build rather than from the options: the builder's secret support, whether
# a CA bundle was found, the versions and digest read from the sources and the base, and whether the vLLM
# source is a tree (a folder, split into layers) rather than an sdist.
RESOLVED_BY_THE_BUILD = {"buildkit", "trust_ca_bundle", "vllm_version", "base_digest", "source_tree"}


def _help(command: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    return out.getvalue()


def _subparser(command: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = sub.choices[command]
    return parser


def test_every_option_in_the_table_is_a_build_flag_and_the_plan_ones_render_and_plan_flags() -> None:
    table = list(cli_options())
    assert len(table) == 21 and {o.flag.scope for o in table} == {"plan", "build"}
    build_help = _help("build")
    for option in table:
        assert option.name in build_help, option.name
        if option.flag.help:
            assert " ".join(option.flag.help.split()[:3]) in " ".join(build_help.split()), option.name
    for command in ("render", "plan"):
        text = _help(command)
        assert all(o.name in text for o in cli_options("plan"))
        assert not any(o.name in text for o in cli_options("build"))


def test_choices_are_the_models_literals() -> None:
    actions = {a.option_strings[-1]: a for a in _subparser("build")._actions if a.option_strings}
    assert tuple(actions["--torch-index"].choices or ()) == get_args(TorchChoice.model_fields["index"].annotation)
    assert tuple(actions["--gpu-mode"].choices or ()) == get_args(CudaBuild.model_fields["mode"].annotation)
    assert (
        tuple(actions["--builder"].choices or ())
        == get_args(BuilderChoice)
        == ("auto", "buildkit", "legacy", "buildah")
    )
    preflight = {a.option_strings[-1]: a for a in _subparser("preflight")._actions if a.option_strings}
    assert tuple(preflight["--torch-index"].choices or ()) == get_args(TorchChoice.model_fields["index"].annotation)


def test_the_command_line_becomes_build_options(tmp_path: Path) -> None:
    line = "build debian-12 cpu --max-jobs 3 --builder legacy --torch-index pypi --no-cmake-from-pip --skip-tests"
    line += f" --locked --ca-bundle none --tag x:1 --source vllm={tmp_path} --source onednn=rel/dir"
    args = build_parser().parse_args([*line.split(), "--report-dir", str(tmp_path / "r")])
    options = BuildOptions.from_args(args)
    assert options == BuildOptions(
        max_jobs=3,
        builder="legacy",
        torch_index="pypi",
        cmake_from_pip=False,
        skip_tests=True,
        locked=True,
        ca_bundle="none",
        tag="x:1",
        source_overrides={"vllm": tmp_path, "onednn": Path("rel/dir").resolve()},
        reports_dir=tmp_path / "r",
    )
    # Nothing given: every field keeps the default the table declares.
    assert BuildOptions.from_args(build_parser().parse_args(["build", "debian-12", "cpu"])) == BuildOptions()
    # render takes only the plan's flags; the build's keep their defaults.
    rendered = BuildOptions.from_args(build_parser().parse_args(["render", "--gpu-mode", "wheel"]))
    assert rendered == BuildOptions(gpu_mode="wheel")


def test_a_bad_cuda_arch_list_is_refused_while_parsing(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["plan", "fedora-44", "gpu", "--cuda-arch-list", "9.0 hopper"])
    assert "not a compute capability: hopper" in capsys.readouterr().err


def test_plan_options_are_derived_not_copied() -> None:
    build_fields = {f.name for f in fields(BuildOptions)}
    for f in fields(PlanOptions):
        assert f.name in build_fields or f.name in RESOLVED_BY_THE_BUILD, f"PlanOptions.{f.name} comes from nowhere"
    options = BuildOptions(
        torch_version="2.14.0",
        torch_index="pypi",
        cmake_from_pip=True,
        tag="t:1",
        gpu_mode="source",
        cuda_arch_list="9.0",
        source_date_epoch=1700000000,
    )
    assert plan_options(options, 4) == PlanOptions(
        max_jobs=4,
        torch_version="2.14.0",
        torch_index="pypi",
        cmake_from_pip=True,
        tag="t:1",
        gpu_mode="source",
        cuda_arch_list="9.0",
        source_date_epoch=1700000000,
    )


def test_verify_repro_takes_the_build_flags_it_passes_on_from_the_same_table(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["verify-repro", "debian-12", "router", "--builder", "legacy", "--report-dir", "rel", "--keep-images"]
    )
    assert BuildOptions.from_args(args) == BuildOptions(builder="legacy", reports_dir=Path("rel").resolve())
    text = _help("verify-repro")
    assert "default: reports/DISTRO-TARGET/repro" in text and "--tag" not in text and "--skip-tests" not in text


def test_the_engine_is_chosen_once_and_carried_down(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGE_ENGINE", "podman")
    # --engine wins over FORGE_ENGINE, and the options carry it to the build's one connect.
    given = build_parser().parse_args(["build", "debian-12", "cpu", "--engine", "docker"])
    assert BuildOptions.from_args(given).engine == "docker"
    assert Runtimes.choose(
        images={"vllm": "forge/x:1"}, local={}, router_image=None, engine="docker"
    ).engine_choice == ("docker")
    # Without the flag the options carry no choice: FORGE_ENGINE is read when the build connects an engine
    # (select.chosen), so a command that connects none never reads it (issue 50).
    assert BuildOptions.from_args(build_parser().parse_args(["build", "debian-12", "cpu"])).engine is None
    assert chosen(BuildOptions().engine) == "podman"
    assert Runtimes.choose(images={"vllm": "forge/x:1"}, local={}, router_image=None).engine_choice == "podman"
    monkeypatch.delenv("FORGE_ENGINE")
    assert chosen(BuildOptions().engine) == "auto"
