"""The CLI over generated input: argument vectors of engine-free commands mixed with hostile values, and hostile
contents for the files those commands read. Whatever comes in, Forge exits with a code from the documented
table (docs/commands.md), prints no traceback, and writes nowhere but where it was asked to."""

from __future__ import annotations

import itertools
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from builders.cli import main
from builders.errors import SourceUnavailable

ROOT = Path(__file__).resolve().parents[2]
EXIT_TABLE = ROOT / "docs" / "commands.md"


def documented_exit_codes() -> set[int]:
    """The codes of the exit-code table: `| 3 / 9 | …` rows give 3 and 9."""
    text = EXIT_TABLE.read_text(encoding="utf-8")
    table = text[text.index("| code | meaning |") :].split("\n\n", 1)[0]
    codes = {int(c) for row in re.findall(r"^\| ([\d /]+) \|", table, re.M) for c in row.split("/")}
    assert {0, 1, 2, 4} <= codes
    return codes


CODES = documented_exit_codes()
TAKEN = "a file, not a folder\n"

HOSTILE = [
    "",
    "-",
    "--",
    "-3",
    "0",
    "2.9; echo pwned",
    "$(touch /tmp/forge-fuzz-pwned)",
    "`id`",
    "../../../../etc/passwd",
    "debian-12\n",
    "é\u202e",
    "x" * 300,
    "--root",
    "-o",
]
DISTROS = ["debian-12", "debian", "fedora-44", "nosuch"]
TARGETS = ["cpu", "router", "cpu-wheel", "gpu", "nosuch"]
COMMANDS: dict[str, list[str]] = {
    "list": ["--json"],
    "render": ["-o", "--max-jobs", "--torch-version", "--torch-index", "--builder", "--gpu-mode", "--no-fetch"],
    "plan": ["--max-jobs", "--torch-version", "--cuda-arch-list", "--cmake-from-pip", "--no-fetch"],
    "schema": ["-o", "--check"],
    "ci": ["-o", "--format", "--check", "--runs-on"],
    "diagnose": ["--json"],
    "deploy render": ["-o", "--image", "--profile", "--network"],
}
YAML_ATTACKS = [
    b"family: debian\nfamily: fedora\n",
    b"\xff\xfe\x00garbage",
    b"",
    b"!!python/object/apply:os.system ['touch /tmp/forge-fuzz-pwned']\n",
    b"a: &x [*x]\n",
    b"- just\n- a list\n",
    b"name: [unclosed\n",
]


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Path]:
    """A writable project copy and room for outputs; every example runs with this as its working folder."""
    with tempfile.TemporaryDirectory(prefix="forge-fuzz-") as tmp:
        base = Path(tmp)
        for sub in ("distros", "recipes", "containers", "profiles", "schemas"):
            shutil.copytree(ROOT / sub, base / "root" / sub)
        (base / "taken").write_text(TAKEN)
        yield base


def _files(folder: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in folder.rglob("*") if p.is_file()}


def _command(draw: st.DrawFn, sandbox: Path) -> list[str]:
    name = draw(st.sampled_from(sorted(COMMANDS)))
    values = st.one_of(
        st.sampled_from(HOSTILE + DISTROS + TARGETS),
        st.sampled_from([str(sandbox / "out"), str(sandbox / "taken"), "/proc/forge-fuzz", str(sandbox / "log")]),
        st.text(max_size=12),
    )
    # A flag with a value beside it, a flag alone, or a bare value: mostly well-formed, so most examples get
    # past argparse into the command itself.
    tokens = st.one_of(
        st.tuples(st.sampled_from(COMMANDS[name]), values).map(list),
        st.sampled_from(COMMANDS[name]).map(lambda f: [f]),
        values.map(lambda v: [v]),
    )
    argv = name.split()
    if name in ("render", "plan"):
        argv += draw(st.lists(st.sampled_from(DISTROS + TARGETS), min_size=2 if name == "plan" else 0, max_size=2))
    if name == "diagnose":
        argv.append(str(sandbox / "log"))
    return argv + [t for group in draw(st.lists(tokens, max_size=3)) for t in group]


