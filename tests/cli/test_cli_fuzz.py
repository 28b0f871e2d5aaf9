"""The CLI over generated input: argument vectors built from the real parser's subcommands and flags, with hostile
values, on a crafted project root whose distro file holds hostile YAML or hostile values. Whatever comes in, Forge
exits with a code from the documented table (docs/commands.md), prints no traceback and no secret it was given,
refuses what is bad (a value with a line break or an invisible character), ends in bounded time, and writes
nowhere but where it was asked to.

Nothing reaches the network or an engine: DOCKER_HOST names no socket, the engine choice is docker (so Podman is
not tried instead), every HTTP request goes through a proxy on a closed port, and the source cache is empty, so a
command that would fetch or connect is refused the way a machine without them refuses it.
"""

from __future__ import annotations

import argparse
import itertools
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from builders.cli import build_parser, main
from builders.config.types import unseen_character

ROOT = Path(__file__).resolve().parents[2]
EXIT_TABLE = ROOT / "docs" / "commands.md"
SECRET = "Fuzz5ecretValue"
SECONDS_PER_RUN = 20.0


def documented_exit_codes() -> set[int]:
    """The codes of the exit-code table: `| 3 / 9 | …` rows give 3 and 9."""
    text = EXIT_TABLE.read_text(encoding="utf-8")
    table = text[text.index("| code | meaning |") :].split("\n\n", 1)[0]
    codes = {int(c) for row in re.findall(r"^\| ([\d /]+) \|", table, re.M) for c in row.split("/")}
    assert {0, 1, 2, 4} <= codes
    return codes


CODES = documented_exit_codes()
TAKEN = "a file, not a folder\n"

# Commands whose work is long whatever their input (a sweep, a KV-lab measurement or its kernels under Triton's
# interpreter, a base bootstrap, two builds):
# left to their own tests, so that each run here ends in seconds.
LONG = {"sweep", "kvlab rank", "kvlab check", "kvlab kernels", "bootstrap", "verify-repro"}
# Flags whose value is a secret: given the secret, or a hostile value.
SECRET_VALUES = {
    "--api-key": [SECRET, f"{SECRET} x", f"{SECRET}\n"],
    "--endpoint": [f"http://admin:{SECRET}@127.0.0.1:9/", f"http://admin:{SECRET}@[::1", f"https://u:{SECRET}@h:99999"],
}

HOSTILE = [
    "",
    "-",
    "--",
    "-3",
    "0",
    "2147483648",
    "nan",
    "2.9; echo pwned",
    "$(touch /tmp/forge-fuzz-pwned)",
    "`id`",
    "../../../../etc/passwd",
    "debian-12\n",
    "x\rRUN id",
    "é\u202e",
    "a\u200bb",
    "tab\there",
    "x" * 300,
    "/dev/zero",
    "--root",
    "-o",
    "UPPER:Case",
    "http://[::1",
]
DISTROS = ["debian-12", "debian", "fedora-44", "nosuch"]
TARGETS = ["cpu", "router", "cpu-wheel", "gpu", "nosuch"]


def commands() -> dict[str, tuple[list[str], int]]:
    """Every leaf command of the real parser: its flags and how many positionals it takes (at least)."""
    found: dict[str, tuple[list[str], int]] = {}

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if subs:
            for name, sub in subs[0].choices.items():
                walk(sub, [*prefix, name])
            return
        flags = [a.option_strings[-1] for a in parser._actions if a.option_strings and "-h" not in a.option_strings]
        positional = [a for a in parser._actions if not a.option_strings and a.nargs not in ("?", "*")]
        found[" ".join(prefix)] = (flags, len(positional))

    walk(build_parser(), [])
    return {name: value for name, value in found.items() if name not in LONG}


COMMANDS = commands()
YAML_ATTACKS = [
    b"family: debian\nfamily: fedora\n",
    b"\xff\xfe\x00garbage",
    b"",
    b"!!python/object/apply:os.system ['touch /tmp/forge-fuzz-pwned']\n",
    b"a: &x [*x]\n",
    b"- just\n- a list\n",
    b"name: [unclosed\n",
]


def test_the_commands_come_from_the_parser() -> None:
    # The real subcommands, not a list of their own: a command added later is fuzzed without an edit here.
    assert {"list", "render", "plan", "diagnose", "deploy render", "smoke", "fetch", "build", "ci"} <= set(COMMANDS)
    assert "--tensor-parallel-size" not in COMMANDS["smoke"][0] and "--endpoint" in COMMANDS["smoke"][0]


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


def _value(draw: st.DrawFn, flag: str | None, sandbox: Path) -> str:
    if flag in SECRET_VALUES:
        return draw(st.sampled_from(SECRET_VALUES[flag]))
    return draw(
        st.one_of(
            st.sampled_from(HOSTILE + DISTROS + TARGETS),
            st.sampled_from([str(sandbox / "out"), str(sandbox / "taken"), "/proc/forge-fuzz", str(sandbox / "log")]),
            st.text(max_size=12),
        )
    )


@st.composite
def argvs(draw: st.DrawFn, sandbox: Path) -> list[str]:
    name = draw(st.sampled_from(sorted(COMMANDS)))
    flags, positionals = COMMANDS[name]
    argv = name.split()
    if name == "diagnose":
        argv.append(str(sandbox / "log"))
    elif positionals:
        argv += [draw(st.sampled_from(DISTROS))] + [draw(st.sampled_from(TARGETS)) for _ in range(positionals - 1)]
    # A flag with a value beside it, a flag alone, or a bare value: mostly well-formed, so most examples get
    # past argparse into the command itself.
    for _ in range(draw(st.integers(0, 3))):
        flag = draw(st.sampled_from(flags)) if flags else None
        kind = draw(st.sampled_from(["flag+value", "flag", "value"]))
        if flag is not None and kind != "value":
            argv.append(flag)
        if kind != "flag":
            argv.append(_value(draw, flag if kind == "flag+value" else None, sandbox))
    return argv


