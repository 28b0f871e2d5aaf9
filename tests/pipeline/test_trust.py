from __future__ import annotations

from pathlib import Path

import pytest

from builders.errors import UsageError
from builders.trust import find_ca_bundle


def test_explicit_wins(tmp_path: Path) -> None:
    pem = tmp_path / "ca.pem"
    pem.write_text("x")
    assert find_ca_bundle(str(pem), environ={"PIP_CERT": "/nope"}) == (pem, "--ca-bundle")


def test_host_variables_in_order(tmp_path: Path) -> None:
    a, b = tmp_path / "a.pem", tmp_path / "b.pem"
    a.write_text("a")
    b.write_text("b")
    assert find_ca_bundle(None, environ={"SSL_CERT_FILE": str(b), "PIP_CERT": str(a)}) == (a, "$PIP_CERT")
    assert find_ca_bundle(None, environ={"PIP_CERT": str(tmp_path / "missing"), "SSL_CERT_FILE": str(b)}) == (
        b,
        "$SSL_CERT_FILE",
    )


def test_none_and_missing() -> None:
    assert find_ca_bundle("none", environ={})[0] is None
    assert find_ca_bundle(None, environ={})[0] is None
    with pytest.raises(UsageError, match="no such file"):
        find_ca_bundle("/does/not/exist", environ={})
