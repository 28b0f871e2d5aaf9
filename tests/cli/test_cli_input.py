"""Bad input to the CLI gets a typed error (exit code, the file or flag named), never a traceback, never a
silent acceptance: the cases a first-contact session found, one test each."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from builders.cli import build_parser, innermost_parser, main
from builders.errors import SourceUnavailable

ROOT = Path(__file__).resolve().parents[2]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """main(argv)'s exit code (argparse's SystemExit included) and stderr."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.fixture
def root_copy(tmp_path: Path) -> Path:
    """The project's data and templates, writable: files broken on purpose live here."""
    for sub in ("distros", "recipes", "containers", "profiles", "schemas"):
        shutil.copytree(ROOT / sub, tmp_path / "root" / sub)
    return tmp_path / "root"


@pytest.mark.parametrize(
    "argv",
    [
        ["render", "debian-12", "router", "-o"],
        ["schema", "-o"],
        ["deploy", "render", "--image", "x:1", "-o"],
    ],
    ids=["render", "schema", "deploy-render"],
)
def test_output_folder_that_is_a_file_is_a_usage_error(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    existing = tmp_path / "taken"
    existing.write_text("mine\n")
    code, err = run(["--root", str(ROOT), *argv, str(existing)], capsys)
    assert code == 2 and f"-o {existing}: exists and is not a folder" in err
    assert existing.read_text() == "mine\n"


def test_ci_output_under_a_file_or_a_folder_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    existing = tmp_path / "taken"
    existing.write_text("mine\n")
    code, err = run(["--root", str(ROOT), "ci", "-o", str(existing / "ci.yml")], capsys)
    assert code == 2 and str(existing) in err and "not a folder" in err
    code, err = run(["--root", str(ROOT), "ci", "-o", str(tmp_path)], capsys)
    assert code == 2 and "is a folder, not a file" in err


@pytest.mark.parametrize("command", [["render", "debian-12", "router"], ["schema"], ["ci"]])
def test_unwritable_output_is_a_usage_error(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # /proc takes no new files, not even root's.
    target = "/proc/forge-out/ci.yml" if command == ["ci"] else "/proc/forge-out"
    code, err = run(["--root", str(ROOT), *command, "-o", target], capsys)
    assert code == 2 and "/proc/forge-out" in err and "usage error" in err


def test_a_distro_file_that_is_not_utf8_is_named(root_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = root_copy / "distros" / "debian-12.yaml"
    bad.write_bytes(bad.read_bytes().replace(b"debian", b"d\xe9bian", 1))
    code, err = run(["--root", str(root_copy), "list"], capsys)
    assert code == 2 and str(bad) in err and "not UTF-8" in err and "0xe9" in err


def test_a_key_given_twice_is_refused_naming_file_line_and_key(
    root_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fedora = root_copy / "distros" / "fedora-44.yaml"
    text = fedora.read_text()
    fedora.write_text(text + "family: debian\n")
    code, err = run(["--root", str(root_copy), "render", "fedora-44", "cpu", "-o", str(root_copy / "out")], capsys)
    assert code == 2
    assert str(fedora) in err and "'family' is given twice" in err and f"line {len(text.splitlines()) + 1}" in err
    assert not (root_copy / "out" / "fedora-44-cpu.Containerfile").exists()


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--max-jobs", "-3", "must be 1 or more"),
        ("--max-jobs", "0", "must be 1 or more"),
        ("--max-jobs", "two", "not a whole number"),
        ("--torch-version", "2.9; echo pwned", "not a PEP 440 version"),
        ("--torch-version", "$(id)", "not a PEP 440 version"),
        ("--cuda-arch-list", "9.0; id", "not a compute capability"),
    ],
)
def test_values_that_would_reach_a_containerfile_are_parsed_first(
    flag: str, value: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in (["render", "debian-12", "cpu", "-o", str(tmp_path)], ["plan", "debian-12", "cpu"]):
        code, err = run([*command, f"{flag}={value}"], capsys)
        assert code == 2 and flag in err and says in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["-5", "253402300800", "yesterday"])
@pytest.mark.parametrize("command", [["bootstrap", "debian-12"], ["sbom", "forge/x:1"]])
def test_a_source_date_epoch_outside_1970_to_9999_is_refused_before_any_engine(
    command: list[str], value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A negative epoch was accepted and would have been written into a base's files.
    code, err = run([*command, "--source-date-epoch", value], capsys)
    assert code == 2 and "--source-date-epoch" in err and repr(value) in err, err
    assert build_parser().parse_args([*command, "--source-date-epoch", "0"]).source_date_epoch == 0


def test_build_tag_and_source_names_match_their_patterns(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["build", "debian-12", "router", "--tag", "forge/x:1; rm -rf /"], capsys)
    assert code == 2 and "not an image reference" in err
    parsed = build_parser().parse_args(["build", "debian-12", "router", "--tag", "registry.local:5000/forge/x:dev"])
    assert parsed.tag == "registry.local:5000/forge/x:dev"
    code, err = run(["--root", str(ROOT), "plan", "debian-12", "cpu", "--torch-version", "2.9"], capsys)
    assert code == 0


def test_the_torch_version_is_normalised_before_it_is_rendered(capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run(["--root", str(ROOT), "plan", "debian-12", "cpu", "--torch-version", " 2.9.1+CPU "], capsys)
    assert code == 0
    assert build_parser().parse_args(["plan", "d", "t", "--torch-version", " 2.9.1+CPU "]).torch_version == "2.9.1+cpu"


def test_render_without_the_sdist_refuses_naming_it_and_never_writes_a_placeholder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FORGE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    code, err = run(["--root", str(ROOT), "render", "debian-12", "cpu", "-o", str(out), "--no-fetch"], capsys)
    assert code == SourceUnavailable.exit_code
    assert "vllm-0.33.0.tar.gz: not in the source cache" in err and "forge fetch debian-12 cpu vllm" in err
    assert list(out.iterdir()) == []

    # Offline without --no-fetch: the fetch's own refusal, and still no file.
    def offline(*_: object, **__: object) -> object:
        raise SourceUnavailable("could not download vllm-0.33.0.tar.gz: offline")

    monkeypatch.setattr("builders.sources.fetch_sdist", offline)
    code, err = run(["--root", str(ROOT), "render", "debian-12", "cpu", "-o", str(out)], capsys)
    assert code == SourceUnavailable.exit_code and "offline" in err
    assert list(out.iterdir()) == []

    # With the version given, nothing needs reading: the file names that torch.
    code, _ = run(
        ["--root", str(ROOT), "render", "debian-12", "cpu", "-o", str(out), "--torch-version", "2.9.1"], capsys
    )
    assert code == 0 and "torch==2.9.1+cpu" in (out / "debian-12-cpu.Containerfile").read_text()


def test_abbreviations_are_not_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["list", "--js"], capsys)
    assert code == 2 and "unrecognized arguments: --js" in err
    code, err = run(["render", "--max-job", "2"], capsys)
    assert code == 2 and "--max-job" in err


def test_an_unknown_flag_gets_the_subcommands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["deploy", "render", "--bogus"], capsys)
    assert code == 2 and err.startswith("usage: forge deploy render") and "forge deploy render: error" in err
    parser = build_parser()
    assert innermost_parser(parser, ["--root", "x", "schema", "--nope"]).prog == "forge schema"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("forge ") and out.split()[1][0].isdigit()


def _all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _all_parsers(sub)
    return found


def test_every_option_and_argument_says_what_it_is() -> None:
    missing = [
        f"{p.prog} {a.option_strings or a.dest}"
        for p in _all_parsers(build_parser())
        for a in p._actions
        if not a.help and not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
    ]
    assert missing == []