@st.composite
def distro_files(draw: st.DrawFn, pristine: bytes) -> bytes | None:
    """None (the sound file: half the examples, so the commands run further), a YAML attack, random bytes, or
    debian-12.yaml with one string field made hostile."""
    kind = draw(st.sampled_from(["sound", "sound", "attack", "bytes", "field"]))
    if kind == "sound":
        return None
    if kind == "attack":
        return draw(st.sampled_from(YAML_ATTACKS))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    data = yaml.safe_load(pristine)
    paths = [("tcmalloc_path",), ("base", "local_tag"), ("base", "image"), ("packages", "runtime", 0), ("release",)]
    path = draw(st.sampled_from(paths))
    node = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = draw(st.sampled_from(HOSTILE))
    return yaml.safe_dump(data, allow_unicode=True).encode()


def test_any_input_gets_a_documented_exit_code_and_no_traceback_or_secret(
    sandbox: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = sandbox / "root"
    distro_path = root / "distros" / "debian-12.yaml"
    pristine = distro_path.read_bytes()
    monkeypatch.chdir(sandbox)
    monkeypatch.setenv("FORGE_CACHE", str(sandbox / "cache"))
    monkeypatch.setenv("FORGE_ENGINE", "docker")
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/forge-fuzz.sock")
    monkeypatch.setenv("FORGE_API_KEY", SECRET)
    monkeypatch.setenv("FORGE_PYPI_SIMPLE", f"http://fuzz:{SECRET}@127.0.0.1:9/simple")
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(proxy, "http://127.0.0.1:9")
    for bypass in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(bypass, raising=False)
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "1")
    project_before = _files(root / "distros") | _files(root / "recipes") | _files(root / "containers")
    asked: set[str] = set()  # what each -o (--output) named, relative to the sandbox when not absolute
    seen: dict[int, int] = {}
    slowest: list[tuple[float, list[str]]] = [(0.0, [])]

    @settings(
        max_examples=200,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    # Beside the generated examples, one of each outcome past argparse, so the test never passes on usage
    # errors alone: a success, a refusal of the sdist, a broken distro file, a hostile log, a secret URL.
    @example(case=(["list"], None, b""))
    @example(case=(["render", "debian-12", "cpu", "-o", str(sandbox / "out")], None, b""))
    @example(case=(["render", "fedora-44", "router"], YAML_ATTACKS[0], b""))
    @example(case=(["diagnose", str(sandbox / "log")], None, b"\x00\xff" * 32))
    @example(case=(["smoke", "--endpoint", SECRET_VALUES["--endpoint"][0]], None, b""))
    @given(case=st.tuples(argvs(sandbox), distro_files(pristine), st.binary(max_size=64)))
    def one(case: tuple[list[str], bytes | None, bytes]) -> None:
        argv, distro_file, log = case
        distro_path.write_bytes(pristine if distro_file is None else distro_file)
        asked.update((Path(v).parts or ("",))[0] for f, v in itertools.pairwise(argv) if f in ("-o", "--output"))
        (sandbox / "log").write_bytes(log)
        start = time.monotonic()
        try:
            code = main(["--root", str(root), *argv])
        except SystemExit as exc:  # argparse: --help, usage errors
            code = exc.code if isinstance(exc.code, int) else 2
        seconds = time.monotonic() - start
        out, err = capsys.readouterr()
        seen[code] = seen.get(code, 0) + 1
        slowest[0] = max(slowest[0], (seconds, argv))
        assert code in CODES, (argv, code, err)
        assert "Traceback" not in err + out and "internal error" not in err, (argv, err)
        assert SECRET not in out + err, (argv, out, err)
        if code != 0:
            assert err.strip(), (argv, code)  # a failure always says why
        if any(unseen_character(token) for token in argv):
            assert code == 2, (argv, code, out, err)  # a line break or an invisible character is bad input
        assert seconds < SECONDS_PER_RUN, (argv, seconds)
        # `ci -o FILE` may overwrite the file it names; every other -o names a folder, never a file's place.
        taken = sandbox / "taken"
        if argv[0] != "ci":
            assert taken.is_file() and taken.read_text() == TAKEN, argv
        taken.write_text(TAKEN)

    one()
    distro_path.write_bytes(pristine)
    # The examples reached the commands, not only argparse: successes and Forge's own refusals both occur.
    assert seen.get(0, 0) >= 2 and seen.get(4, 0) >= 1 and seen.get(2, 0) >= 1, seen
    assert not Path("/tmp/forge-fuzz-pwned").exists()
    # Only the asked places changed: outputs under out/ or rendered/, schemas in the project copy (schema's
    # default), the sample log and the distro file this test rewrote.
    after = _files(root / "distros") | _files(root / "recipes") | _files(root / "containers")
    changed = {p for p, t in after.items() if project_before.get(p) != t} | (set(project_before) - set(after))
    assert changed <= {str(distro_path)}
    allowed = ("out", "rendered", "root", "log", "taken", "cache", "reports")
    assert {p.name for p in sandbox.iterdir()} <= set(allowed) | asked, list(sandbox.iterdir())
    print(f"exit codes seen: {dict(sorted(seen.items()))}; slowest run {slowest[0][0]:.1f} s: {slowest[0][1]}")
