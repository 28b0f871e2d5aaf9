"""No proof passes by skipping: the suite splitter fails a run whose engine-backed tests skipped, unless the
committed allow-list (tests/allowed_skips.toml) excuses the skip, and in CI only its `ci = true` entries do."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from skip_policy import ALLOWED_SKIPS, AllowListError, Skip, excuse, load_allowed, skips_in  # noqa: E402

ROOT = TESTS.parent
SPLITTER = TESTS / "run_split.py"

SYNTHETIC = """
import pytest
from helper import too_small

@pytest.mark.engine
def test_an_image_backed_proof():
    too_small()

def test_an_engine_free_test():
    assert True
"""
HELPER = 'import pytest\n\ndef too_small():\n    pytest.skip("forge/x does not fit on this machine: 9 GB free")\n'


def synthetic_suite(tmp_path: Path) -> Path:
    """A suite of one engine-backed test that skips from a helper, as smoke_helpers.build_image does, and one
    engine-free test that passes; its own pytest.ini, so nothing of Forge's conftest or settings reaches it."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    engine: engine\n    server: server\n    emulation: emulation\n"
    )
    (suite / "conftest.py").write_text("import sys, os\nsys.path.insert(0, os.path.dirname(__file__))\n")
    (suite / "helper.py").write_text(HELPER)
    (suite / "test_synthetic.py").write_text(SYNTHETIC)
    return suite


def split(suite: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("FORGE_CI", "FORGE_ALLOWED_SKIPS")}
    return subprocess.run(
        [sys.executable, str(SPLITTER), str(suite)],
        cwd=suite,
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def allow_list(path: Path, *, ci: bool) -> Path:
    path.write_text(
        '[[skip]]\nreason = "does not fit on this machine"\ntests = ["helper.py"]\n'
        f'why = "a small disk"\nwhere = "a laptop"\nci = {"true" if ci else "false"}\n'
    )
    return path


def test_the_splitter_fails_a_run_whose_engine_backed_test_skipped(tmp_path: Path) -> None:
    done = split(synthetic_suite(tmp_path))
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "1 skipped" in out and "1 passed" in out  # both halves ran and passed or skipped: only the policy fails
    assert "not excused: test_synthetic::test_an_image_backed_proof skipped (" in out
    assert "does not fit on this machine: 9 GB free" in out


def test_an_allow_listed_skip_passes_and_ci_takes_only_its_ci_entries(tmp_path: Path) -> None:
    suite = synthetic_suite(tmp_path)
    laptop_only = allow_list(tmp_path / "laptop.toml", ci=False)
    assert split(suite, FORGE_ALLOWED_SKIPS=str(laptop_only)).returncode == 0
    in_ci = split(suite, FORGE_ALLOWED_SKIPS=str(laptop_only), FORGE_CI="1")
    assert in_ci.returncode == 1 and "not excused" in in_ci.stdout
    everywhere = allow_list(tmp_path / "ci.toml", ci=True)
    assert split(suite, FORGE_ALLOWED_SKIPS=str(everywhere), FORGE_CI="1").returncode == 0


def test_a_broken_allow_list_stops_the_splitter_before_any_test(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text('[[skip]]\nreason = "x"\ntests = ["a.py"]\nwhy = "y"\nci = true\n')  # no `where`
    done = split(synthetic_suite(tmp_path), FORGE_ALLOWED_SKIPS=str(broken))
    assert done.returncode == 2
    assert f"{broken}: skip entry 1 needs exactly ci, reason, tests, where, why" in done.stdout
    assert "passed" not in done.stdout


def test_a_skip_raised_in_a_helper_is_located_in_the_helper(tmp_path: Path) -> None:
    suite = synthetic_suite(tmp_path)
    junit = tmp_path / "junit.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}", str(suite)],
        cwd=suite,
        capture_output=True,
        check=False,
        timeout=120,
    )
    (skip,) = skips_in(junit, root=suite)
    assert skip == Skip(
        test="test_synthetic::test_an_image_backed_proof",
        reason="forge/x does not fit on this machine: 9 GB free",
        raised_in="helper.py",
        kind="pytest.skip",
    )


def test_an_entry_excuses_its_reason_only_from_its_files() -> None:
    allowed = load_allowed()
    disk = "debian-12 cpu-wheel does not fit on this machine: 9.1 GB free"
    from_helper = Skip(test="t::t", reason=disk, raised_in="tests/smoke/smoke_helpers.py", kind="pytest.skip")
    elsewhere = Skip(test="t::t", reason=disk, raised_in="tests/smoke/test_podman_stack.py", kind="pytest.skip")
    assert excuse(from_helper, allowed, ci=False) is not None
    assert excuse(from_helper, allowed, ci=True) is None  # in CI a small disk is a failure
    assert excuse(elsewhere, allowed, ci=False) is None


def test_the_committed_allow_list_is_short_and_each_entry_names_a_real_skip() -> None:
    allowed = load_allowed(ALLOWED_SKIPS)
    assert len(allowed) <= 8, "the allow-list is for the few skips a real host may need; fix the others"
    for entry in allowed:
        assert len(entry.why) > 20 and len(entry.where) > 10
        for test in entry.tests:
            source = (ROOT / test).read_text()
            # The reason is still one that file gives: a skip text changed or gone leaves no stale excuse behind.
            reasons = re.findall(r'pytest\.skip\(\s*f?"([^"]+)"', source)
            assert any(entry.reason.search(r) for r in reasons), f"{test} gives no skip matching {entry.reason.pattern}"


def test_an_allow_list_entry_without_a_reason_for_it_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.toml"
    path.write_text('[[skip]]\nreason = "x"\ntests = []\nwhy = "y"\nwhere = "z"\nci = true\n')
    with pytest.raises(AllowListError, match="tests lists the files the skip may come from"):
        load_allowed(path)
