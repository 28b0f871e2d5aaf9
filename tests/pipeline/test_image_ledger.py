"""The test-image ledger of tests/conftest.py, run by a real pytest on test files made here: the users of one
session-built image run together, where its last user stood, so a small CI disk holds one big image at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[2]


def collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    conftest = (ROOT / "tests" / "conftest.py").read_text(encoding="utf-8")
    pinned = conftest.replace("ROOT = Path(__file__).resolve().parents[1]", f"ROOT = Path({str(ROOT)!r})")
    assert pinned != conftest, "tests/conftest.py no longer defines ROOT as this test expects"
    pytester.makeconftest(pinned)
    # Keys no session builds: the release hook finds nothing of theirs to remove.
    pytester.makepyfile(
        test_a="""
            import pytest
            @pytest.mark.image("ledger-test:big")
            def test_a1(): pass
            def test_a2(): pass
        """,
        test_b="""
            import pytest
            def test_b1(): pass
            @pytest.mark.image("ledger-test:big", "ledger-test:small")
            def test_b2(): pass
        """,
        test_c="""
            import pytest
            pytestmark = pytest.mark.image("ledger-test:small")
            def test_c1(): pass
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "--collect-only", *args)
    assert result.ret == 0, result.stdout.str()
    return [line.split("::")[1] for line in result.stdout.lines if "::" in line]


def test_users_of_an_image_run_together_at_its_last_users_place(pytester: pytest.Pytester) -> None:
    # big: a1 joins b2; small: b2 (now after a1) joins c1, carrying nothing else along.
    assert collected(pytester) == ["test_a2", "test_b1", "test_a1", "test_b2", "test_c1"]


def test_a_selection_keeps_its_own_order_when_no_image_is_shared(pytester: pytest.Pytester) -> None:
    assert collected(pytester, "-k", "a2 or b1 or c1") == ["test_a2", "test_b1", "test_c1"]