@st.composite
def cases(draw: st.DrawFn, sandbox: Path) -> tuple[list[str], bytes | None, bytes]:
    argv = _command(draw, sandbox)
    distro_file = draw(st.one_of(st.none(), st.sampled_from(YAML_ATTACKS), st.binary(max_size=64)))
    if draw(st.booleans()):
        distro_file = None  # half the examples on a sound project, so the commands run further
    log = draw(st.one_of(st.sampled_from([b"", b"\x00\x01\x02\xff" * 8, b"error: oops\n"]), st.binary(max_size=64)))
    return argv, distro_file, log


def test_any_input_gets_a_documented_exit_code_and_no_traceback(
    sandbox: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = sandbox / "root"
    distro_path = root / "distros" / "debian-12.yaml"
    pristine = distro_path.read_bytes()
    monkeypatch.chdir(sandbox)
    monkeypatch.setenv("FORGE_CACHE", str(sandbox / "cache"))
    # No network: a render that needs vLLM's sdist gets the refusal a machine without PyPI gets.
    monkeypatch.setattr(
        "builders.sources.fetch_sdist", lambda *_a, **_k: (_ for _ in ()).throw(SourceUnavailable("offline"))
    )
    # No engine either: a command that would ask one is told none answers.
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/forge-fuzz.sock")
    project_before = _files(root / "distros") | _files(root / "recipes") | _files(root / "containers")
    asked: set[str] = set()  # what each -o named, relative to the sandbox when not absolute

    @settings(
        max_examples=60,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    # Beside the generated examples, one of each outcome past argparse, so the test never passes on usage
    # errors alone: a success, a refusal of the sdist, a broken distro file, a hostile log.
    @example(case=(["list"], None, b""))
    @example(case=(["render", "debian-12", "cpu", "-o", str(sandbox / "out")], None, b""))
    @example(case=(["render", "fedora-44", "router"], YAML_ATTACKS[0], b""))
    @example(case=(["diagnose", str(sandbox / "log")], None, b"\x00\xff" * 32))
    @given(case=cases(sandbox))
    def one(case: tuple[list[str], bytes | None, bytes]) -> None:
        argv, distro_file, log = case
        distro_path.write_bytes(pristine if distro_file is None else distro_file)
        asked.update((Path(v).parts or ("",))[0] for f, v in itertools.pairwise(argv) if f == "-o")
        (sandbox / "log").write_bytes(log)
        try:
            code = main(["--root", str(root), *argv])
        except SystemExit as exc:  # argparse: --help, usage errors
            code = exc.code if isinstance(exc.code, int) else 2
        out, err = capsys.readouterr()
        seen[code] = seen.get(code, 0) + 1
        assert code in CODES, (argv, code, err)
        assert "Traceback" not in err + out, argv
        if code not in (0,):
            assert err.strip(), (argv, code)  # a failure always says why
        # `ci -o FILE` may overwrite the file it names; every other -o names a folder, never a file's place.
        taken = sandbox / "taken"
        if argv[0] != "ci":
            assert taken.is_file() and taken.read_text() == TAKEN, argv
        taken.write_text(TAKEN)

    seen: dict[int, int] = {}
    one()
    distro_path.write_bytes(pristine)
    # The examples reached the commands, not only argparse: successes and Forge's own refusals both occur.
    assert seen.get(0, 0) >= 2 and seen.get(SourceUnavailable.exit_code, 0) >= 1 and seen.get(2, 0) >= 1, seen
    assert not Path("/tmp/forge-fuzz-pwned").exists()
    # Only the asked places changed: outputs under out/ or rendered/, schemas in the project copy (schema's
    # default), the sample log and the distro file this test rewrote.
    after = _files(root / "distros") | _files(root / "recipes") | _files(root / "containers")
    changed = {p for p, t in after.items() if project_before.get(p) != t} | (set(project_before) - set(after))
    assert changed <= {str(distro_path)}
    allowed = ("out", "rendered", "root", "log", "taken", "cache")
    assert {p.name for p in sandbox.iterdir()} <= set(allowed) | asked, list(sandbox.iterdir())
