"""`forge diagnose LOGFILE [--json]`, '-' for standard input, and errors that say what to do."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import pytest

from builders.diagnose import diagnose_file
from builders.diagnose.command import register
from builders.errors import ForgeError, UsageError

LOGS = Path(__file__).resolve().parents[1] / "logs"
OOM_LOG = LOGS / "oom-killed--cc1plus-killed-after-400-steps.log"


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="forge")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


def test_json_output_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["diagnose", str(OOM_LOG), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"category", "line_number", "line", "cause", "remedy", "confidence", "evidence"} <= set(data)
    assert data["category"] == "oom-killed"
    expected = json.loads((LOGS / (OOM_LOG.name + ".expect.json")).read_text(encoding="utf-8"))
    assert data["line_number"] == expected["line_number"]
    assert 0.0 <= data["confidence"] <= 1.0
    assert all(isinstance(n, int) for n in data["evidence"])


def test_human_output_is_a_few_readable_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["diagnose", str(OOM_LOG)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("diagnosis: oom-killed (confidence ")
    assert any(line.startswith("  line ") and "Killed signal terminated program cc1plus" in line for line in lines)
    assert any(line.startswith("  cause:") for line in lines)
    assert any(line.startswith("  remedy:") for line in lines)
    assert len(lines) <= 15
    assert max(len(line) for line in lines if not line.startswith("  line ")) <= 100


def test_dash_reads_standard_input(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    log = b"Step 3/3 : RUN pip install .\n ---> Running in 1f\nERROR: Package 'vllm' requires a different Python: 3.10.12 not in '>=3.11,<3.15'\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(log), encoding="utf-8"))
    assert _run(["diagnose", "-", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["category"], data["line_number"]) == ("python-unsupported", 3)


def test_missing_log_is_a_usage_error_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as caught:
        _run(["diagnose", str(tmp_path / "nope.log")])
    assert caught.value.exit_code == 2
    assert "nope.log" in caught.value.render()
    assert "what to do:" in caught.value.render()


def test_broken_rule_book_is_reported_not_a_traceback(tmp_path: Path) -> None:
    book = tmp_path / "rules.yaml"
    book.write_text("line_kinds: {}\nrules: []\n", encoding="utf-8")
    with pytest.raises(ForgeError) as caught:
        _run(["diagnose", str(OOM_LOG), "--rules", str(book)])
    assert str(book) in caught.value.render()


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"", "is empty"),
        (b"  \n\n", "is empty"),
        (b"\x1f\x8b\x08\x00" + bytes(64), "gzip archive"),
        (b"\x7fELF\x02\x01\x01" + bytes(64), "ELF binary"),
        (b"error: x\n\x00\x01\x02", "NUL bytes"),
    ],
)
def test_an_empty_or_binary_file_is_named_for_what_it_is_not_diagnosed_unknown(
    tmp_path: Path, data: bytes, said: str
) -> None:
    log = tmp_path / "build.log"
    log.write_bytes(data)
    with pytest.raises(UsageError) as caught:
        _run(["diagnose", str(log)])
    assert said in caught.value.message and str(log) in caught.value.message


def test_a_builds_own_empty_log_is_still_diagnosed_unknown(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    log.write_bytes(b"")
    assert diagnose_file(log).category == "unknown"
